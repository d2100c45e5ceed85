"""Shuffle heads' weights among a set of heads (Song, Xu & Zhong's "inside" shuffle).

``component="qk"`` moves the query/key side (what a head attends to); ``"qkov"`` moves the whole
head (query, key, value and its output-projection columns). Head ``dst`` receives the weights
of ``mapping[dst]``. Weights are restored bit-exactly when the context exits.

Grouped-query attention: keys and values belong to a KV head shared by a group of query heads,
so moving them would also change the sibling heads. ``gqa="query"`` (default) moves only the
per-query-head parts (query rows, and for ``qkov`` the output columns), so exactly the selected
heads change; the moved query then meets the destination group's keys. ``gqa="group"`` also
copies the source's KV-group rows into the destination's group, as Song et al.'s code does —
a full transplant, at the price of changing sibling heads too. With plain multi-head attention
(one KV head per query head) both modes are the same full transplant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.interventions.weights import WeightEdits, edit_weights
from mechkit.model.headspec import Head, check_heads

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

COMPONENTS = {"qk": ("q", "k"), "qkov": ("q", "k", "v", "o")}


def permutation(heads: Sequence[Head], seed: int) -> dict[Head, Head]:
    """A seeded permutation of ``heads`` that moves at least one head (when there are two or more)."""
    heads = list(heads)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(100):
        order = torch.randperm(len(heads), generator=gen).tolist()
        if len(heads) < 2 or order != list(range(len(heads))):
            break
    return {dst: heads[src] for dst, src in zip(heads, order, strict=True)}


def _slots(handle: ModelHandle, head: Head, part: str, gqa: str) -> list[tuple[torch.nn.Module, slice, bool]]:
    """(module, slice, is_column) for one part of one head."""
    a = handle.anatomy
    if part == "o":
        d = a.head_size(head.layer)
        return [(a.attn_out(head.layer), slice(head.head * d, (head.head + 1) * d), True)]
    if part in ("k", "v") and gqa == "query" and any(a.groups_in(layer) > 1 for layer in range(a.n_layers)):
        return []  # grouped-query attention: a query head has no key/value of its own
    index = head.head if part == "q" else a.kv_head(head.head, head.layer)
    module, rows = a.head_rows(head.layer, part, index)
    return [(module, rows, False)]


def _read(edits: WeightEdits, module, rows: slice, column: bool) -> list[torch.Tensor]:
    w = edits.weight_out_in(module)
    parts = [(w[:, rows] if column else w[rows]).clone()]
    if not column and getattr(module, "bias", None) is not None:
        parts.append(edits.param(module, "bias")[rows].clone())
    return parts


def _write(edits: WeightEdits, module, rows: slice, column: bool, parts: list[torch.Tensor]) -> None:
    w = edits.weight_out_in(module)  # the source may live on another device (or offloaded): meet this one
    if column:
        w[:, rows] = parts[0].to(w)
    else:
        w[rows] = parts[0].to(w)
        if len(parts) > 1:
            bias = edits.param(module, "bias")
            bias[rows] = parts[1].to(bias)


@contextlib.contextmanager
def shuffle_heads(
    handle: ModelHandle, mapping: dict[Head, Head], component: str = "qk", gqa: str = "query"
) -> Iterator[dict[Head, Head]]:
    """Give each head ``dst`` the ``component`` weights of ``mapping[dst]`` for the context's duration."""
    if component not in COMPONENTS:
        raise MechkitError(f"unknown shuffle component {component!r}", "use qk or qkov")
    if gqa not in ("query", "group"):
        raise MechkitError(f"unknown GQA shuffle mode {gqa!r}", "use query or group")
    check_heads(handle.anatomy, [*mapping, *mapping.values()])
    with edit_weights(handle) as edits, torch.no_grad():
        sources = {}
        for src in set(mapping.values()):
            for part in COMPONENTS[component]:
                for module, rows, column in _slots(handle, src, part, gqa):
                    sources[(src, part)] = _read(edits, module, rows, column)
        for dst, src in mapping.items():
            for part in COMPONENTS[component]:
                for module, rows, column in _slots(handle, dst, part, gqa):
                    _write(edits, module, rows, column, sources[(src, part)])
        yield mapping
