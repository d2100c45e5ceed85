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
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
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
        self._saved: dict[str, torch.Tensor] = {}

    def _param(self, name: str) -> nn.Parameter:
        if name not in self._params:
            raise MechkitError(f"the task vector names a parameter the model lacks: {name}",
                               "apply a task vector extracted from this model's architecture")
        p = self._params[name]
        if name not in self._saved:
            self._saved[name] = p.detach().clone()
        return p

    @torch.no_grad()
    def set(self, *terms: Term) -> None:
        """Weights := Ψ0 + Σ λ τ over ``(vector, λ)`` terms; parameters no term touches go back to Ψ0."""
        for name in {n for tv, _ in terms for n in tv.deltas}:
            self._param(name)
        for name, original in self._saved.items():
            self._params[name].data.copy_(original)
        for tv, lam in terms:
            if lam == 0:
                continue
            for name, delta in tv.deltas.items():
                p = self._params[name]
                if delta.shape[0] > p.shape[0] or delta.shape[1:] != p.shape[1:]:
                    raise MechkitError(f"task vector tensor {name} has shape {tuple(delta.shape)}, "
                                       f"the model's {tuple(p.shape)}", "extract the vector from this base model")
                target = p.data[:delta.shape[0]]  # fewer rows: a truncated embedding delta
                target.add_((delta.to(device=p.device, dtype=torch.float32) * lam).to(p.dtype))

    @torch.no_grad()
    def restore(self) -> None:
        for name, original in self._saved.items():
            self._params[name].data.copy_(original)
        self._saved.clear()


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
    """Write Ψ0 + scale·τ as a loadable model directory (safetensors, config, tokenizer), atomically."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not force:
        raise MechkitError(f"{out} already exists and is not empty", "pass --force or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is not
    try:
        with apply(handle, vector, scale):
            handle.model.save_pretrained(tmp, safe_serialization=True)
        if handle.tokenizer is not None:
            handle.tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


__all__ = ["TaskArithmetic", "apply", "arithmetic", "save_merged"]
