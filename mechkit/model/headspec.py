"""Heads and the one ``--heads`` parser shared by every plugin, the CLI and the Python API.

Spec grammar (comma-separated items, 0-based)::

    17.3,18.6        explicit heads (layer.head)
    layer:17         every head of layer 17
    induction        top-k heads by induction score (also previous-token, duplicate-token)
    random           k random heads (seeded)
"""

from __future__ import annotations

import random as _random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mechkit.errors import HeadSpecError

SCORE_KINDS = ("induction", "previous-token", "duplicate-token")
_PAIR = re.compile(r"^(\d+)\.(\d+)$")
_LAYER = re.compile(r"^layer:(\d+)$")
_FIX = "use induction, previous-token, duplicate-token, random, layer:L, or layer.head pairs like 17.3,18.6"


@dataclass(frozen=True, order=True)
class Head:
    """One attention head; ``str(head)`` is its stable name ``"17.3"``."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def name(self) -> str:
        return str(self)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "head": self.head}

    @classmethod
    def from_dict(cls, d: Mapping) -> Head:
        return cls(int(d["layer"]), int(d["head"]))


def all_heads(n_layers: int, n_heads: int) -> list[Head]:
    return [Head(layer, h) for layer in range(n_layers) for h in range(n_heads)]


def top_heads(scores: Sequence[Sequence[float]], k: int) -> list[Head]:
    """The ``k`` highest-scoring heads of a ``[layer][head]`` score grid, best first."""
    flat = [(float(s), Head(layer, h)) for layer, row in enumerate(scores) for h, s in enumerate(row)]
    flat.sort(key=lambda item: (-item[0], item[1]))
    return [head for _, head in flat[:k]]


def random_heads(n_layers: int, n_heads: int, k: int, seed: int = 0, exclude: Sequence[Head] = ()) -> list[Head]:
    """``k`` distinct random heads, never one of ``exclude`` (the baseline for a targeted ablation)."""
    excluded = set(exclude)
    pool = [h for h in all_heads(n_layers, n_heads) if h not in excluded]
    if k > len(pool):
        raise HeadSpecError(f"cannot draw {k} random heads: only {len(pool)} remain after exclusions",
                            "lower --top-k")
    return sorted(_random.Random(seed).sample(pool, k))


def parse_heads(
    spec: str | Sequence[Head] | Sequence[tuple[int, int]],
    n_layers: int,
    n_heads: int,
    *,
    scores: Mapping[str, Sequence[Sequence[float]]] | None = None,
    top_k: int = 10,
    seed: int = 0,
    exclude: Sequence[Head] = (),
) -> list[Head]:
    """Resolve a head spec to a sorted, de-duplicated list of heads.

    ``scores`` maps a score kind (``induction`` …) to a ``[layer][head]`` grid; score-ranked
    specs need it. Raises :class:`HeadSpecError` with one line naming the problem and the fix.

    >>> parse_heads("1.2,layer:0", n_layers=2, n_heads=3)
    [Head(layer=0, head=0), Head(layer=0, head=1), Head(layer=0, head=2), Head(layer=1, head=2)]
    """
    if not isinstance(spec, str):
        try:
            heads = [h if isinstance(h, Head) else Head(*(int(x) for x in h)) for h in spec]
        except (TypeError, ValueError):
            raise HeadSpecError(f"a head spec must be text or (layer, head) pairs, not {spec!r}", _FIX) from None
        return _validated(heads, n_layers, n_heads)
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise HeadSpecError("empty head spec", _FIX)
    heads: list[Head] = []
    for item in items:
        heads.extend(_parse_item(item, n_layers, n_heads, scores, top_k, seed, exclude))
    return _validated(heads, n_layers, n_heads)


def check_spec_syntax(spec: str) -> str:
    """``spec`` unchanged once every item is well formed; ranges need the model and are checked later.

    Lets a command refuse ``--heads a.b`` before the model loads.

    >>> check_spec_syntax("induction, 17.3")
    'induction, 17.3'
    >>> try:
    ...     check_spec_syntax("layer:-1")
    ... except HeadSpecError as err:
    ...     print(err.problem)
    malformed head spec 'layer:-1'
    """
    items = [item.strip() for item in str(spec).split(",") if item.strip()]
    if not items:
        raise HeadSpecError("empty head spec", _FIX)
    for item in items:
        if not (_PAIR.match(item) or _LAYER.match(item) or item == "random" or item in SCORE_KINDS):
            raise HeadSpecError(f"malformed head spec {item!r}", _FIX)
    return spec


def needs_scores(spec: str) -> bool:
    """Whether a spec ranks heads by a score (so the caller must supply or compute scores)."""
    return any(item.strip() in SCORE_KINDS for item in spec.split(","))


def _parse_item(item, n_layers, n_heads, scores, top_k, seed, exclude) -> list[Head]:
    if m := _PAIR.match(item):
        return [Head(int(m[1]), int(m[2]))]
    if m := _LAYER.match(item):
        layer = int(m[1])
        if layer >= n_layers:
            raise HeadSpecError(f"layer {layer} in {item!r} is out of range: the model has {n_layers} layers "
                                f"(0–{n_layers - 1})", "pick a layer in that range")
        return [Head(layer, h) for h in range(n_heads)]
    if item == "random":
        if top_k < 1:
            raise HeadSpecError(f"--top-k must be at least 1, got {top_k}", "pass --top-k K with K >= 1")
        return random_heads(n_layers, n_heads, top_k, seed, exclude)
    if item in SCORE_KINDS:
        if not scores or item not in scores:
            raise HeadSpecError(f"the {item!r} head spec needs {item} scores",
                                "run `mechkit detect` first and pass --from REPORT, or let the plugin compute them")
        return top_heads(scores[item], top_k)
    raise HeadSpecError(f"malformed head spec {item!r}", _FIX)


def _validated(heads: list[Head], n_layers: int, n_heads: int) -> list[Head]:
    for h in heads:
        if not (0 <= h.layer < n_layers and 0 <= h.head < n_heads):
            raise HeadSpecError(
                f"head {h} is out of range: the model has {n_layers} layers (0–{n_layers - 1}) "
                f"and {n_heads} heads per layer (0–{n_heads - 1})",
                "pick heads inside that range",
            )
    return sorted(set(heads))


def heads_by_layer(heads: Sequence[Head]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for h in heads:
        out.setdefault(h.layer, []).append(h.head)
    return out
