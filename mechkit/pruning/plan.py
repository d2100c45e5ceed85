"""A pruning plan: which units of the dense model go, in dense indices, plus whether to compensate.

The plan is what guides produce and what every consumer reads: :func:`~mechkit.pruning.masking.masked`
runs it as hooks on the dense model (the reference semantics), :func:`~mechkit.pruning.slicing.prune_copy`
makes it physical. Both agree exactly (tested per family).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mechkit.model.edit.surgery import Structure

if TYPE_CHECKING:
    from mechkit.model.anatomy import Anatomy


@dataclass
class UnitsToRemove:
    """Units to remove. ``compensate`` replaces removed units by their calibration mean (FLAP)
    instead of zero: physically, a bias on the output projection."""

    mlp: dict[int, list[int]] = field(default_factory=dict)
    heads: dict[int, list[int]] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)
    compensate: bool = False

    def structure(self, anatomy: Anatomy) -> Structure:
        """The kept units per layer (only layers that change and are not removed)."""
        gone = set(self.layers)
        mlp = {layer: [i for i in range(anatomy.d_mlp) if i not in set(rm)]
               for layer, rm in self.mlp.items() if rm and layer not in gone}
        heads = {layer: [h for h in range(anatomy.n_heads) if h not in set(rm)]
                 for layer, rm in self.heads.items() if rm and layer not in gone}
        return Structure(n_layers=anatomy.n_layers, mlp_keep=mlp, head_keep=heads, layers_removed=sorted(gone))

    def counts(self) -> dict[str, int]:
        gone = set(self.layers)
        return {"mlp_channels": sum(len(v) for k, v in self.mlp.items() if k not in gone),
                "heads": sum(len(v) for k, v in self.heads.items() if k not in gone),
                "layers": len(gone)}

    def as_dict(self) -> dict:
        return {"mlp": {str(k): sorted(v) for k, v in self.mlp.items() if v},
                "heads": {str(k): sorted(v) for k, v in self.heads.items() if v},
                "layers": sorted(self.layers), "compensate": self.compensate, "counts": self.counts()}

    @classmethod
    def from_dict(cls, d: dict) -> UnitsToRemove:
        return cls(mlp={int(k): list(v) for k, v in d.get("mlp", {}).items()},
                   heads={int(k): list(v) for k, v in d.get("heads", {}).items()},
                   layers=list(d.get("layers", [])), compensate=bool(d.get("compensate", False)))

    def merged(self, other: UnitsToRemove) -> UnitsToRemove:
        """Both plans' removals together (e.g. MLP channels from one guide, heads from another)."""
        def union(a: dict, b: dict) -> dict:
            return {k: sorted(set(a.get(k, [])) | set(b.get(k, []))) for k in set(a) | set(b)}

        return UnitsToRemove(union(self.mlp, other.mlp), union(self.heads, other.heads),
                         sorted(set(self.layers) | set(other.layers)), self.compensate or other.compensate)
