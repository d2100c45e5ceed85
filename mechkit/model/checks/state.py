"""What a run must leave as it found besides the weights: hooks, replaced ``forward`` methods, train/eval
mode and the config.

The logits of a few probe tokens miss a hook that acts only on longer inputs, on batches or on padding,
a ``forward`` replaced to act only past the probe's length, a model left in train mode whose dropout is
zero, or a config field read only for long inputs. The run's model would then compute differently for
the next caller. These are read directly, before and after the run: the hooks every module (and torch's
global registry) holds, each module's own ``forward`` attribute and mode, and the config's fields. Only
references are compared, so the check is exact and costs a walk over the modules.
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
    """One module's hooks (their handles' ids), its own ``forward`` attribute if any, and its mode."""

    hooks: tuple[tuple[int, ...], ...]
    forward: Any
    training: bool


def _config(model: Any) -> dict:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def model_state(model: Any) -> dict:
    """The model's hooks, ``forward`` overrides, modes and config, to compare with :func:`changed_state`."""
    from torch.nn.modules import module as torch_module

    modules = {name: ModuleState(tuple(tuple(getattr(m, d, {})) for d in _HOOK_DICTS),
                                 m.__dict__.get("forward"), bool(m.training))
               for name, m in model.named_modules()}
    global_hooks = tuple(tuple(getattr(torch_module, d, {})) for d in _GLOBAL_HOOKS)
    return {"modules": modules, "global_hooks": global_hooks, "config": _config(model)}


def changed_state(before: dict, after: dict) -> str | None:
    """What differs, in words (the first thing found), else None."""
    if before["global_hooks"] != after["global_hooks"]:
        return "a global module hook (torch.nn.modules.module.register_module_forward_hook) was left registered"
    old, new = before["modules"], after["modules"]
    if set(old) != set(new):
        return f"its modules changed ({sorted(set(old) ^ set(new))[0] or 'the model'} appeared or vanished)"
    for name, was in old.items():
        now, label = new[name], name or "the model"
        if was.hooks != now.hooks:
            return f"a hook was left on {label} (or one it had was removed)"
        if was.forward is not now.forward:
            return f"{label}.forward was replaced and not put back"
        if was.training != now.training:
            return f"{label} was left in {'train' if now.training else 'eval'} mode"
    for key in sorted(set(before["config"]) | set(after["config"])):
        if before["config"].get(key) != after["config"].get(key):
            return f"its config field {key} changed ({before['config'].get(key)!r} -> {after['config'].get(key)!r})"
    return None
