"""The code a model's forward runs, beyond the model object: its classes, its modeling module's functions,
the attention and mask registries transformers dispatches through, and torch's functions.

The state check (:mod:`mechkit.model.checks.state`) reads the model object; the probe's 16 tokens read what
it computes on short inputs. A plugin that replaces ``modeling_llama.apply_rotary_pos_emb``,
``LlamaMLP.forward`` (on the class), ``ALL_ATTENTION_FUNCTIONS["sdpa"]`` or
``torch.nn.functional.silu`` with a version that acts only past 16 tokens, or only on padded batches,
passed both while every later forward computed differently. Only references are compared (``is``), so the
check is exact, and names that appear during a run (a lazily imported function, mechkit's own registered
attention name) are no change. Reloading the model does not undo such a change: the process's code is
changed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Modules whose functions every family's forward calls (masks, attention kernels, activations) besides the
# modules that define the model's own classes.
LIBRARY_MODULES = ("torch", "torch.nn.functional", "transformers.masking_utils", "transformers.modeling_utils",
                   "transformers.integrations.sdpa_attention", "transformers.activations",
                   "transformers.pytorch_utils")


# Libraries that wrap a torch method once per process when first imported, keeping the original as
# ``__wrapped__`` (nnsight wraps ``Tensor.backward``): a plugin importing one is not a plugin editing torch.
WRAPPING_LIBRARIES = ("nnsight",)


def _settle() -> None:
    """Make now the edits torch makes once per process on first use: ``torch.compile`` replaces
    ``nn.Module.__init__``/``__setstate__`` (dynamo's generation tagging). A plugin compiling something was
    refused as having replaced them, and a fresh process (every CLI run) could not help."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except Exception:  # a torch without dynamo: nothing to settle
        return
    install_generation_tagging_init()  # once per process: it marks nn.Module as done


def _library_wrap(old: Any, new: Any) -> bool:
    """``new`` wraps ``old`` (``__wrapped__``) and its code lives in one of :data:`WRAPPING_LIBRARIES`."""
    code = getattr(new, "__code__", None)
    if code is None or getattr(new, "__wrapped__", None) is not old:
        return False
    for name in WRAPPING_LIBRARIES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where and Path(code.co_filename).is_relative_to(Path(where).parent):
            return True
    return False


def _classes(model: Any) -> set[type]:
    import torch

    classes = {torch.Tensor}
    for module in model.modules():
        classes.update(c for c in type(module).__mro__ if c is not object)
    return classes


def _callables(namespace: Mapping, where: str, out: dict, dunders: bool = True) -> None:
    for name, value in list(namespace.items()):
        if not dunders and str(name).startswith("__"):
            continue  # a module's __builtins__, __loader__…: not the model's code (Ray's driver replaces print)
        if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
            out[(where, str(name))] = value


def _resolved(cls: type) -> dict[str, Any]:
    """Every name of ``cls`` and its bases, as looked up on it (``inspect.getattr_static``: no descriptor
    runs). A method set on a subclass over its base's (``torch.Tensor.pow = f`` over ``TensorBase.pow``) is
    a new name in the subclass's own ``vars``, which a comparison of ``vars`` took for a name that appeared."""
    import inspect

    out = {}
    for name in dir(cls):
        try:
            out[name] = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
    return out


def code_state(model: Any) -> dict[tuple[str, str], Any]:
    """``{(where, name): object}`` for the code the model's forward can reach (see the module docstring);
    the objects are held, so that their ids stay theirs while compared."""
    _settle()
    refs: dict[tuple[str, str], Any] = {}
    classes = _classes(model)
    for cls in classes:  # what each name resolves to: torch.Tensor.pow set on Tensor shadows TensorBase's
        _callables(_resolved(cls), f"{cls.__module__}.{cls.__qualname__}", refs)
    for name in sorted({c.__module__ for c in classes} | set(LIBRARY_MODULES)):
        module = sys.modules.get(name)
        if module is None:
            continue
        namespace = vars(module)
        _callables(namespace, name, refs, dunders=False)
        for attr, value in list(namespace.items()):  # registries: ALL_ATTENTION_FUNCTIONS, ACT2FN
            if isinstance(value, Mapping) and not isinstance(value, type) and not str(attr).startswith("__"):
                try:
                    _callables(dict(value.items()), f"{name}.{attr}[...]", refs)
                except Exception:  # a mapping that cannot list itself: nothing to compare
                    continue
    return refs


def changed_code(before: dict, after: dict) -> str | None:
    """The first name whose object was replaced (or removed) during the run, in words, else None."""
    for key, value in before.items():
        if key not in after or (after[key] is not value and not _library_wrap(value, after[key])):
            where, name = key
            if where.endswith("[...]"):
                return f"{where[:-5]}[{name!r}] was replaced and not put back"
            return f"{where}.{name} was replaced and not put back"
    return None
