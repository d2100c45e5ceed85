"""Reversible weight edits: every touched parameter is restored bit-exactly on exit, also on error.

Edits reach every weight wherever it lives: on the model's device, spread over several devices, or
offloaded by accelerate to CPU memory or disk (then the edit is made in a copy the module's hook
loads instead of the stored weight, and the stored weight is never written — see
:class:`mechkit.model.placement.slots.WeightSlot`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from mechkit.errors import MechkitError, single_use
from mechkit.model.headspec import Head, check_heads
from mechkit.model.modules.linear import is_transposed
from mechkit.model.placement.slots import WeightSlot
from mechkit.model.placement.ties import tied_names

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


_OPEN: weakref.WeakKeyDictionary[nn.Module, list[weakref.ref]] = weakref.WeakKeyDictionary()
"""The open :class:`WeightEdits` of each model: whoever closes while another still holds a snapshot of the
same tensor taken after its own hands its (older) snapshot on instead of restoring."""

_SNAPSHOTS = itertools.count()
"""When each snapshot was taken: the order that decides who restores what (not the order the contexts
opened in: an older context may first touch a tensor after a newer one did)."""


class WeightEdits:
    """Hands out weights for in-place editing, snapshotting each one the first time.

    Overlapping edits of one model may be opened, touched and closed in any order: when all are closed
    every tensor holds its value from before the first one touched it. Closing one whose snapshot of a
    tensor is the latest still open restores that snapshot (plain nesting: the inner edit is undone);
    otherwise it leaves the tensor edited and hands its snapshot to the open edit whose snapshot comes
    next in time, so the oldest value always stays with an open edit and the last to close restores it.
    """

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self._slots: dict[object, WeightSlot] = {}
        self._taken: dict[object, int] = {}  # key -> when its snapshot was taken (_SNAPSHOTS)
        _OPEN.setdefault(handle.model, []).append(weakref.ref(self))
        self._names: dict[int, str] | None = None  # id(module) -> its name in the model, once needed
        self._tied: dict[str, list[str]] | None = None
        self._closed = False

    def _name(self, module: nn.Module, name: str) -> str:
        if self._names is None:
            self._names = {id(m): prefix for prefix, m in self.handle.model.named_modules(remove_duplicate=False)}
        if id(module) not in self._names:
            raise MechkitError(f"{type(module).__name__} is not a module of this model",
                               "pass one of its modules (e.g. m.anatomy.attn_out(0)), or name the tensor: .named(NAME)")
        prefix = self._names[id(module)]
        return f"{prefix}.{name}" if prefix else name

    def slot(self, qualname: str) -> WeightSlot:
        """The :class:`WeightSlot` of tensor ``qualname`` (e.g. ``model.layers.0.mlp.down_proj.weight``),
        opened (snapshotted) the first time. Tied names share one slot."""
        if self._closed:  # an edit now would stay for good: nothing restores it
            raise MechkitError("this edit_weights context has closed: its weights were restored, and an edit made "
                               "through it now would stay for good",
                               "edit inside the `with mk.edit_weights(m) as w:` block, or open a new one")
        tensor = self._tensor(qualname)
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
            self._taken[key] = next(_SNAPSHOTS)
        return self._slots[key]

    def _tensor(self, qualname: object) -> torch.Tensor:
        """The parameter named ``qualname``, or one line naming what is wrong with the name."""
        example = next((n for n, _ in self.handle.model.named_parameters() if n.endswith(".weight")), "")
        fix = (f"name a parameter of the model, e.g. {example} " if example else "name a parameter of the model ") + \
            "(see m.model.named_parameters())"
        if not isinstance(qualname, str):
            raise MechkitError(f"a weight's name must be text, not {qualname!r}"[:200], fix)
        module_name, _, leaf = qualname.rpartition(".")
        try:
            tensor = getattr(self.handle.model.get_submodule(module_name), leaf)
        except AttributeError:
            tensor = None
        if not isinstance(tensor, torch.Tensor):
            raise MechkitError(f"{qualname!r} is not a weight of this model", fix)
        return tensor

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
        """Every edited tensor back to its original value, and forget the snapshots (a tensor another still
        open edit snapshotted later is left edited, this one's snapshot handed on: see the class doc)."""
        others = self._close()
        self._closed = True
        for key, slot in self._slots.items():
            later = [e for e in others if key in e._slots and e._taken[key] > self._taken[key]]
            heir = min(later, key=lambda e: e._taken[key], default=None)
            if heir is not None and not slot.offloaded and not heir._slots[key].offloaded:
                heir._slots[key].original = slot.original  # the heir now restores what was there before this one
                heir._taken[key] = self._taken[key]
            else:
                slot.restore()
        self._slots.clear()
        self._taken.clear()

    def _close(self) -> list[WeightEdits]:
        """Leave the model's open edits; the others still open."""
        refs = _OPEN.get(self.handle.model, [])
        alive = [e for e in (r() for r in refs) if e is not None]
        refs[:] = [weakref.ref(e) for e in alive if e is not self]
        return [e for e in alive if e is not self]

    @property
    def edited(self) -> int:
        return len(self._slots)


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
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
    handle.forget_sha256()  # the weights change inside: a hash remembered from before would name other weights
    try:
        yield edits
    finally:
        edits.restore()
        handle.forget_sha256()  # and one computed inside names the edited ones
