"""What a run must leave as it found besides the weights: hooks, replaced ``forward`` methods, train/eval
mode, the modules themselves, the config and the tokenizer.

The logits of a few probe tokens miss a hook that acts only on longer inputs, on batches or on padding,
a ``forward`` replaced to act only past the probe's length, a model left in train mode whose dropout is
zero, or a config field read only for long inputs. The run's model would then compute differently for
the next caller. These are read directly, before and after the run: the hooks every module (and torch's
global registry) holds, each module's own ``forward`` attribute and mode, and the config's fields. Only
references are compared, so the check is exact and costs a walk over the modules. References, not names:
a module swapped for another object under the same name (or its class swapped), a hook's function
replaced under the same handle, or a parameter replaced by a copy (a tie broken) changes what the model
computes while every name stays. The tokenizer's definition and settings (a ``padding_side`` left flipped,
tokens added) change the next caller's ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


@dataclass(frozen=True)
class ModuleState:
    """One module: the object and its class, its hooks (handle ids and functions), its own ``forward``
    attribute if any, its mode, and its own parameters (objects and ``requires_grad``)."""

    module: Any
    cls: type
    hooks: tuple
    forward: Any
    training: bool
    params: tuple
    refs: tuple  # the hook functions and parameters, held so that their ids stay theirs while compared
    calls: tuple = ()  # (name, object) of its own attributes that replace a method torch calls on it


def _own_calls(m: Any) -> tuple:
    """The module's own attributes that stand in for a method of its class (``_call_impl``, a helper such as
    ``_attn``) and torch's ``_compiled_call_impl``: ``nn.Module.__call__`` runs either in place of
    ``forward``, so one acting only on long inputs passed every check."""
    cls = type(m)
    return tuple((name, value) for name, value in sorted(vars(m).items())
                 if name != "forward" and (name == "_compiled_call_impl" or
                                           (callable(value) and callable(getattr(cls, name, None)))))


def _module_state(m: Any) -> ModuleState:
    named = list(m.named_parameters(recurse=False))
    hook_dicts = [getattr(m, d, {}) for d in _HOOK_DICTS]
    hooks = tuple(tuple((k, id(fn)) for k, fn in d.items()) for d in hook_dicts)
    managed = hasattr(m, "_hf_hook")  # accelerate swaps a dispatched module's parameters in and out per forward
    params = tuple((name, None if managed else id(p), bool(p.requires_grad)) for name, p in named)
    refs = (tuple(fn for d in hook_dicts for fn in d.values()), tuple(p for _, p in named))
    return ModuleState(m, type(m), hooks, m.__dict__.get("forward"), bool(m.training), params, refs, _own_calls(m))


def _config(model: Any) -> dict:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    data = json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))
    data["_attn_implementation"] = str(getattr(config, "_attn_implementation", None))  # not in to_dict()
    return data


def _generation(model: Any) -> dict:
    """The model's generation settings (``generation_config``: a ``repetition_penalty`` or ``do_sample`` left
    set changes every later ``generate``), as plain JSON."""
    config = getattr(model, "generation_config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def handle_state(handle: Any) -> dict:
    """What a :class:`~mechkit.model.handle.ModelHandle` says about its model besides the model object: its
    anatomy (what every analysis reads its layers and heads from), where it came from, its backend and the
    weights' hash it remembers (what resume keys and saved artifacts record). A run that changes one leaves
    the next caller's analyses, keys or artifacts wrong although the model computes as before."""
    return {"anatomy": _anatomy(handle.anatomy), "anatomy_obj": handle.anatomy, "spec": handle.spec, "name": handle.name,
            "source": handle.source, "backend": handle.backend, "model": handle.model,
            "tokenizer": handle.tokenizer, "sha256": handle._sha256}


def _anatomy(anatomy: Any) -> tuple:
    """An anatomy's fields as comparable values: modules by identity (held, so their ids stay theirs), lists
    of them item by item, everything else by value (a copy: a list changed in place must show)."""
    import copy
    import dataclasses

    from torch import nn

    def frozen(value: Any) -> Any:
        if isinstance(value, nn.Module):
            return ("module", id(value), value)
        if isinstance(value, (list, tuple)):
            return tuple(frozen(v) for v in value)
        return copy.deepcopy(value)

    if not dataclasses.is_dataclass(anatomy):
        return (anatomy,)
    return tuple((f.name, frozen(getattr(anatomy, f.name))) for f in dataclasses.fields(anatomy))


def changed_handle(before: dict, handle: Any) -> str | None:
    """What of :func:`handle_state` differs after a run, in words, else None. A weights' hash dropped (an
    in-place edit forgets it, to be computed again) is no change; one replaced by another value is."""
    if handle.anatomy is not before["anatomy_obj"] or _anatomy(handle.anatomy) != before["anatomy"]:
        return "its anatomy (handle.anatomy: layers, heads, module names) was changed"
    for key in ("spec", "name", "source"):
        if getattr(handle, key) != before[key]:
            return f"handle.{key} was changed ({before[key]!r} -> {getattr(handle, key)!r})"
    for key in ("backend", "model", "tokenizer"):
        if getattr(handle, key) is not before[key]:
            return f"handle.{key} was replaced by another object"
    if handle._sha256 is not None and before["sha256"] is not None and handle._sha256 != before["sha256"]:
        return "the weights' hash it remembers (handle._sha256) was replaced while its weights stayed the same"
    return None


def model_state(model: Any, tokenizer: Any = None) -> dict:
    """The model's modules, hooks, ``forward`` overrides, modes, parameters, config and (given) tokenizer,
    to compare with :func:`changed_state`."""
    from torch.nn.modules import module as torch_module

    from mechkit.model.checks.identity import tokenizer_sha256

    modules = {name: _module_state(m) for name, m in model.named_modules()}
    global_dicts = [getattr(torch_module, d, {}) for d in _GLOBAL_HOOKS]
    global_hooks = tuple(tuple((k, id(fn)) for k, fn in d.items()) for d in global_dicts)
    return {"modules": modules, "global_hooks": global_hooks, "config": _config(model),
            "generation": _generation(model),
            "global_refs": [fn for d in global_dicts for fn in d.values()],  # held: their ids stay theirs
            "tokenizer": tokenizer_sha256(tokenizer) if tokenizer is not None else None}


def hooked(state: dict) -> str | None:
    """Where the model carries a hook or a replaced ``forward`` (the first found), else None: a run's results
    then depend on code no resume key can name."""
    if any(state["global_hooks"]):
        return "a global module hook"
    for name, s in state["modules"].items():
        if any(s.hooks) or s.forward is not None:
            return f"{'a hook' if any(s.hooks) else 'a replaced forward'} on {name or 'the model'}"
    return None


def changed_state(before: dict, after: dict) -> str | None:
    """What differs, in words (the first thing found), else None."""
    if before["global_hooks"] != after["global_hooks"]:
        return "a global module hook (torch.nn.modules.module.register_module_forward_hook) was left registered"
    old, new = before["modules"], after["modules"]
    if set(old) != set(new):
        return f"its modules changed ({sorted(set(old) ^ set(new))[0] or 'the model'} appeared or vanished)"
    for name, was in old.items():
        now, label = new[name], name or "the model"
        if was.module is not now.module or was.cls is not now.cls:
            return f"{label} was replaced by another module (or its class was swapped) and not put back"
        if was.hooks != now.hooks:
            return f"a hook was left on {label} (or one it had was removed)"
        if was.forward is not now.forward:
            return f"{label}.forward was replaced and not put back"
        if [(n, id(v)) for n, v in was.calls] != [(n, id(v)) for n, v in now.calls]:
            name = next(n for n, _ in (*now.calls, *was.calls) if dict(was.calls).get(n) is not dict(now.calls).get(n))
            return f"{label}.{name} was replaced and not put back"
        if was.training != now.training:
            return f"{label} was left in {'train' if now.training else 'eval'} mode"
        if was.params != now.params:
            return f"a parameter of {label} was replaced or its requires_grad changed, and not put back"
    for key in sorted(set(before["config"]) | set(after["config"])):
        if before["config"].get(key) != after["config"].get(key):
            return f"its config field {key} changed ({before['config'].get(key)!r} -> {after['config'].get(key)!r})"
    if before.get("generation") != after.get("generation"):
        key = next(k for k in sorted(set(before["generation"]) | set(after["generation"]))
                   if before["generation"].get(k) != after["generation"].get(k))
        return (f"its generation_config field {key} changed ({before['generation'].get(key)!r} -> "
                f"{after['generation'].get(key)!r})")
    if before.get("tokenizer") != after.get("tokenizer"):
        return "its tokenizer was changed (its vocabulary, special tokens or a setting such as padding_side)"
    return None
