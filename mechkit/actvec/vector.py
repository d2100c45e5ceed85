"""The saved activation vector: one safetensors file, its metadata JSON in the header."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.actvec.edits import ResidEdit
from mechkit.errors import MechkitError
from mechkit.io import write_atomic

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

METHODS = ("task-vector", "function-vector")


@dataclass
class ActivationVector:
    """A saved activation-space vector and how to use it.

    ``vector`` is ``[d_model]`` (function vectors: one vector, added at ``layer``) or
    ``[n_layers, d_model]`` (task vectors: θ_L for every layer; ``layer`` is the chosen one).
    ``scale`` multiplies it when applied (function vectors: chosen on dev with the layer).
    ``span`` K > 1 writes it at the K consecutive layers ``layer .. layer+K-1`` (:meth:`edits`):
    a task vector replaces θ_l at each of them, a function vector adds ``scale × FV / K`` at each,
    so the total added is that of one layer, spread over K.
    """

    vector: torch.Tensor
    method: str
    task: str
    layer: int
    mode: str
    model_sha256: str = ""
    heads: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    scale: float = 1.0
    span: int = 1

    def at(self, layer: int | None = None) -> torch.Tensor:
        layer = self.layer if layer is None else layer
        return self.vector[layer] if self.vector.dim() == 2 else self.vector

    def edit(self, layer: int | None = None, scale: float | None = None) -> ResidEdit:
        """The :class:`ResidEdit` applying this vector at ``layer`` times ``scale`` (default: the
        chosen layer and scale)."""
        layer = self.layer if layer is None else layer
        return ResidEdit(layer, self.at(layer) * (self.scale if scale is None else scale), self.mode)

    def edits(self, layer: int | None = None, scale: float | None = None,
              span: int | None = None) -> tuple[ResidEdit, ...]:
        """The edits applying this vector from ``layer`` over ``span`` consecutive layers (default: the
        chosen layer, scale and span); a function vector's share per layer is ``scale / span``."""
        layer = self.layer if layer is None else layer
        span = self.span if span is None else span
        scale = self.scale if scale is None else scale
        if span < 1:
            raise MechkitError(f"span {span} is not a number of layers", "use a span of 1 or more")
        share = scale / span if self.mode == "add" else scale
        return tuple(ResidEdit(L, self.at(L) * share, self.mode) for L in range(layer, layer + span))

    def metadata(self) -> dict:
        return {"method": self.method, "task": self.task, "layer": self.layer, "mode": self.mode,
                "scale": self.scale, "span": self.span, "model_sha256": self.model_sha256, "heads": self.heads,
                "info": self.info}

    def to_bytes(self) -> bytes:
        """The safetensors file as bytes; the metadata is JSON under the header key ``mechkit``."""
        from safetensors.torch import save

        return save({"vector": self.vector.detach().float().cpu().contiguous()},
                    metadata={"mechkit": json.dumps(self.metadata(), sort_keys=True)})

    def save(self, path: str | Path) -> Path:
        """Write ``path`` atomically: a temporary file in the same directory, then renamed over it
        (an interrupted save leaves the previous file, and no temporary file, behind)."""
        return write_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path, handle: ModelHandle | None = None) -> ActivationVector:
        """Read a saved vector; with ``handle``, check that it fits that model."""
        from safetensors import safe_open

        if not Path(path).is_file():
            raise MechkitError(f"no vector file at {path}", "pass a .safetensors file written by icl-vectors")
        not_ours = MechkitError(f"{path} is not a mechkit activation vector", "pass a file saved by icl-vectors")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("mechkit", "null") or "null")
                if not isinstance(meta, dict) or "vector" not in f.keys():  # noqa: SIM118 - no __iter__
                    raise not_ours
                vector = f.get_tensor("vector")
        except MechkitError:
            raise
        except Exception as err:
            raise MechkitError(f"cannot read activation vector {path}: {str(err).splitlines()[0][:160]}",
                               "the file may be truncated or not safetensors — save it again with icl-vectors") from err
        known = {f.name for f in dataclasses.fields(cls)} - {"vector"}
        odd = sorted(set(meta) - known) + sorted({"method", "task", "layer", "mode"} - set(meta))
        if odd:
            raise MechkitError(f"{path} is not a mechkit activation vector (metadata keys {', '.join(odd)} "
                               "unexpected or missing)", "pass a file saved by icl-vectors")
        vec = cls(vector=vector, **meta)
        if handle is not None:
            vec.check(handle)
        return vec

    def check(self, handle: ModelHandle) -> None:
        """Raise :class:`MechkitError` unless this vector can be applied to ``handle``'s model."""
        n_layers = handle.anatomy.n_layers
        if self.method not in METHODS or self.mode not in ("replace", "add"):
            raise MechkitError(f"unknown vector method {self.method!r} (mode {self.mode!r})",
                               f"use a vector saved by icl-vectors (method one of {', '.join(METHODS)})")
        if not isinstance(self.layer, int) or not isinstance(self.span, int) or self.layer < 0 or self.span < 1:
            raise MechkitError(f"layer {self.layer!r} / span {self.span!r} is not a layer choice",
                               "use a vector with layer >= 0 and span >= 1, as icl-vectors saves them")
        if self.layer + self.span > n_layers:
            raise MechkitError(f"layers {self.layer}..{self.layer + self.span - 1} do not all exist "
                               f"(the model has {n_layers})", "use a vector made for this model")
        if self.vector.dim() not in (1, 2) or (self.vector.dim() == 2 and self.vector.shape[0] != n_layers):
            raise MechkitError(f"vector shape {list(self.vector.shape)} is neither [d_model] nor "
                               f"[{n_layers} layers, d_model]", "use a vector extracted from this model")
        if self.vector.shape[-1] != handle.anatomy.d_model:
            raise MechkitError(f"vector width {self.vector.shape[-1]} does not match d_model "
                               f"{handle.anatomy.d_model}", "use a vector extracted from this model")
        if self.model_sha256 and self.model_sha256 != handle.weights_sha256():
            raise MechkitError("the vector was extracted from other model weights (sha256 differs)",
                               "extract it again on this model with `mechkit icl-vectors`")
