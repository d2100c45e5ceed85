"""``TaskVector``: a weight difference ΔΨ = Ψ*_T − Ψ0, tensor by tensor, and its algebra.

**Key naming.** A task vector maps HuggingFace parameter names, exactly as
``model.named_parameters()`` yields them (tied duplicates removed, so a tied ``lm_head.weight`` is
absent and its delta lives under ``model.embed_tokens.weight``), to float32 deltas of the same shape.
These are the names ``save_pretrained`` writes into ``model.safetensors``. An embedding delta may
hold fewer rows than the model's matrix (``embeddings="truncate"``): it then edits the first rows.

**Semantics.** ``a + b`` adds tensor-wise (a name missing on one side counts as zero); ``-a``,
``λ * a`` and ``a - b`` follow; ``analogy(a, b, c) = c + b − a`` ("a is to b as c is to ?",
τ_D ≈ τ_C + τ_B − τ_A); ``scaled({"model.layers.1*": 0.5, "layers:0-3": 0})`` multiplies the
tensors whose names match a glob (or whose layer index lies in a range) by λ, first rule wins;
``low_rank`` and ``sparsify`` are the seeds' Corollaries 1–2. Every result is a new vector whose
metadata lists the operations that made it.

>>> import torch
>>> a = TaskVector({"w": torch.ones(2, 2)})
>>> (2 * a - a).deltas["w"].sum().item()
4.0
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mechkit.errors import MechkitError
from mechkit.io import atomic_file, check_out, write_atomic
from mechkit.taskarith.compress import low_rank, sparsify

SCHEMA = "mechkit.taskvector/v1"
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The transformer-block index in a parameter name (``model.layers.7.mlp…`` → 7), else None."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def _rule_matches(rule: str, name: str) -> bool:
    if rule.startswith("layers:"):
        lo, _, hi = rule.removeprefix("layers:").partition("-")
        layer = layer_of(name)
        return layer is not None and int(lo) <= layer <= int(hi or lo)
    return fnmatch.fnmatchcase(name, rule)


@dataclass
class TaskVector:
    """Named float32 deltas plus JSON metadata (base model, tasks, recipe, operations)."""

    deltas: dict[str, torch.Tensor]
    meta: dict = field(default_factory=dict)

    # ---- algebra ------------------------------------------------------------------------------
    def derive(self, deltas: dict[str, torch.Tensor], op: str, *others: TaskVector) -> TaskVector:
        """A new vector of ``deltas`` whose metadata records ``op`` after this one's (and ``others``' tasks)."""
        tasks = list(dict.fromkeys([*self.meta.get("tasks", []), *(t for o in others for t in o.meta.get("tasks", []))]))
        meta = {**self.meta, "tasks": tasks, "ops": [*self.meta.get("ops", []), op]}
        return TaskVector(deltas, meta)

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor], op: str) -> TaskVector:
        """A new vector with ``fn(name, delta)`` applied to every tensor."""
        return self.derive({k: fn(k, v) for k, v in self.deltas.items()}, op)

    def __add__(self, other: TaskVector) -> TaskVector:
        if not isinstance(other, TaskVector):
            return NotImplemented
        out = {k: v.clone() for k, v in self.deltas.items()}
        for k, v in other.deltas.items():
            if k not in out:
                out[k] = v.clone()
            elif out[k].shape == v.shape:
                out[k] += v
            else:
                raise MechkitError(f"task vectors disagree on the shape of {k}: {tuple(out[k].shape)} vs {tuple(v.shape)}",
                                   "extract both from the same base model with the same --embeddings choice")
        return self.derive(out, "add", other)

    def __neg__(self) -> TaskVector:
        return self.map(lambda _, v: -v, "negate")

    def __sub__(self, other: TaskVector) -> TaskVector:
        return self + (-other)

    def __mul__(self, scale: float) -> TaskVector:
        if not isinstance(scale, (int, float)):
            return NotImplemented
        return self.map(lambda _, v: v * float(scale), f"scale {float(scale):g}")

    __rmul__ = __mul__

    def scaled(self, rules: Mapping[str, float], default: float = 1.0) -> TaskVector:
        """Per-module / per-layer λ: each tensor gets the λ of the first matching rule, else ``default``.

        Rules are globs on parameter names (``"*.mlp.*"``) or layer ranges (``"layers:10-19"``).
        """
        def scale(name: str, v: torch.Tensor) -> torch.Tensor:
            lam = next((float(lam) for rule, lam in rules.items() if _rule_matches(rule, name)), default)
            return v * lam

        return self.map(scale, f"scaled {dict(rules)} default {default:g}")

    def filter(self, rules: list[str]) -> TaskVector:
        """Only the tensors whose names match one of the globs / layer ranges."""
        kept = {k: v.clone() for k, v in self.deltas.items() if any(_rule_matches(r, k) for r in rules)}
        return self.derive(kept, f"filter {rules}")

    def low_rank(self, rank: int | None = None, energy: float | None = None) -> TaskVector:
        """Truncated SVD of every 2-D delta; see :func:`mechkit.taskarith.compress.low_rank`."""
        return low_rank(self, rank=rank, energy=energy)

    def sparsify(self, density: float, scope: str = "global") -> TaskVector:
        """Top ``density`` fraction by magnitude; see :func:`mechkit.taskarith.compress.sparsify`."""
        return sparsify(self, density, scope)

    # ---- measures -----------------------------------------------------------------------------
    def numel(self) -> int:
        return sum(v.numel() for v in self.deltas.values())

    def nonzero(self) -> int:
        return sum(int(torch.count_nonzero(v)) for v in self.deltas.values())

    def norm(self) -> float:
        return float(sum(v.double().pow(2).sum() for v in self.deltas.values()) ** 0.5)

    def dot(self, other: TaskVector) -> float:
        common = [k for k in self.deltas if k in other.deltas and self.deltas[k].shape == other.deltas[k].shape]
        return float(sum((self.deltas[k].double() * other.deltas[k].double()).sum() for k in common))

    def cosine(self, other: TaskVector) -> float:
        """cos(τ_a, τ_b) over the whole flattened vectors: the weight-space estimate of task correlation α."""
        denom = self.norm() * other.norm()
        return self.dot(other) / denom if denom > 0 else 0.0

    # ---- storage ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write ``path`` (safetensors, metadata JSON in its header) and ``path.json`` for people, each
        atomically: a reader sees the old file or the new one, never a mix."""
        from safetensors.torch import save_file

        path = check_out(path, force=True, kind="file")
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**self.meta, "schema": SCHEMA, "n_tensors": len(self.deltas), "numel": self.numel()}
        with atomic_file(path) as tmp:
            save_file({k: v.contiguous() for k, v in self.deltas.items()}, str(tmp),
                      metadata={"mechkit": json.dumps(meta, default=str)})
        write_atomic(path.with_name(path.name + ".json"), json.dumps(meta, indent=2, default=str) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TaskVector:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise MechkitError(f"task vector not found: {path}", "extract one with `mechkit taskvec extract`")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("mechkit", "{}"))
                deltas = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        except Exception as err:
            raise MechkitError(f"cannot read task vector {path}: {str(err).splitlines()[0][:160]}",
                               "the file may be truncated — extract it again") from err
        if meta.get("schema") != SCHEMA:
            raise MechkitError(f"{path} is not a mechkit task vector (no {SCHEMA} header)",
                               "pass a file written by `mechkit taskvec extract` or `merge`, not model weights")
        return cls(deltas, meta)

    def summary(self) -> dict:
        """What ``mechkit taskvec info`` prints."""
        layers = sorted({layer_of(k) for k in self.deltas} - {None})
        return {"tasks": self.meta.get("tasks", []), "tensors": len(self.deltas), "numel": self.numel(),
                "nonzero": self.nonzero(), "norm": round(self.norm(), 6),
                "layers": f"{layers[0]}-{layers[-1]}" if layers else "-", "ops": self.meta.get("ops", []),
                "base": self.meta.get("base", {}), "recipe": self.meta.get("recipe")}


def analogy(a: TaskVector, b: TaskVector, c: TaskVector) -> TaskVector:
    """τ_D ≈ τ_C + τ_B − τ_A: "A is to B as C is to D" (Ilharco et al.'s task analogies)."""
    out = c + b - a
    out.meta["ops"] = [*c.meta.get("ops", []), "analogy c + b - a"]
    return out


__all__ = ["SCHEMA", "TaskVector", "analogy", "layer_of"]
