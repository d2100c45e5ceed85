"""Low-rank and sparse task vectors (the seeds' Corollaries 1–2).

``low_rank`` replaces every 2-D delta by its truncated SVD, keeping either a fixed ``rank`` or the
smallest rank whose singular values hold an ``energy`` fraction of the squared Frobenius norm;
1-D deltas (norm weights, biases) are kept whole. ``sparsify`` keeps the ``density`` fraction of
entries with the largest magnitude, either over the whole vector (``scope="global"``) or within
each tensor (``scope="tensor"``), and zeroes the rest (no rescaling: that is DARE's business).
A vector holding NaN or inf (a scale that overflowed) is refused: its SVD or ranking would be noise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

from mechkit.errors import MechkitError
from mechkit.taskarith.checks import non_finite


class Deltas(Protocol):
    """What compression reads of a :class:`mechkit.taskarith.vector.TaskVector`: its deltas, its metadata,
    and how it makes a new vector. Named by its shape, since the vector's own methods call this module."""

    deltas: dict[str, torch.Tensor]
    meta: dict

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor], op: str) -> Deltas: ...

    def derive(self, deltas: dict[str, torch.Tensor], op: str, *others: Deltas) -> Deltas: ...


TaskVector = TypeVar("TaskVector", bound=Deltas)  # what goes in comes out: a TaskVector gives a TaskVector


def rank_for_energy(singular: torch.Tensor, energy: float) -> int:
    """Smallest r with Σ_{i<r} s_i² ≥ energy · Σ s_i² (at least 1)."""
    power = singular.double().pow(2)
    total = float(power.sum())
    if total == 0.0:
        return 1
    cum = torch.cumsum(power, 0) / total
    return int(torch.searchsorted(cum, torch.tensor(energy - 1e-12, dtype=cum.dtype)).item()) + 1


def truncated_svd(delta: torch.Tensor, rank: int | None = None, energy: float | None = None) -> tuple[torch.Tensor, int]:
    """The best rank-r approximation of a matrix (Eckart–Young) and the r used."""
    u, s, vh = torch.linalg.svd(delta.float(), full_matrices=False)
    r = min(rank, len(s)) if rank is not None else rank_for_energy(s, energy)
    return (u[:, :r] * s[:r]) @ vh[:r], r


def _refuse_non_finite(tv: TaskVector, what: str) -> None:
    bad = non_finite(tv.deltas)
    if bad is not None:
        raise MechkitError(f"cannot {what} a task vector whose tensor {bad[0]} holds {bad[1]} values",
                           "lower the scales or λ that overflowed, or recompute the vector")


def low_rank(tv: TaskVector, rank: int | None = None, energy: float | None = None) -> TaskVector:
    """Each 2-D delta by its truncated SVD (pass exactly one of ``rank`` ≥ 1, ``energy`` in (0, 1])."""
    if (rank is None) == (energy is None):
        raise MechkitError("low-rank needs exactly one of rank or energy", "pass --rank 8 or --energy 0.9")
    if rank is not None and rank < 1 or energy is not None and not 0 < energy <= 1:
        raise MechkitError("rank must be >= 1 and energy in (0, 1]", "pass e.g. --rank 8 or --energy 0.9")
    _refuse_non_finite(tv, "compress")
    ranks = {}

    def approx(name: str, v: torch.Tensor) -> torch.Tensor:
        if v.ndim != 2:
            return v.clone()
        out, ranks[name] = truncated_svd(v, rank, energy)
        return out.to(v.dtype)

    label = f"rank {rank}" if rank is not None else f"energy {energy:g}"
    out = tv.map(approx, f"low_rank {label}")
    out.meta["ranks"] = ranks
    return out


def _keep_top(v: torch.Tensor, k: int) -> torch.Tensor:
    if k >= v.numel():
        return v.clone()
    if k <= 0:
        return torch.zeros_like(v)
    flat = v.flatten()
    idx = torch.topk(flat.abs(), k, sorted=False).indices
    out = torch.zeros_like(flat)
    out[idx] = flat[idx]
    return out.view_as(v)


def sparsify(tv: TaskVector, density: float, scope: str = "global") -> TaskVector:
    """Keep the top ``density`` fraction of entries by magnitude (exactly ``round(density · n)`` of them)."""
    if not 0 < density <= 1:
        raise MechkitError(f"density must be in (0, 1], got {density}: 0 keeps no entry (an all-zero vector)",
                           "pass e.g. --sparsity-density 0.1")
    _refuse_non_finite(tv, "sparsify")
    if scope == "tensor":
        return tv.map(lambda _, v: _keep_top(v, round(density * v.numel())), f"sparsify {density:g} per tensor")
    if scope != "global":
        raise MechkitError(f"unknown sparsify scope {scope!r}", "use global or tensor")
    names = list(tv.deltas)
    flat = torch.cat([tv.deltas[n].flatten() for n in names])
    kept = _keep_top(flat, round(density * flat.numel()))
    out, start = {}, 0
    for n in names:
        size = tv.deltas[n].numel()
        out[n] = kept[start:start + size].view_as(tv.deltas[n])
        start += size
    return tv.derive(out, f"sparsify {density:g} global")


__all__ = ["low_rank", "rank_for_energy", "sparsify", "truncated_svd"]
