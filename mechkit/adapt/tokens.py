"""Token selection after layer K (FastV-style, training-free): keep the context tokens that matter.

After block ``K`` has run on the whole prompt, every prompt token is ranked by the attention it
receives at layer ``K`` from the *query position* (the prompt's last token, the one that predicts
the answer), averaged over all heads or over chosen heads (e.g. the layer's induction heads); the
blocks above ``K`` then run on the kept tokens only. Always kept: the first ``first`` tokens (the
attention sink), the last ``tail`` prompt tokens (the query line) and everything after the query
position (teacher-forced answer tokens, or tokens generated later). ``keep`` is the fraction of the
other prompt tokens (the context: the demonstrations) that stays.

The selection depends on the prompt only, never on what comes after the query position, so
teacher-forced scoring and greedy decoding with a KV cache see the same kept tokens.

>>> import torch
>>> sel = TokenSelection(layer=0, keep=0.5, first=1, tail=2)
>>> received = torch.tensor([[0.5, 0.1, 0.4, 0.3, 0.2, 0.0, 0.0, 0.0]])
>>> valid = torch.ones(1, 8, dtype=torch.bool)
>>> keep, selected = keep_positions(sel, received, valid, torch.tensor([5]))
>>> keep.tolist()   # the sink, 2 of the 3 context tokens, the tail (query line), the answer
[[0, 2, 3, 4, 5, 6, 7]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mechkit.errors import MechkitError

RANKS = ("last", "heads")


@dataclass(frozen=True)
class TokenSelection:
    """Drop context tokens after block ``layer``: keep ``keep`` of them, ranked by ``rank``.

    ``rank="last"`` averages the attention from the query position over every head of ``layer``;
    ``rank="heads"`` over ``heads`` only (query-head indices of ``layer``, e.g. its induction heads).
    """

    layer: int
    keep: float
    rank: str = "last"
    heads: tuple[int, ...] = field(default=())
    first: int = 1
    tail: int = 8

    def check(self, n_layers: int, n_heads: int) -> None:
        if not 0 <= self.layer < n_layers - 1:
            raise MechkitError(f"token selection after layer {self.layer} is outside 0..{n_layers - 2}",
                               "select tokens after a layer below the last one")
        if not 0 < self.keep <= 1:
            raise MechkitError(f"token keep ratio {self.keep} is outside (0, 1]", "use a fraction like 0.5")
        if self.rank not in RANKS:
            raise MechkitError(f"unknown token rank {self.rank!r}", f"use one of: {', '.join(RANKS)}")
        if self.rank == "heads" and (not self.heads or any(not 0 <= h < n_heads for h in self.heads)):
            raise MechkitError(f"token rank 'heads' needs query heads of layer {self.layer} in 0..{n_heads - 1}",
                               "pass heads=(h, ...) or use rank='last'")
        if self.first < 0 or self.tail < 1:
            raise MechkitError("token selection protects first >= 0 and tail >= 1 tokens", "raise first/tail")

    @property
    def needs_ranking(self) -> bool:
        return self.keep < 1

    def as_dict(self) -> dict:
        return {"layer": self.layer, "keep": self.keep, "rank": self.rank, "heads": list(self.heads),
                "first": self.first, "tail": self.tail}

    @classmethod
    def from_dict(cls, d: dict) -> TokenSelection:
        return cls(int(d["layer"]), float(d["keep"]), d.get("rank", "last"), tuple(d.get("heads", ())),
                   int(d.get("first", 1)), int(d.get("tail", 8)))

    def label(self) -> str:
        how = "" if self.rank == "last" else f" by heads {','.join(map(str, self.heads))}"
        return f"tokens {self.keep:g} after L{self.layer}{how}"


def received_attention(pattern: torch.Tensor, query: torch.Tensor, heads: tuple[int, ...] = ()) -> torch.Tensor:
    """``[b, p]``: attention each key position receives from each row's query position, head-averaged.

    ``pattern`` is ``[b, h, q, k]`` (a layer's full pattern) or ``[b, h, k]`` (the query rows already
    taken)."""
    rows = pattern if pattern.dim() == 3 else pattern[torch.arange(pattern.shape[0]), :, query.to(pattern.device)]
    if heads:
        rows = rows[:, list(heads)]
    return rows.float().mean(dim=1)


def keep_positions(sel: TokenSelection, received: torch.Tensor | None, valid: torch.Tensor,
                   query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``([b, m], [b, m])``: the sorted positions each row keeps, and which of them are selected tokens.

    Every row of a batch keeps the same count ``m``: a row that selects fewer is filled up with
    padding, then with unselected context, and those fillers are masked out as keys (the second
    tensor is False for them), so a row computes the same thing alone or in any batch.
    ``received`` ``[b, p]`` ranks the context (None: keep all, ``sel.keep`` must be 1); ``valid``
    ``[b, p]`` marks real tokens; ``query`` ``[b]`` is each row's query position.
    """
    b, p = valid.shape
    valid = valid.cpu()
    if not sel.needs_ranking:
        return torch.arange(p).expand(b, p).clone(), valid.clone()
    pos = torch.arange(p)
    chosen: list[torch.Tensor] = []
    rest: list[torch.Tensor] = []
    for i in range(b):
        q = int(query[i])
        real = valid[i]
        protected = real & ((pos < sel.first) | (pos > q - sel.tail))
        context = real & ~protected & (pos <= q)
        ctx = pos[context]
        k = math.ceil(sel.keep * len(ctx))
        order = torch.argsort(received[i, ctx.to(received.device)].cpu(), descending=True, stable=True)
        chosen.append(torch.cat([pos[protected], ctx[order[:k]]]))
        rest.append(torch.cat([pos[~real], ctx[order[k:]]]))
    m = max(len(c) for c in chosen)
    keep, selected = [], []
    for c, r in zip(chosen, rest, strict=True):
        row = torch.cat([c, r[:m - len(c)]])
        flag = torch.cat([torch.ones(len(c), dtype=torch.bool), torch.zeros(m - len(c), dtype=torch.bool)])
        order = row.argsort()
        keep.append(row[order])
        selected.append(flag[order])
    return torch.stack(keep), torch.stack(selected)


def kept_share(selected: torch.Tensor, valid: torch.Tensor) -> list[float]:
    """Per row: the share of its real tokens that the selection kept."""
    return (selected.sum(1).float() / valid.cpu().sum(1).clamp(min=1).float()).tolist()


def gather_positions(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` at per-row positions ``index`` ``[b, m]`` along ``dim`` (batch first; a batch of 1 is broadcast)."""
    index = index.to(x.device)
    if x.shape[0] != index.shape[0]:
        x = x.expand(index.shape[0], *x.shape[1:])
    shape = [1] * x.dim()
    shape[0], shape[dim] = index.shape
    idx = index.reshape(shape).expand(*[s if d != dim else index.shape[1] for d, s in enumerate(x.shape)])
    return x.gather(dim, idx)


def scatter_positions(x: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
    """Hidden states ``[b, m, d]`` of kept positions back at their places in ``[b, length, d]`` (zeros
    elsewhere: dropped positions have no output)."""
    full = x.new_zeros(x.shape[0], length, *x.shape[2:])
    idx = index.to(x.device)[..., None].expand(-1, -1, *x.shape[2:])
    return full.scatter(1, idx, x)
