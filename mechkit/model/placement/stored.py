"""Where a placed model's weights and inputs are: on their device, or offloaded in accelerate's hooks.

A module offloaded to CPU memory or disk keeps its parameters on ``meta`` and its weights in
``module._hf_hook.weights_map``; every read of a weight goes through here so it finds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError
from mechkit.model.placement.devices import from_accelerate, main_device, to_accelerate, torch_device

if TYPE_CHECKING:
    import torch
    from torch import nn


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed this model (a device map, or hooks that move weights or inputs)."""
    return getattr(model, "hf_device_map", None) is not None or hasattr(model, "_hf_hook") or any(
        hasattr(m, "_hf_hook") for m in model.modules())


def align_hooks(module: nn.Module) -> list:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    from accelerate.hooks import AlignDevicesHook, SequentialHook

    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return [h for h in hooks if isinstance(h, AlignDevicesHook)]


def input_device(model: nn.Module) -> torch.device:
    """Where a forward's inputs go: the dispatched model's main device, else its parameters' device."""
    import torch

    if hasattr(model, "_hf_hook"):
        for hook in align_hooks(model):
            if hook.execution_device is not None:
                return torch_device(hook.execution_device)
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        return torch_device(to_accelerate(main_device({k: from_accelerate(v) for k, v in device_map.items()})))
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def device_summary(model: nn.Module) -> dict[str, str] | None:
    """``{module: device}`` where accelerate placed the model (``disk``/``cpu`` for offloaded), else None."""
    device_map = getattr(model, "hf_device_map", None)
    return None if not device_map else {k: from_accelerate(v) for k, v in device_map.items()}


def offload_hook(model: nn.Module, qualname: str) -> tuple[Any, str] | None:
    """The accelerate hook holding the offloaded tensor ``qualname`` and its key in the hook's weights map.

    The module's own hook, or an ancestor's that places its submodules (``preload_module_classes``).
    """
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        module = model.get_submodule(".".join(parts[:cut]))
        key = ".".join(parts[cut:])
        for hook in align_hooks(module):
            if hook.offload and hook.weights_map is not None and (cut == len(parts) - 1 or hook.place_submodules):
                return hook, key
    return None


def _qualname(model: nn.Module, module: nn.Module, name: str) -> str:
    for prefix, m in model.named_modules(remove_duplicate=False):
        if m is module:
            return f"{prefix}.{name}" if prefix else name
    raise MechkitError(f"the module holding {name!r} is not part of the model", "edit a module of this model")


def stored_tensor(model: nn.Module, qualname: str) -> torch.Tensor:
    """The value of tensor ``qualname``: the parameter itself, or for an offloaded one the tensor its
    hook would load (from CPU memory or disk; edits in progress included), on its storage device."""
    module_name, _, leaf = qualname.rpartition(".")
    tensor = getattr(model.get_submodule(module_name), leaf)
    if tensor.device.type != "meta":
        return tensor
    found = offload_hook(model, qualname)
    if found is None:
        raise MechkitError(f"{qualname} is on the meta device and no accelerate hook holds its weights",
                           "load the model with mechkit.load_model (or accelerate) so its weights are somewhere")
    hook, key = found
    return hook.weights_map[key]


def module_tensor(module: nn.Module, name: str = "weight", model: nn.Module | None = None) -> torch.Tensor:
    """A module's parameter or buffer as a real tensor, also where accelerate offloaded it (then a copy
    on the module's execution device). Read-only: edit through :class:`WeightSlot`."""
    tensor = getattr(module, name)
    if tensor.device.type != "meta":
        return tensor
    for hook in align_hooks(module):
        if hook.offload and hook.weights_map is not None:
            value = hook.weights_map[name]
            return value.to(torch_device(hook.execution_device)) if hook.execution_device is not None else value
    if model is not None:
        return stored_tensor(model, _qualname(model, module, name))
    raise MechkitError(f"{type(module).__name__}.{name} is offloaded by an ancestor module's hook",
                       "pass model= so the hook that holds it can be found")


def state_items(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model.state_dict()`` with every offloaded tensor read from where accelerate keeps it."""
    for name, tensor in model.state_dict().items():
        yield name, stored_tensor(model, name) if tensor.device.type == "meta" else tensor


class StateView(Mapping):
    """``model.state_dict()`` read lazily, offloaded tensors included (one at a time, never all at once);
    only ``names`` where given.

    >>> import mechkit as mk
    >>> view = StateView(mk.load_model("tiny:llama").model)
    >>> view["model.norm.weight"].shape
    torch.Size([64])
    """

    def __init__(self, model: nn.Module, names: Iterable[str] | None = None) -> None:
        self.model = model
        self._names = dict.fromkeys(model.state_dict() if names is None else names)

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(name)
        return stored_tensor(self.model, name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
