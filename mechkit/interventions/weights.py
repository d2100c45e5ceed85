"""Reversible weight edits: every touched parameter is restored bit-exactly on exit, also on error.

Edits reach every weight wherever it lives: on the model's device, spread over several devices, or
offloaded by accelerate to CPU memory or disk (then the edit is made in a copy the module's hook
loads instead of the stored weight, and the stored weight is never written — see
:class:`mechkit.model.placement.slots.WeightSlot`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from mechkit.model.headspec import Head, check_heads
from mechkit.model.modules.linear import is_transposed
from mechkit.model.placement.slots import WeightSlot
from mechkit.model.placement.ties import tied_names

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


_OPEN: weakref.WeakKeyDictionary[nn.Module, list[weakref.ref]] = weakref.WeakKeyDictionary()
"""The open :class:`WeightEdits` of each model, oldest first: whoever closes out of order hands its
snapshots to the next newer one that edited the same tensor."""


class WeightEdits:
    """Hands out weights for in-place editing, snapshotting each one the first time.

    Overlapping edits of one model may be closed in any order: when all are closed every tensor holds
    its value from before the first one opened. One closed before a newer one that touched the same
    tensor leaves it edited and passes its snapshot on, so the newer one restores the oldest value.
    """

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self._slots: dict[object, WeightSlot] = {}
        _OPEN.setdefault(handle.model, []).append(weakref.ref(self))
        self._names: dict[int, str] | None = None  # id(module) -> its name in the model, once needed
        self._tied: dict[str, list[str]] | None = None

    def _name(self, module: nn.Module, name: str) -> str:
        if self._names is None:
            self._names = {id(m): prefix for prefix, m in self.handle.model.named_modules(remove_duplicate=False)}
        prefix = self._names[id(module)]
        return f"{prefix}.{name}" if prefix else name

    def slot(self, qualname: str) -> WeightSlot:
        """The :class:`WeightSlot` of tensor ``qualname`` (e.g. ``model.layers.0.mlp.down_proj.weight``),
        opened (snapshotted) the first time. Tied names share one slot."""
        module_name, _, leaf = qualname.rpartition(".")
        tensor = getattr(self.handle.model.get_submodule(module_name), leaf)
        if tensor.device.type != "meta":
            key: object = id(tensor)  # tied resident parameters are one Parameter object
            tied = None
        else:
            if self._tied is None:
                self._tied = tied_names(self.handle.model)
            tied = self._tied.get(qualname)
            key = frozenset(tied or [qualname])
        if key not in self._slots:
            self._slots[key] = WeightSlot(self.handle.model, qualname, tied=tied)
        return self._slots[key]

    def param(self, module: nn.Module, name: str = "weight") -> torch.Tensor:
        """The tensor's data, safe to edit in place; restored when the context exits."""
        return self.slot(self._name(module, name)).editable

    def named(self, qualname: str) -> torch.Tensor:
        """:meth:`param` by the tensor's name in the model."""
        return self.slot(qualname).editable

    def original(self, qualname: str) -> torch.Tensor:
        """Tensor ``qualname`` as it was before this context edited it (snapshotted now if untouched)."""
        return self.slot(qualname).original

    def weight_out_in(self, module: nn.Module) -> torch.Tensor:
        """The module's weight as an editable ``[out, in]`` view (GPT-2 Conv1D included)."""
        w = self.param(module, "weight")
        return w.t() if is_transposed(module) else w

    def zero_head_output(self, head: Head) -> None:
        """Zero the attention output projection's input columns that read ``head``."""
        check_heads(self.handle.anatomy, [head])
        d = self.handle.anatomy.head_size(head.layer)
        w = self.weight_out_in(self.handle.anatomy.attn_out(head.layer))
        w[:, head.head * d:(head.head + 1) * d] = 0

    def reset(self) -> None:
        """Every edited tensor back to its original value; the snapshots are kept."""
        for slot in self._slots.values():
            slot.reset()

    def restore(self) -> None:
        """Every edited tensor back to its original value, and forget the snapshots (a tensor a newer, still
        open edit also touched is left to it, with this one's snapshot: see the class doc)."""
        newer = self._close()
        for key, slot in self._slots.items():
            heir = next((e._slots[key] for e in newer if key in e._slots), None)
            if heir is not None and not slot.offloaded and not heir.offloaded:
                heir.original = slot.original  # the newer edit now restores what was there before this one
            else:
                slot.restore()
        self._slots.clear()

    def _close(self) -> list[WeightEdits]:
        """Leave the model's open edits; the ones opened after this one, oldest first."""
        refs = _OPEN.get(self.handle.model, [])
        alive = [e for e in (r() for r in refs) if e is not None]
        newer = alive[alive.index(self) + 1:] if self in alive else []
        refs[:] = [weakref.ref(e) for e in alive if e is not self]
        return newer

    @property
    def edited(self) -> int:
        return len(self._slots)


@contextlib.contextmanager
def edit_weights(handle: ModelHandle) -> Iterator[WeightEdits]:
    """Edit weights in place for the duration of the context.

    >>> import mechkit as mk
    >>> from mechkit.model.headspec import Head
    >>> m = mk.load_model("tiny:llama")
    >>> with mk.edit_weights(m) as w:
    ...     w.zero_head_output(Head(0, 1))
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.edit_weights")
    edits = WeightEdits(handle)
    try:
        yield edits
    finally:
        edits.restore()
