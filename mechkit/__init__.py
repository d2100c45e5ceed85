"""mechkit: mechanistic interpretability for real HuggingFace causal LMs.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")            # or "llama", a directory, a .gguf file
>>> with mk.ablate(m, heads="0.1,1.3"):
...     logits = m(m.to_tokens("hello"))

Attributes load lazily, so ``import mechkit`` (and ``mechkit --help``) never imports torch.
"""

from __future__ import annotations

import importlib as _importlib

from mechkit.errors import MechkitError

__version__ = "0.1.0"

# The public API, listed once: each name and where it lives ("module" when the name is the same there,
# "module:name" when it is not). Nothing is imported until a name is first used.
_API = {
    "load_model": "mechkit.model.loading",
    "ModelHandle": "mechkit.model.handle",
    "Anatomy": "mechkit.model.anatomy",
    "Head": "mechkit.model.headspec",
    "parse_heads": "mechkit.model.headspec",
    "parse_spec": "mechkit.model.headspec",
    "HeadSelection": "mechkit.model.headspec",
    "to_transformer_lens": "mechkit.model.transformer_lens",
    "hooks": "mechkit.hooking.core",
    "record": "mechkit.hooking.core",
    "run_with_cache": "mechkit.hooking.core",
    "gradients": "mechkit.hooking.core",
    "enable_grad": "mechkit.model.backends.grad",  # forwards build a graph only inside it (the gradient promise)
    "pattern_hooks": "mechkit.hooking.attention",
    "ablate": "mechkit.interventions.ablation",
    "edit_weights": "mechkit.interventions.weights",
    "build_prompts": "mechkit.tasks",
    "list_tasks": "mechkit.tasks",
    "score_prompts": "mechkit.eval.scoring",
    "adaptive": "mechkit.adapt.scheduler",
    "Table": "mechkit.report",
    "show_attention": "mechkit.report.attention_view",  # where heads attend on a prompt: inline, or .save() a page
    "AttentionView": "mechkit.report.attention_view",
    "Plugin": "mechkit.plugin",
    "Option": "mechkit.plugin",
    "Result": "mechkit.plugin",
    "RunContext": "mechkit.plugin",
    "run": "mechkit.runner:run_plugin",  # run a plugin by name or class, as the CLI does
    "Run": "mechkit.runner",
    "load_report": "mechkit.runner:load_run",  # a written run read back as a Run (the dict: mechkit.report)
}
# Subpackages reachable as attributes before they are imported (``hooks_api``: an older name).
_SUBPACKAGES = {"interventions": "mechkit.interventions", "hooks_api": "mechkit.interventions"}


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return _importlib.import_module(_SUBPACKAGES[name])
    if name in _API:
        module, _, attr = _API[name].partition(":")
        return getattr(_importlib.import_module(module), attr or name)
    raise AttributeError(f"module 'mechkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


__all__ = ["MechkitError", "__version__", *_API]
