"""Apply task vectors to a loaded model reversibly, or write the merged model as a directory.

:class:`TaskArithmetic` snapshots every parameter a vector touches the first time it touches it and
sets weights to ``Ψ0 + Σ λ_i τ_i`` *from the snapshot* each time :meth:`~TaskArithmetic.set` is
called, so a λ sweep never accumulates rounding error; leaving the context copies the snapshot back,
bit-exactly, also on error (the same pattern as :mod:`mechkit.interventions.weights`).

>>> import mechkit as mk, torch
>>> from mechkit.taskarith import TaskVector, apply
>>> m = mk.load_model("tiny:llama")
>>> tv = TaskVector({"model.norm.weight": torch.ones(64)})
>>> with apply(m, tv, scale=0.5):
...     m.model.model.norm.weight[0].item()
1.5
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.interventions.weights import WeightEdits
from mechkit.io import atomic_dir, check_out
from mechkit.model.names import checkpoint_renamer
from mechkit.taskarith.vector import TaskVector

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle

Term = tuple[TaskVector, float]


class TaskArithmetic:
    """Sets a handle's weights to Ψ0 + Σ λ_i τ_i; :meth:`restore` puts Ψ0 back bit-exactly."""

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self._params = dict(handle.model.named_parameters())
        self._edits = WeightEdits(handle)  # the snapshots Ψ0, restored bit-exactly
        self._touched: set[str] = set()
        self._rename = checkpoint_renamer(handle.model)

    def _name(self, name: str) -> str:
        """The module parameter a vector's tensor name means (checkpoint names such as GPT-NeoX's
        ``embed_out.weight`` are renamed as transformers renames them when loading)."""
        if name in self._params:
            return name
        renamed = self._rename(name)
        if renamed not in self._params:
            raise MechkitError(f"the task vector names a parameter the model lacks: {name}",
                               "apply a task vector extracted from this model's architecture")
        return renamed

    def _param(self, name: str) -> nn.Parameter:
        name = self._name(name)
        self._touched.add(name)
        self._edits.original(self._params[name])
        return self._params[name]

    @torch.no_grad()
    def set(self, *terms: Term) -> None:
        """Weights := Ψ0 + Σ λ τ over ``(vector, λ)`` terms; parameters no term touches go back to Ψ0."""
        for tv, _ in terms:
            for name, delta in tv.deltas.items():
                p = self._param(name)
                if delta.shape[0] > p.shape[0] or delta.shape[1:] != p.shape[1:]:
                    raise MechkitError(f"task vector tensor {name} has shape {tuple(delta.shape)}, "
                                       f"the model's {tuple(p.shape)}", "extract the vector from this base model")
        sums: dict[str, torch.Tensor] = {}  # Ψ0 + Σ λ τ in at least float32, rounded into the weight's dtype once
        for tv, lam in terms:
            if lam == 0:
                continue
            for name, delta in tv.deltas.items():
                key = self._name(name)
                if key not in sums:
                    base = self._edits.original(self._params[key])
                    sums[key] = base.to(torch.promote_types(base.dtype, torch.float32), copy=True)
                acc = sums[key]
                acc[:delta.shape[0]] += delta.to(device=acc.device, dtype=torch.float32).to(acc.dtype) * lam
        for name in self._touched:
            p = self._params[name]
            p.data.copy_(sums.get(name, self._edits.original(p)))

    def restore(self) -> None:
        self._edits.restore()
        self._touched.clear()


@contextlib.contextmanager
def arithmetic(handle: ModelHandle) -> Iterator[TaskArithmetic]:
    """A :class:`TaskArithmetic` for the duration of the context (restored on exit, also on error)."""
    ta = TaskArithmetic(handle)
    try:
        yield ta
    finally:
        ta.restore()


@contextlib.contextmanager
def apply(handle: ModelHandle, vector: TaskVector | Sequence[Term], scale: float = 1.0) -> Iterator[ModelHandle]:
    """Ψ0 + scale·τ (or Ψ0 + Σ λ_i τ_i for a list of terms) inside the context; Ψ0 after it."""
    terms = [(vector, scale)] if isinstance(vector, TaskVector) else list(vector)
    with arithmetic(handle) as ta:
        ta.set(*terms)
        yield handle


def save_merged(handle: ModelHandle, vector: TaskVector | Sequence[Term], out_dir: str | Path,
                scale: float = 1.0, force: bool = False) -> Path:
    """Write Ψ0 + scale·τ as a loadable model directory (safetensors, config, tokenizer), atomically.

    ``out_dir`` may be new or an empty directory; a non-empty one is replaced only with ``force``.
    """
    out = check_out(out_dir, force, kind="dir")
    with atomic_dir(out, replace=force or out.is_dir()) as tmp:
        with apply(handle, vector, scale):
            handle.model.save_pretrained(tmp, safe_serialization=True)
        if handle.tokenizer is not None:
            handle.tokenizer.save_pretrained(tmp)
    return out


__all__ = ["TaskArithmetic", "apply", "arithmetic", "save_merged"]
