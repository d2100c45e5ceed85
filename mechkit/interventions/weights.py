"""Reversible weight edits: every touched parameter is restored bit-exactly on exit, also on error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from mechkit.model.heads import Head
from mechkit.model.linear import weight_out_in

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


class WeightEdits:
    """Hands out parameters for in-place editing, snapshotting each one the first time."""

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self._saved: dict[int, tuple[nn.Parameter, torch.Tensor]] = {}

    def param(self, module: nn.Module, name: str = "weight") -> torch.Tensor:
        """The parameter's data, safe to edit in place; restored when the context exits."""
        p = getattr(module, name)
        self.original(p)
        return p.data

    def original(self, p: nn.Parameter) -> torch.Tensor:
        """``p`` as it was before this context edited it (snapshotted now if it was untouched)."""
        if id(p) not in self._saved:
            self._saved[id(p)] = (p, p.detach().clone())
        return self._saved[id(p)][1]

    def weight_out_in(self, module: nn.Module) -> torch.Tensor:
        """The module's weight as an editable ``[out, in]`` view (GPT-2 Conv1D included)."""
        self.param(module, "weight")
        with torch.no_grad():
            return weight_out_in(module).data

    def zero_head_output(self, head: Head) -> None:
        """Zero the attention output projection's input columns that read ``head``."""
        d = self.handle.anatomy.d_head
        w = self.weight_out_in(self.handle.anatomy.attn_out(head.layer))
        w[:, head.head * d:(head.head + 1) * d] = 0

    def reset(self) -> None:
        """Every edited parameter back to its original value; the snapshots are kept."""
        with torch.no_grad():
            for p, original in self._saved.values():
                p.data.copy_(original)

    def restore(self) -> None:
        """Every edited parameter back to its original value, and forget the snapshots."""
        self.reset()
        self._saved.clear()

    @property
    def edited(self) -> int:
        return len(self._saved)


@contextlib.contextmanager
def edit_weights(handle: ModelHandle) -> Iterator[WeightEdits]:
    """Edit weights in place for the duration of the context.

    >>> import mechkit as mk
    >>> from mechkit.model.heads import Head
    >>> m = mk.load_model("tiny:llama")
    >>> with mk.edit_weights(m) as w:
    ...     w.zero_head_output(Head(0, 1))
    """
    edits = WeightEdits(handle)
    try:
        yield edits
    finally:
        edits.restore()
