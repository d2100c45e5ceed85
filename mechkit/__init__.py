"""mechkit: mechanistic interpretability for real HuggingFace causal LMs.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")            # or "llama", a directory, a .gguf file
>>> with mk.ablate(m, heads="0.1,1.3"):
...     logits = m(m.to_tokens("hello"))

Attributes load lazily, so ``import mechkit`` (and ``mechkit --help``) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError

__version__ = "0.1.0"

_LAZY = {
    "load_model": "mechkit.model.loading",
    "ModelHandle": "mechkit.model.handle",
    "Anatomy": "mechkit.model.anatomy",
    "hooks": "mechkit.hooking.core",
    "record": "mechkit.hooking.core",
    "run_with_cache": "mechkit.hooking.core",
    "gradients": "mechkit.hooking.core",
    "to_transformer_lens": "mechkit.model.transformer_lens",
    "adaptive": "mechkit.adapt.scheduler",
    "pattern_hooks": "mechkit.hooking.attention",
    "ablate": "mechkit.interventions.ablation",
    "edit_weights": "mechkit.interventions.weights",
    "Head": "mechkit.model.heads",
    "parse_heads": "mechkit.model.heads",
    "score_prompts": "mechkit.eval.scoring",
    "build_prompts": "mechkit.tasks",
    "list_tasks": "mechkit.tasks",
    "Plugin": "mechkit.plugin",
    "Option": "mechkit.plugin",
    "Result": "mechkit.plugin",
    "RunContext": "mechkit.plugin",
    "Table": "mechkit.report",
    "run_plugin": "mechkit.runner",
}

if TYPE_CHECKING:
    from mechkit.eval.scoring import score_prompts
    from mechkit.hooking.attention import pattern_hooks
    from mechkit.hooking.core import gradients, hooks, record, run_with_cache
    from mechkit.interventions.ablation import ablate
    from mechkit.interventions.weights import edit_weights
    from mechkit.model.anatomy import Anatomy
    from mechkit.model.handle import ModelHandle
    from mechkit.model.heads import Head, parse_heads
    from mechkit.model.loading import load_model
    from mechkit.model.transformer_lens import to_transformer_lens
    from mechkit.plugin import Option, Plugin, Result, RunContext
    from mechkit.report import Table
    from mechkit.runner import run_plugin
    from mechkit.tasks import build_prompts, list_tasks


def __getattr__(name: str):
    if name == "run":
        return importlib.import_module("mechkit.runner").run_plugin
    if name in ("interventions", "hooks_api"):
        return importlib.import_module("mechkit.interventions")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mechkit' has no attribute {name!r}")


__all__ = [
    "Anatomy",
    "Head",
    "MechkitError",
    "ModelHandle",
    "Option",
    "Plugin",
    "Result",
    "RunContext",
    "Table",
    "__version__",
    "ablate",
    "adaptive",
    "build_prompts",
    "edit_weights",
    "gradients",
    "hooks",
    "list_tasks",
    "load_model",
    "parse_heads",
    "pattern_hooks",
    "record",
    "run",
    "run_plugin",
    "run_with_cache",
    "score_prompts",
    "to_transformer_lens",
]
