"""Merging several task vectors into one: task arithmetic, TIES, DARE and DARE-TIES.

Definitions (per tensor, vectors τ_1…τ_n with weights w_i, all 1 by default):

- ``task_arithmetic``: Σ_i w_i τ_i (Ilharco et al.).
- ``ties`` (Yadav et al.): *trim* each τ_i to its top ``density`` fraction of entries by magnitude
  (within the tensor); *elect* the sign per entry as the sign of the summed weighted mass
  Σ_i w_i τ̂_i; *disjoint mean*: average w_i τ̂_i over the vectors whose kept entry agrees with the
  elected sign (entries where none agree stay 0). ``normalize="weights"`` divides by the agreeing
  weights' sum instead of their count (mergekit's convention; identical when all weights are 1).
- ``dare`` (Yu et al.): drop each entry of τ_i independently with probability ``p`` and rescale the
  survivors by exactly 1/(1−p), then Σ_i w_i τ̃_i; the masks are seeded per (seed, vector, tensor).
- ``dare_ties``: DARE's drop-and-rescale in place of TIES' magnitude trim, then sign election and
  disjoint mean.

The merged vector is multiplied by ``scale`` (TIES' λ) and can be applied like any task vector.
Weights, ``scale``, ``density`` and ``p`` must be finite, and the vectors must share their base
model (:func:`~mechkit.taskarith.vector.check_compatible`): a merge never mixes two models.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from mechkit.errors import MechkitError
from mechkit.taskarith.checks import finite_number
from mechkit.taskarith.vector import TaskVector, check_compatible

METHODS = ("task_arithmetic", "ties", "dare", "dare_ties")


def trim(v: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the ``round(density · n)`` entries of largest magnitude, zero the rest."""
    k = round(density * v.numel())
    if k >= v.numel():
        return v.clone()
    out = torch.zeros_like(v).flatten()
    if k > 0:
        flat = v.flatten()
        idx = torch.topk(flat.abs(), k, sorted=False).indices
        out[idx] = flat[idx]
    return out.view_as(v)


def dare_drop(v: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Bernoulli(1−p) keep mask, survivors rescaled by 1/(1−p) so the expectation is unchanged."""
    if p == 0:
        return v.clone()
    keep = torch.rand(v.shape, generator=generator) >= p
    return torch.where(keep, v / (1.0 - p), torch.zeros_like(v))


def _generator(seed: int, index: int, name: str) -> torch.Generator:
    """Independent of the order tensors are visited in, so a merge is reproducible piecewise."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}|{index}|{name}".encode()))


def sign_consensus(stack: torch.Tensor, normalize: str = "count", weights: torch.Tensor | None = None) -> torch.Tensor:
    """TIES' elect + disjoint mean over the first dimension of ``stack`` (already weighted)."""
    elected = torch.sign(stack.sum(0))
    agree = (torch.sign(stack) == elected) & (stack != 0)
    total = (stack * agree).sum(0)
    if normalize == "weights" and weights is not None:
        denom = (agree * weights.view(-1, *([1] * (stack.ndim - 1))).abs()).sum(0)
    else:
        denom = agree.sum(0).to(stack.dtype)
    return torch.where(denom > 0, total / denom.clamp_min(1e-12), torch.zeros_like(total))


def example_weights(n: int) -> str:
    """A ``--weights`` value with one weight per vector, for a fix to name (``0.7,0.3`` named two to one).

    >>> example_weights(1), example_weights(2), example_weights(3)
    ('1', '0.7,0.3', '0.4,0.3,0.3')
    """
    return {1: "1", 2: "0.7,0.3"}.get(n, ",".join(["0.4"] + ["0.3"] * (n - 1)))


def _check(vectors: Sequence[TaskVector], weights: Sequence[float] | None, method: str) -> list[float]:
    if method not in METHODS:
        raise MechkitError(f"unknown merge method {method!r}", f"use one of: {', '.join(METHODS)}")
    if not vectors:
        raise MechkitError("nothing to merge", "pass at least one task vector")
    example = f"--weights {example_weights(len(vectors))}"
    weights = [1.0] * len(vectors) if weights is None else \
        [finite_number(w, f"merge weight {i + 1}", example) for i, w in enumerate(weights)]
    if len(weights) != len(vectors):
        raise MechkitError(f"{len(weights)} weights for {len(vectors)} task vectors",
                           f"pass one weight per vector, e.g. {example}")
    check_compatible(vectors)
    return weights


def merge(vectors: Sequence[TaskVector], method: str = "task_arithmetic", weights: Sequence[float] | None = None,
          density: float = 1.0, p: float = 0.0, seed: int = 0, scale: float = 1.0,
          normalize: str = "count") -> TaskVector:
    """Merge task vectors with one of :data:`METHODS` (see the module docstring for the definitions).

    >>> import torch
    >>> a, b = TaskVector({"w": torch.tensor([1.0, -2.0])}), TaskVector({"w": torch.tensor([3.0, 1.0])})
    >>> merge([a, b], "ties").deltas["w"].tolist()
    [2.0, -2.0]
    """
    weights = _check(vectors, weights, method)
    scale = finite_number(scale, "the merge scale", "--scale 1.0")
    if not 0 < density <= 1 or not 0 <= p < 1:
        why = "density 0 keeps no entry" if not 0 < density <= 1 else "p 1 drops every entry"
        raise MechkitError(f"density must be in (0, 1] and p in [0, 1), got density {density:g} and p {p:g} "
                           f"({why})", "pass e.g. --density 0.2 or --p 0.9")
    if all(w == 0 for w in weights):
        raise MechkitError("every merge weight is 0: the merge would be an all-zero vector",
                           f"give at least one vector a non-zero weight, e.g. --weights {example_weights(len(weights))}")
    names = list(dict.fromkeys(k for v in vectors for k in v.deltas))
    w = torch.tensor(weights)
    out = {}
    for name in names:
        parts = []
        for i, tv in enumerate(vectors):
            delta = tv.deltas.get(name)
            delta = torch.zeros_like(next(v.deltas[name] for v in vectors if name in v.deltas)) if delta is None else delta
            if method == "ties":
                delta = trim(delta, density)
            elif method in ("dare", "dare_ties"):
                delta = dare_drop(delta, p, _generator(seed, i, name))
            parts.append(delta * weights[i])
        stack = torch.stack(parts)
        merged = stack.sum(0) if method in ("task_arithmetic", "dare") else sign_consensus(stack, normalize, w)
        out[name] = merged * scale
    meta = {"tasks": list(dict.fromkeys(t for v in vectors for t in v.meta.get("tasks", []))),
            "base": next((v.meta["base"] for v in vectors if v.meta.get("base")), {}),
            "ops": [f"merge {method} weights={weights} density={density:g} p={p:g} seed={seed} scale={scale:g}"],
            "sources": [v.meta.get("source") for v in vectors]}
    return TaskVector(out, meta)


__all__ = ["METHODS", "dare_drop", "merge", "sign_consensus", "trim"]
