"""A plain copy of a placed model: no accelerate hooks, every weight filled from where it is stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError
from mechkit.model.placement.devices import torch_device
from mechkit.model.placement.request import format_size
from mechkit.model.placement.stored import align_hooks, input_device, is_dispatched, stored_tensor
from mechkit.model.placement.ties import tied_names

if TYPE_CHECKING:
    import torch
    from torch import nn


def free_bytes(device: torch.device | str) -> int | None:
    """Bytes free on ``device`` now (CPU: available memory); None where it cannot be known."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil  # accelerate's own dependency

        return int(psutil.virtual_memory().available)
    return None


def _nbytes(model: nn.Module, dtype: torch.dtype | None, ties: Mapping[str, list[str]]) -> int:
    seen: set[str] = set()
    total = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        if any(other in seen for other in ties.get(name, ())):
            continue
        seen.add(name)
        size = (dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype).itemsize
        total += tensor.numel() * size
    return total


class PlainCopy:
    """A copy of a dispatched model without accelerate's hooks, its tensors filled from the stored
    weights onto one device, module by module as :meth:`fill` is called.

    Deep-copying a dispatched model would copy accelerate's hooks and weights maps (for ``cpu_offload``
    the whole CPU state dict) and keep its ``meta`` parameters; this copy maps every parameter and
    persistent buffer to ``meta`` and every weights map to nothing while copying, removes the hooks,
    and then reads each tensor from where the original keeps it (:func:`stored_tensor`, edits in
    progress included) straight onto ``device``, as ``dtype`` if given. So a caller can slice one
    block before filling the next (pruning: never the whole dense model at once) or fill everything
    (:func:`plain_copy`). Tied weights (:func:`tied_names`) share one parameter again. The original
    is only read.
    """

    def __init__(self, model: nn.Module, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        import copy

        import torch
        from accelerate.hooks import remove_hook_from_module
        from torch import nn

        self.original, self.device, self.dtype = model, torch.device(device), dtype
        self.ties = tied_names(model)
        persistent = {id(t) for t in model.state_dict(keep_vars=True).values()}
        memo: dict[int, Any] = {}
        for module in model.modules():
            for hook in align_hooks(module):
                for attr in ("weights_map", "tied_params_map"):
                    if getattr(hook, attr, None) is not None:
                        memo[id(getattr(hook, attr))] = {}
            for param in module._parameters.values():
                if param is not None and id(param) not in memo:
                    memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                   requires_grad=param.requires_grad)
            for name, buf in module._buffers.items():
                if buf is None or id(buf) in memo:
                    continue
                if id(buf) in persistent:
                    memo[id(buf)] = torch.empty_like(buf, device="meta")
                elif buf.device.type == "meta":
                    raise MechkitError(f"buffer {name} of {type(module).__name__} is on the meta device and not "
                                       "in the state dict", "load the model with mechkit.load_model")
                else:
                    memo[id(buf)] = self._cast(buf)
        self.model = copy.deepcopy(model, memo)
        for module in self.model.modules():
            for hook in align_hooks(module):
                hook.offload = False  # nothing to put back: the copy's tensors are filled below
        remove_hook_from_module(self.model, recurse=True)
        self.model.__dict__.pop("hf_device_map", None)
        self._origin = {id(m): n for n, m in self.model.named_modules(remove_duplicate=False)}
        self._filled: dict[str, Any] = {}

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.detach().to(self.device, dtype, copy=True)

    def nbytes(self) -> int:
        """Bytes of the copy as it stands (its ``meta`` tensors counted as they will be filled)."""
        return _nbytes(self.model, self.dtype, self.ties)

    def fill(self, module: nn.Module | None = None) -> None:
        """Give every ``meta`` tensor under ``module`` (default: the whole copy) its stored value."""
        from torch import nn

        for sub in (module or self.model).modules():
            prefix = self._origin.get(id(sub))
            if prefix is None:
                raise MechkitError(f"{type(sub).__name__} is not a module of the copied model",
                                   "fill modules of PlainCopy.model only")
            for kind in ("_parameters", "_buffers"):
                tensors = getattr(sub, kind)
                for leaf, tensor in list(tensors.items()):
                    if tensor is None or tensor.device.type != "meta":
                        continue
                    name = f"{prefix}.{leaf}" if prefix else leaf
                    shared = next((self._filled[n] for n in self.ties.get(name, ()) if n in self._filled), None)
                    if shared is None:
                        value = self._cast(stored_tensor(self.original, name))
                        if value.shape != tensor.shape:
                            raise MechkitError(f"{name}: stored weights of shape {tuple(value.shape)} for a "
                                               f"tensor of {tuple(tensor.shape)}", "fill before editing shapes")
                        shared = nn.Parameter(value, requires_grad=tensor.requires_grad) if kind == "_parameters" \
                            else value
                    tensors[leaf] = shared
                    self._filled[name] = shared


def plain_copy(model: nn.Module, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
               factor: float = 1.0, purpose: str = "a copy of the model",
               fix: str = "use a device with more free memory") -> nn.Module:
    """A hook-free copy of ``model`` with every weight on ``device`` (default: its main device), as
    ``dtype`` if given: a dispatched model's from its stored weights (:class:`PlainCopy`), any other's
    by ``copy.deepcopy``. The caller's model is only read.

    ``factor`` × the copy's bytes must be free on the device (training: weights, gradients and AdamW's
    two moments are ``4``), else one :class:`MechkitError` line naming ``purpose`` and ``fix``.

    >>> import mechkit as mk
    >>> plain_copy(mk.load_model("tiny:llama").model).model.norm.weight.shape
    torch.Size([64])
    """
    import copy

    if not is_dispatched(model):
        out = copy.deepcopy(model)
        return out.to(**({"device": device} if device is not None else {}), **({"dtype": dtype} if dtype else {}))
    target = input_device(model) if device is None else torch_device(device)
    plain = PlainCopy(model, target, dtype)
    check_fits(plain.nbytes() * factor, target, purpose, fix)
    plain.fill()
    return plain.model


def check_fits(nbytes: float, device: torch.device | str, purpose: str, fix: str) -> None:
    """One :class:`MechkitError` line when ``nbytes`` are more than ``device`` has free now."""
    free = free_bytes(device)
    if free is not None and nbytes > free:
        raise MechkitError(f"{purpose} needs {format_size(nbytes)} on {device} but only {format_size(free)} is free there",
                           fix)
