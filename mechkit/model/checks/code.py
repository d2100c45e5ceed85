"""The code a model's forward runs, beyond the model object: its classes, the modules its forward's Python
functions run in (found by tracing one short forward) and the classes they define, the attention and mask
registries transformers dispatches through, and torch's functions.

The state check (:mod:`mechkit.model.checks.state`) reads the model object; the probe's 16 tokens read what
it computes on short inputs. A plugin that replaces ``modeling_llama.apply_rotary_pos_emb``,
``LlamaMLP.forward`` (on the class), ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, ``DynamicLayer.update`` or
``torch.nn.functional.silu`` with a version that acts only past 16 tokens, or only on padded batches,
passed both while every later forward computed differently. A function is also read inside: its code,
defaults and attributes, the functions its closure cells hold and the one it wraps (``__wrapped__``), a few
levels deep, since ``LlamaMLP.forward.__code__ = other`` or a decorator's cell swapped changes what runs while
the function object stays the same. Only references are compared (``is``), so the check is exact, and names
that appear during a run (a lazily imported function, mechkit's own registered attention name) are no
change. Reloading the model does not undo such a change: the process's code is changed.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Mapping
from typing import Any

from mechkit.model.checks.rope import ropes_as_loaded

# Modules whose functions every family's forward calls (masks, caches, attention kernels, activations)
# besides the modules that define the model's own classes: checked even where the traced forward
# (:func:`_reached_modules`) cannot run.
LIBRARY_MODULES = ("torch", "torch.nn.functional", "transformers.masking_utils", "transformers.modeling_utils",
                   "transformers.integrations.sdpa_attention", "transformers.activations",
                   "transformers.pytorch_utils", "transformers.cache_utils", "transformers.modeling_rope_utils",
                   "transformers.modeling_layers", "transformers.utils.generic", "transformers.utils.deprecation",
                   "transformers.utils.output_capturing")

# The replacements libraries make of a torch function once per process when first imported, keeping the
# original as ``__wrapped__``: a plugin importing one is not a plugin editing torch. Each is exact: the
# attribute name replaced, and the module and name of the library's own wrapper (``import nnsight`` sets
# ``torch.Tensor.backward`` to ``nnsight.intervention.backward._backward``).
LIBRARY_WRAPS = {"backward": ("nnsight.intervention.backward", "_backward")}

_DEPTH = 4  # how far closures and __wrapped__ are followed: decorators stack two or three deep


def _settle() -> None:
    """Make now the edits torch makes once per process on first use: ``torch.compile`` replaces
    ``nn.Module.__init__``/``__setstate__`` (dynamo's generation tagging). A plugin compiling something was
    refused as having replaced them, and a fresh process (every CLI run) could not help."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except Exception:  # a torch without dynamo: nothing to settle
        return
    install_generation_tagging_init()  # once per process: it marks nn.Module as done


def _library_wrap(name: str, old: Any, new: Any) -> bool:
    """``new``, now under ``name``, is the wrapper a library in :data:`LIBRARY_WRAPS` puts there, wrapping
    ``old``: the very function object its module holds, defined in that module (its globals are the module's),
    not one that merely says it comes from there (a plugin can compile code under any file name and set any
    ``__wrapped__``)."""
    known = LIBRARY_WRAPS.get(name)
    if known is None or getattr(new, "__wrapped__", None) is not old:
        return False
    module = sys.modules.get(known[0])  # its __module__ is no witness: functools.wraps copies the wrapped one's
    return module is not None and vars(module).get(known[1]) is new and getattr(new, "__globals__", None) is vars(module)


def _classes(model: Any, others: tuple = ()) -> set[type]:
    """The classes whose methods a forward runs: every module's (and their bases), torch.Tensor, and those of
    ``others`` (the handle and its tokenizer: ``type(handle).to_tokens`` or ``type(tokenizer).encode``
    replaced changes what every later run feeds the model)."""
    import torch

    classes = {torch.Tensor}
    for module in model.modules():
        classes.update(c for c in type(module).__mro__ if c is not object)
    for other in others:
        if other is not None:
            classes.update(c for c in type(other).__mro__ if c is not object)
    return classes


_REACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _reached_modules(model: Any) -> frozenset[str]:
    """The modules (outside the standard library and mechkit) whose Python functions run in one 2-token forward of
    ``model``, traced once per model object (``sys.setprofile``, a few ms): the cache, mask, rope and output
    helpers a family's forward calls live in modules its classes do not name. Empty where the forward cannot
    run this way (a model in train mode, whose forward may update buffers; one needing other inputs)."""
    try:
        return _REACHED[model]
    except (KeyError, TypeError):
        pass
    import torch

    names: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            names.add(frame.f_globals.get("__name__") or "")

    reached: frozenset[str] = frozenset()
    if not any(m.training for m in model.modules()):
        try:
            embed = model.get_input_embeddings()
            ids = torch.ones((1, 2), dtype=torch.long, device=embed.weight.device)
            with ropes_as_loaded(model):  # a 2-token forward resets a grown dynamic RoPE: put back after
                previous = sys.getprofile()
                sys.setprofile(profile)
                try:
                    with torch.no_grad():
                        model(input_ids=ids)
                finally:
                    sys.setprofile(previous)
            skipped = sys.stdlib_module_names | {"mechkit"}  # mechkit's own hooks and memos change by design
            reached = frozenset(n for n in names if n and n.split(".")[0] not in skipped and n in sys.modules)
        except Exception:  # a model this input does not fit: the named modules are still checked
            reached = frozenset()
    with contextlib.suppress(TypeError):  # a model no weak reference can hold: traced again next time
        _REACHED[model] = reached
    return reached


def _callables(namespace: Mapping, where: str, out: dict, seen: dict, dunders: bool = True) -> None:
    for name, value in list(namespace.items()):
        if not dunders and str(name).startswith("__"):
            continue  # a module's __builtins__, __loader__…: not the model's code (Ray's driver replaces print)
        if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
            out[(where, str(name))] = value
            for _, fn in _functions_of(value):
                _inside(fn, out, seen, 0)


def _functions_of(value: Any) -> list[tuple[str, Any]]:
    """The plain functions a callable or descriptor runs, named by how they are reached from it."""
    import functools
    import types

    if isinstance(value, types.FunctionType):
        return [("", value)]
    if isinstance(value, (staticmethod, classmethod, types.MethodType)):
        return [(".__func__", value.__func__)]
    if isinstance(value, property):
        return [(f".{n}", f) for n in ("fget", "fset", "fdel") if (f := getattr(value, n)) is not None]
    if isinstance(value, functools.partial):
        return [(".func", value.func)]
    return []


def _inside(fn: Any, out: dict, seen: dict, depth: int) -> None:
    """What a function runs besides its object: ``__code__``, ``__defaults__``, ``__kwdefaults__``, its
    ``__dict__`` entries, the callables its closure cells hold and ``__wrapped__`` (those followed
    ``_DEPTH`` deep). Keyed by the function object (``(its name, part, id)``), read once however many names
    reach it: ``PreTrainedModel``'s methods are every subclass's too."""
    import types

    if not isinstance(fn, types.FunctionType) or depth >= _DEPTH or seen.get(id(fn), _DEPTH) <= depth:
        return  # a builtin: its object, compared by whoever holds it, is all there is
    seen[id(fn)] = depth
    label = f"{getattr(fn, '__module__', None)}.{fn.__qualname__}"
    out[(label, ".__code__", id(fn))] = fn.__code__
    out[(label, ".__defaults__", id(fn))] = fn.__defaults__  # a tuple, replaced as a whole
    if fn.__kwdefaults__:
        out[(label, ".__kwdefaults__", id(fn))] = _Held(dict(fn.__kwdefaults__))  # a dict, changed in place
    inner = []
    for attr, held in list(vars(fn).items()):
        out[(label, f".{attr}" if attr == "__wrapped__" else f".__dict__[{attr!r}]", id(fn))] = held
        if attr == "__wrapped__":
            inner.extend(_functions_of(held))
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell (not yet assigned): nothing runs from it yet
            continue
        if callable(held):  # the function a decorator wraps; a value (a flag, a name) is data
            out[(label, f".__closure__[{var!r}]", id(fn))] = held
            inner.extend(_functions_of(held))
    for _, held in inner:
        _inside(held, out, seen, depth + 1)


class _Held:
    """A function's keyword defaults: the same when the same names hold the same objects."""

    __slots__ = ("items",)

    def __init__(self, items: dict) -> None:
        self.items = items

    def same(self, other: Any) -> bool:
        return isinstance(other, _Held) and self.items.keys() == other.items.keys() and \
            all(v is other.items[k] for k, v in self.items.items())


def _resolved(cls: type) -> dict[str, Any]:
    """Every name of ``cls`` and its bases, as looked up on it (its MRO's ``vars``, nearest last: no descriptor
    runs). A method set on a subclass over its base's (``torch.Tensor.pow = f`` over ``TensorBase.pow``) is
    a new name in the subclass's own ``vars``, which a comparison of ``vars`` took for a name that appeared."""
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        out.update(vars(base))
    return out


def code_state(model: Any, *others: Any) -> dict[tuple, Any]:
    """``{(where, name): object}`` for the code the model's forward can reach (see the module docstring), and
    ``{(function, part, id): object}`` for what each function reached holds; the objects are held, so that
    their ids stay theirs while compared."""
    _settle()
    reached = _reached_modules(model)  # before the snapshot: a first forward may import lazily
    refs: dict[tuple, Any] = {}
    seen: dict[int, int] = {}
    classes = _classes(model, others)
    modules = sorted({c.__module__ for c in classes} | set(LIBRARY_MODULES) | reached)
    for name in modules:  # the classes a reached module defines: DynamicLayer, whose update every forward runs
        module = sys.modules.get(name)
        if module is not None and name != "torch":  # torch's own classes: dtypes, storages, Tensor (above)
            classes.update(v for v in list(vars(module).values()) if isinstance(v, type) and v.__module__ == name)
    # bases first, so that an edit is named on the class it was made on rather than on a subclass inheriting it
    for cls in sorted(classes, key=lambda c: (len(c.__mro__), c.__module__, c.__qualname__)):
        _callables(_resolved(cls), f"{cls.__module__}.{cls.__qualname__}", refs, seen)  # Tensor.pow shadows TensorBase's
    for name in modules:
        module = sys.modules.get(name)
        if module is None:
            continue
        namespace = vars(module)
        _callables(namespace, name, refs, seen, dunders=False)
        for attr, value in list(namespace.items()):  # registries: ALL_ATTENTION_FUNCTIONS, ACT2FN
            if isinstance(value, Mapping) and not isinstance(value, type) and not str(attr).startswith("__"):
                try:
                    _callables(dict(value.items()), f"{name}.{attr}[...]", refs, seen)
                except Exception:  # a mapping that cannot list itself: nothing to compare
                    continue
    return refs


_MISSING = object()


def changed_code(before: dict, after: dict) -> str | None:
    """The first name whose object was replaced (or removed) during the run, in words, else None. A name a
    known library wrapped (:data:`LIBRARY_WRAPS`) is no change: what it wraps is still read, through its
    ``__wrapped__``, under its own function's keys."""
    for key, value in before.items():
        now = after.get(key, _MISSING)
        if now is not _MISSING and (now is value or isinstance(value, _Held) and value.same(now)):
            continue
        if len(key) == 3:  # inside a function that is still there
            return f"{key[0]}{key[1]} was replaced and not put back"
        where, name = key
        if now is not _MISSING and _library_wrap(name, value, now):
            continue
        if where.endswith("[...]"):
            return f"{where[:-5]}[{name!r}] was replaced and not put back"
        return f"{where}.{name} was replaced and not put back"
    return None
