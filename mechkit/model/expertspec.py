"""Experts of a mixture-of-experts model, named like heads: ``layer.eN``.

Spec grammar (comma-separated items, 0-based)::

    1.e2,3.e0        explicit experts (layer.e<expert>): expert 2 of layer 1, expert 0 of layer 3
    *.e5             expert 5 of every routed layer

The ``e`` keeps an expert apart from a head (``1.2`` is head 2 of layer 1 in a ``--heads`` spec), so the
two grammars never read each other's items.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.errors import HeadSpecError

if TYPE_CHECKING:
    from mechkit.model.anatomy import Anatomy

_ITEM = re.compile(r"^(\d+|\*)\.e(\d+)$")
_FIX = "name experts as layer.e<expert>, e.g. 1.e2,3.e0 (or *.e5 for every routed layer)"


@dataclass(frozen=True, order=True)
class Expert:
    """One expert of one MoE layer; ``str(expert)`` is its stable name ``"1.e2"``."""

    layer: int
    expert: int

    def __str__(self) -> str:
        return f"{self.layer}.e{self.expert}"


def parse_experts(spec: str | Sequence[Expert] | Sequence[tuple[int, int]], anatomy: Anatomy) -> list[Expert]:
    """Resolve an expert spec on a model to sorted, de-duplicated experts, each in a routed layer and range.

    Raises :class:`~mechkit.errors.HeadSpecError` (one line, with the fix) for a malformed item, a model
    without experts, a layer without a router (a leading dense layer) or an expert out of range.
    """
    if not anatomy.is_moe or not anatomy.expert_routing:
        raise HeadSpecError("this model has no expert bank mechkit can route (not a mixture of experts, or one "
                            "whose bank is called on pre-routed tokens)", "ablate heads instead (heads=...)")
    routed = [layer for layer in range(anatomy.n_layers) if anatomy.router(layer) is not None]
    experts: list[Expert] = []
    if isinstance(spec, str):
        items = [item.strip() for item in spec.split(",") if item.strip()]
        if not items:
            raise HeadSpecError("empty expert spec", _FIX)
        for item in items:
            m = _ITEM.match(item)
            if not m:
                raise HeadSpecError(f"malformed expert spec {item!r}", _FIX)
            layers = routed if m[1] == "*" else [int(m[1])]
            experts.extend(Expert(layer, int(m[2])) for layer in layers)
    else:
        experts = [e if isinstance(e, Expert) else Expert(*(int(x) for x in e)) for e in spec]
    for e in experts:
        if e.layer not in routed or not 0 <= e.expert < anatomy.n_experts:
            raise HeadSpecError(f"expert {e} is out of range: the routed layers are {routed} and each has "
                                f"{anatomy.n_experts} experts (0–{anatomy.n_experts - 1})",
                                "pick experts inside that range")
    return sorted(set(experts))


def experts_by_layer(experts: Sequence[Expert]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for e in experts:
        out.setdefault(e.layer, []).append(e.expert)
    return out
