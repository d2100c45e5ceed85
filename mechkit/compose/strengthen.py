"""Strengthening the components composition needs, against the same treatment of random ones.

Two treatments of a set of heads (the seeds' §6.2: "identify and strengthen key components
responsible for compositional understanding"):

- ``scale``: every selected head's output (``blocks.L.attn.hook_z``) multiplied by α at every
  position (:func:`scale_heads`); α = 1 is the identity, bit for bit.
- ``vector``: each selected head's mean output at the last token of *composite-in-context* prompts
  (the gold standard, where the model does compose) projected through its slice of the attention
  output projection, times β, added to the residual stream after that head's layer at the last
  token (:func:`head_vector_edits`, applied with :func:`mechkit.actvec.score_edited`): a
  composition "function vector" written where each head writes.

The strength (α or β) is chosen on dev prompts (:func:`choose_strength`: best accuracy, then best
answer log-prob, then the smaller strength) and the chosen treatment is scored on held-out prompts.
The baseline is the same procedure — strength chosen on the same dev prompts — for random head sets
of the same size that share no head with the selected set (:func:`random_draws`), several draws.

>>> import mechkit as mk
>>> from mechkit.heads import Head
>>> m = mk.load_model("tiny:llama")
>>> ids = m.to_tokens("input: cat\\noutput:")
>>> with scale_heads(m, [Head(0, 1)], 1.0):
...     same = m(ids)
>>> bool((same == m(ids)).all())
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.actvec import ResidEdit, head_contributions
from mechkit.errors import MechkitError
from mechkit.heads import Head, random_heads
from mechkit.hooking.core import hooks
from mechkit.model.headspec import heads_by_layer

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

__all__ = ["TREATMENTS", "choose_strength", "head_vector_edits", "random_draws", "scale_heads"]

TREATMENTS = ("scale", "vector")


@contextlib.contextmanager
def scale_heads(handle: ModelHandle, heads: Sequence[Head], alpha: float) -> Iterator[None]:
    """Multiply the listed heads' outputs by ``alpha`` at every position while the context is open."""
    def scaler(idx: torch.Tensor):
        def fn(z, _point):
            z = z.clone()
            z[:, :, idx.to(z.device)] *= alpha
            return z

        return fn

    fns = {f"blocks.{layer}.attn.hook_z": scaler(torch.tensor(hs, dtype=torch.long))
           for layer, hs in heads_by_layer(list(heads)).items()}
    with hooks(handle, fns):
        yield


def head_vector_edits(handle: ModelHandle, means: torch.Tensor, heads: Sequence[Head],
                      beta: float) -> list[ResidEdit]:
    """``beta`` × each head's projected mean output (``means``: :func:`mechkit.actvec.mean_head_outputs`),
    added after the head's own layer at the last token; heads of one layer share one edit."""
    contrib = head_contributions(handle, means)
    by_layer: dict[int, torch.Tensor] = {}
    for h in heads:
        by_layer[h.layer] = by_layer.get(h.layer, 0) + contrib[h.layer, h.head]
    return [ResidEdit(layer, beta * v, "add") for layer, v in sorted(by_layer.items())]


def random_draws(n_layers: int, n_heads: int | Sequence[int], k: int, draws: int, seed: int,
                 exclude: Sequence[Head]) -> list[list[Head]]:
    """``draws`` random sets of ``k`` heads, each disjoint from ``exclude`` (the selected heads).

    >>> sets = random_draws(4, 4, k=3, draws=2, seed=0, exclude=[Head(0, 0), Head(1, 1)])
    >>> [len(s) for s in sets], any(Head(0, 0) in s or Head(1, 1) in s for s in sets)
    ([3, 3], False)
    """
    return [random_heads(n_layers, n_heads, k, seed * 1000 + i, exclude=exclude) for i in range(draws)]


def choose_strength(scores: dict[float, tuple[float, float]]) -> float:
    """The strength with the best ``(accuracy, log-prob)`` on dev, the smaller one on a tie.

    >>> choose_strength({1.5: (0.25, -2.0), 2.0: (0.25, -1.5), 3.0: (0.0, -1.0)})
    2.0
    """
    if not scores:
        raise MechkitError("no strengths to choose from", "pass a grid such as 1.5,2,3")
    return max(scores, key=lambda s: (scores[s][0], scores[s][1], -s))

