"""Reversible edits of one weight wherever it lives, restored bit-exactly.

An offloaded weight is edited in a copy that the module's hook reads in place of the stored one until
the slot is restored; the stored weights are never written, so restoring them is exact by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError
from mechkit.model.placement.stored import offload_hook

if TYPE_CHECKING:
    from torch import nn


class _Overlay(Mapping):
    """A hook's weights map with some tensors replaced by edited copies (the stored ones untouched)."""

    def __init__(self, base: Mapping) -> None:
        self.base = base
        self.edited: dict[str, Any] = {}

    def __getitem__(self, key: str):
        return self.edited[key] if key in self.edited else self.base[key]

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


class WeightSlot:
    """One tensor of the model, editable in place through :attr:`editable` and put back by :meth:`restore`.

    A resident parameter is edited in place and copied back from a snapshot. An offloaded one (on
    ``meta``, its weights in accelerate's ``weights_map``) is edited in a copy that its hooks — the
    module's and those of weights tied to it — read instead of the stored tensor; :meth:`restore`
    removes the copy, so the stored weights come back untouched. Such copies live in CPU memory (or
    wherever the offloaded weight is kept) while the edit lasts.
    """

    def __init__(self, model: nn.Module, qualname: str, tied: list[str] | None = None) -> None:
        import torch

        self.qualname = qualname
        module_name, _, leaf = qualname.rpartition(".")
        tensor = getattr(model.get_submodule(module_name), leaf)
        self._param = None
        self._overlays: list[tuple[Any, _Overlay, str]] = []
        if tensor.device.type != "meta":
            self._param = tensor
            self._home = (model.get_submodule(module_name), leaf)
            with torch.no_grad():
                self.original = tensor.detach().clone()
            self.editable = tensor.data
            return
        hooks = []
        for name in tied or [qualname]:
            found = offload_hook(model, name)
            if found is not None:
                hooks.append(found)
        if not hooks:
            raise MechkitError(f"{qualname} is on the meta device and no accelerate hook holds its weights",
                               "load the model with mechkit.load_model (or accelerate) so its weights are somewhere")
        self.original = hooks[0][0].weights_map[hooks[0][1]]  # what the hook loads; never written
        self.editable = self.original.detach().clone()
        for hook, key in hooks:
            overlay = hook.weights_map if isinstance(hook.weights_map, _Overlay) else _Overlay(hook.weights_map)
            overlay.edited[key] = self.editable
            hook.weights_map = overlay
            self._overlays.append((hook, overlay, key))

    @property
    def offloaded(self) -> bool:
        return self._param is None

    def reset(self) -> None:
        """The editable tensor back to the original values (the slot stays open)."""
        import torch

        with torch.no_grad():
            self.editable.copy_(self.original)

    def restore(self) -> None:
        """The original back, bit-exactly; an offloaded weight's hooks read the stored tensor again."""
        if self._param is not None:
            module, leaf = self._home
            if getattr(module, leaf, None) is not self._param:  # a parameter replaced inside the edit: the
                setattr(module, leaf, self._param)  # original object goes back, as its value does
            self.reset()
            return
        for hook, overlay, key in self._overlays:
            overlay.edited.pop(key, None)
            if not overlay.edited and hook.weights_map is overlay:
                hook.weights_map = overlay.base
        self._overlays.clear()
