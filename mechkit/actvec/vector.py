"""The saved activation vector: one safetensors file, its metadata JSON in the header.

Writing refuses a vector or scale holding NaN or inf (one line naming the file); reading checks the
file's metadata is a JSON object of the right types and its vector finite floating point.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.actvec.edits import ResidEdit
from mechkit.errors import MechkitError, first_line
from mechkit.io import non_finite

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

METHODS = ("task-vector", "function-vector")
_IDENTITY = ("model_config_sha256", "model_dtype", "model_tokenizer_sha256")  # recorded where known
# metadata key -> the JSON types it may hold (bool is refused where a number is meant, below)
_META_TYPES: dict[str, tuple[type, ...]] = {"method": (str,), "task": (str,), "layer": (int,), "mode": (str,),
                                            "model_sha256": (str,), "model_config_sha256": (str,),
                                            "model_dtype": (str,), "model_tokenizer_sha256": (str,),
                                            "heads": (list,), "info": (dict,),
                                            "scale": (int, float), "span": (int,)}


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
    model_config_sha256: str = ""  # the config it was extracted under: same weights, other config, other activations
    model_dtype: str = ""  # the dtype the weights were hashed in: another dtype hashes the same weights differently
    model_tokenizer_sha256: str = ""  # the tokenizer its prompts were encoded with: other ids, other activations

    def __repr__(self) -> str:
        """Method, task, layer, shape, norm and scale in a few lines — never the vector itself.

        >>> import torch
        >>> print(repr(ActivationVector(torch.ones(2, 4), "task-vector", "antonym", 1, "replace")))
        ActivationVector task-vector for antonym: [2, 4] float32, layer 1 (replace), norm 2 at that layer, scale 1
        """
        norm = float(self.at().float().norm())
        span = f", span {self.span}" if self.span != 1 else ""
        heads = f", {len(self.heads)} heads" if self.heads else ""
        lines = [f"ActivationVector {self.method} for {self.task}: {list(self.vector.shape)} "
                 f"{str(self.vector.dtype).removeprefix('torch.')}, layer {self.layer} ({self.mode}), "
                 f"norm {norm:.4g} at that layer, scale {self.scale:g}{span}{heads}"]
        if self.model_sha256:
            lines.append(f"  model sha256 {self.model_sha256[:12]}…")
        return "\n".join(lines)

    __str__ = __repr__

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
                "info": self.info, **{k: getattr(self, k) for k in _IDENTITY if getattr(self, k)}}

    def to_bytes(self, name: str | Path | None = None) -> bytes:
        """The safetensors file as bytes; the metadata is JSON under the header key ``mechkit``.

        A vector, scale or metadata number that is NaN or inf is refused (``name``: the file it is for,
        named in the message)."""
        from safetensors.torch import save

        where = name if name is not None else f"the {self.method} of {self.task}"
        vector = self.vector.detach().float().cpu().contiguous()
        bad = (non_finite({"vector": vector}) or (None, None))[1]
        if bad is not None:
            raise MechkitError(f"refusing to write {where}: tensor vector holds {bad} values",
                               "the extraction produced NaN/inf activations — check the model's weights")
        try:
            header = json.dumps(self.metadata(), sort_keys=True, allow_nan=False)
        except ValueError:
            raise MechkitError(f"refusing to write {where}: its scale or metadata holds NaN or inf",
                               "use a finite scale") from None
        return save({"vector": vector}, metadata={"mechkit": header})

    def save(self, path: str | Path) -> Path:
        """Write ``path`` atomically: a temporary file in the same directory, then renamed over it
        (an interrupted save leaves the previous file, and no temporary file, behind). A model's file or
        one of another run's set is never replaced (:func:`mechkit.io.replace.refuse_foreign_file`)."""
        from mechkit.io.atomic import file_path
        from mechkit.io.locked_write import write_locked
        from mechkit.io.replace import refuse_foreign_file

        path = file_path(path)  # bytes or `x/`: decoded or refused before anything reads it
        refuse_foreign_file(path, "the activation vector")  # before the bytes are made
        return write_locked(path, self.to_bytes(path), "the activation vector")

    @classmethod
    def load(cls, path: str | Path, handle: ModelHandle | None = None) -> ActivationVector:
        """Read a saved vector; with ``handle``, check that it fits that model."""
        from safetensors import safe_open

        from mechkit.io.runfile import settled_file

        path, found = settled_file(path, "ActivationVector.load", "the activation vector",
                                   'ActivationVector.load("v.safetensors")')  # checked, its run rolled back first
        if not found:
            what = "is not a regular file (a FIFO, device or folder)" if Path(path).exists() else "does not exist"
            raise MechkitError(f"the vector file {path} {what}", "pass a .safetensors file written by icl-vectors")
        fix = "pass a file saved by icl-vectors"
        not_ours = MechkitError(f"{path} is not a mechkit activation vector", fix)
        try:
            with safe_open(str(path), framework="pt") as f:
                raw = (f.metadata() or {}).get("mechkit")
                if raw is None or "vector" not in f.keys():  # noqa: SIM118 - no __iter__
                    raise not_ours
                vector = f.get_tensor("vector")
        except MechkitError:
            raise
        except Exception as err:
            raise MechkitError(f"cannot read activation vector {path}: {first_line(err, 160)}",
                               "the file may be truncated or not safetensors — save it again with icl-vectors") from err
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise MechkitError(f"{path}: its mechkit metadata is not valid JSON ({first_line(err, 80)})", fix) from None
        if not isinstance(meta, dict):
            raise MechkitError(f"{path}: its mechkit metadata is a JSON {type(meta).__name__}, not an object", fix)
        known = {f.name for f in dataclasses.fields(cls)} - {"vector"}
        odd = sorted(set(meta) - known) + sorted({"method", "task", "layer", "mode"} - set(meta))
        if odd:
            raise MechkitError(f"{path} is not a mechkit activation vector (metadata keys {', '.join(odd)} "
                               "unexpected or missing)", fix)
        for key, value in meta.items():
            types = _META_TYPES[key]
            if not isinstance(value, types) or isinstance(value, bool) or \
                    (isinstance(value, float) and not math.isfinite(value)):
                want = "a finite number" if float in types else {int: "an integer", str: "a string", list: "a list",
                                                                   dict: "an object"}[types[0]]
                raise MechkitError(f"{path}: metadata {key!r} must be {want}, not {value!r}"[:300], fix)
        if not vector.is_floating_point():
            raise MechkitError(f"{path}: its vector is {str(vector.dtype).removeprefix('torch.')}, not floating point",
                               fix)
        bad = (non_finite({"vector": vector}) or (None, None))[1]
        if bad is not None:
            raise MechkitError(f"{path}: its vector holds {bad} values", "extract it again with icl-vectors")
        vec = cls(vector=vector, **meta)
        if handle is not None:
            vec.check(handle)
            if not vec.model_sha256:  # a file that does not say whose activations it holds fits any model's shape
                raise MechkitError(f"{path} does not record the model it was extracted from (no model_sha256)",
                                   "extract it again on this model with `mechkit icl-vectors`")
        return vec

    def refuse_other_use(self, tasks: list[str] | None, method: str) -> None:
        """One line where this loaded vector is asked to stand for other tasks or another method: it was
        evaluated on the tasks given and saved as their vector, or silently evaluated as what it is."""
        from mechkit.tasks import parse_tasks

        own = parse_tasks(self.task)
        if tasks is not None and list(tasks) != own:
            raise MechkitError(f"--tasks {','.join(tasks)}: the loaded vector is {','.join(own)}'s, and it would be "
                               "reported and saved as the vector of the tasks given",
                               "drop --tasks (the vector's task is used), or extract a vector for those tasks with "
                               f"`mechkit icl-vectors --tasks {','.join(tasks)}`")
        if method not in ("both", self.method):
            raise MechkitError(f"--method {method}: the loaded vector is a {self.method}, and it is evaluated as what "
                               "it is", f"drop --method, or load a {method} saved by icl-vectors")

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
        a = handle.anatomy
        for head in self.heads:  # drawn on the report's head grid: one outside it failed after the evaluation
            layer, index = (head.get("layer"), head.get("head")) if isinstance(head, dict) else (None, None)
            if not (type(layer) is int and type(index) is int and 0 <= layer < n_layers
                    and 0 <= index < a.heads_in(layer)):
                raise MechkitError(f"the vector's heads list {head!r}, which is no head of this model "
                                   f"({n_layers} layers of {a.n_heads} heads)", "use a vector made for this model")
        if self.vector.dim() not in (1, 2) or (self.vector.dim() == 2 and self.vector.shape[0] != n_layers):
            raise MechkitError(f"vector shape {list(self.vector.shape)} is neither [d_model] nor "
                               f"[{n_layers} layers, d_model]", "use a vector extracted from this model")
        if self.vector.shape[-1] != handle.anatomy.d_model:
            raise MechkitError(f"vector width {self.vector.shape[-1]} does not match d_model "
                               f"{handle.anatomy.d_model}", "use a vector extracted from this model")
        dtype = str(handle.dtype).removeprefix("torch.")
        if self.model_sha256 and self.model_dtype and self.model_dtype != dtype:  # the hashes cannot be compared
            raise MechkitError(f"the vector was extracted from the model in {self.model_dtype}, and this one is "
                               f"loaded in {dtype}: its weights' hash cannot tell whether they are the same",
                               f"load the model in {self.model_dtype} (--dtype {self.model_dtype}, "
                               f"dtype=\"{self.model_dtype}\"), or extract the vector again in {dtype}")
        if self.model_sha256 and self.model_sha256 != handle.weights_sha256():
            raise MechkitError("the vector was extracted from other model weights (sha256 differs)",
                               "extract it again on this model with `mechkit icl-vectors`")
        from mechkit.model.checks.identity import config_sha256, tokenizer_sha256

        if self.model_tokenizer_sha256 and handle.tokenizer is not None and \
                self.model_tokenizer_sha256 != tokenizer_sha256(handle.tokenizer):
            raise MechkitError("the vector was extracted with another tokenizer (other ids or settings, such as "
                               "padding_side: other activations)", "use the tokenizer it was extracted with, or "
                               "extract it again on this model with `mechkit icl-vectors`")

        if self.model_config_sha256 and self.model_config_sha256 != config_sha256(handle.model):
            raise MechkitError("the vector was extracted from these weights under another config.json (another "
                               "architecture, norm epsilon or rope setting: other activations)",
                               "extract it again on this model with `mechkit icl-vectors`")
