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

**Checks.** Vectors of different base models are never combined: ``+`` (and so ``-``, ``analogy``,
expressions and merges) refuses two vectors whose recorded bases differ (see
:func:`mechkit.taskarith.checks.base_mismatch`), or whose tensors of one name differ in shape.
Scales and λ must be finite numbers; :meth:`TaskVector.save` refuses NaN or inf deltas and
:meth:`TaskVector.load` checks the file it reads (metadata types, tensor names, dtypes, finiteness).

>>> import torch
>>> a = TaskVector({"w": torch.ones(2, 2)})
>>> (2 * a - a).deltas["w"].sum().item()
4.0
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import struct
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mechkit.errors import MechkitError, first_line
from mechkit.io import atomic_file, check_out, write_atomic
from mechkit.taskarith.checks import base_label, base_mismatch, finite_number, non_finite, refuse_non_finite
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
    """Named float32 deltas plus JSON metadata (base model, tasks, recipe, operations).

    ``path`` is the file the vector was loaded from (named in error messages; not saved).
    """

    deltas: dict[str, torch.Tensor]
    meta: dict = field(default_factory=dict)
    path: Path | None = field(default=None, repr=False, compare=False)

    # ---- algebra ------------------------------------------------------------------------------
    def derive(self, deltas: dict[str, torch.Tensor], op: str, *others: TaskVector) -> TaskVector:
        """A new vector of ``deltas`` whose metadata records ``op`` after this one's (and ``others``' tasks).

        The base is this vector's, or the first of ``others``' when this one records none.
        """
        tasks = list(dict.fromkeys([*self.meta.get("tasks", []), *(t for o in others for t in o.meta.get("tasks", []))]))
        meta = {**self.meta, "tasks": tasks, "ops": [*self.meta.get("ops", []), op]}
        base = next((v.meta["base"] for v in (self, *others) if v.meta.get("base")), None)
        if base is not None:
            meta["base"] = base
        return TaskVector(deltas, meta)

    def __repr__(self) -> str:
        """What it is in a few lines: tasks, base, tensor count, parameters, norm, the operations that made
        it, its file — never the tensors (``deltas`` holds them).

        >>> import torch
        >>> print(repr(TaskVector({"w": torch.ones(2, 2), "b": torch.zeros(2)}, {"tasks": ["capitalize"]})))
        TaskVector of capitalize: 2 tensors, 6 params, norm 2
        """
        from mechkit.model.handle import count

        norm = float(sum(float(v.float().pow(2).sum()) for v in self.deltas.values())) ** 0.5
        tasks = ", ".join(map(str, self.meta.get("tasks") or [])) or "no named task"
        base = self.meta.get("base")
        label = base_label(base) if isinstance(base, Mapping) and base else None
        lines = [f"TaskVector of {tasks}" + (f" (base {label})" if label else "")
                 + f": {len(self.deltas)} tensor{'s' if len(self.deltas) != 1 else ''}, "
                 f"{count(sum(v.numel() for v in self.deltas.values()))} params, norm {norm:.4g}"]
        ops = [str(op) for op in self.meta.get("ops") or []]
        if ops:
            lines.append("  ops: " + textwrap.shorten(", ".join(ops), 200, placeholder=" …"))
        if self.path is not None:
            lines.append(f"  file: {self.path}")
        return "\n".join(lines)

    __str__ = __repr__

    def describe(self) -> str:
        """How messages name this vector: its file, else its tasks."""
        if self.path is not None:
            return str(self.path)
        tasks = self.meta.get("tasks") or []
        return f"the vector of {', '.join(map(str, tasks))}" if tasks else "a task vector"

    def map(self, fn: Callable[[str, torch.Tensor], torch.Tensor], op: str) -> TaskVector:
        """A new vector with ``fn(name, delta)`` applied to every tensor."""
        return self.derive({k: fn(k, v) for k, v in self.deltas.items()}, op)

    def __add__(self, other: TaskVector) -> TaskVector:
        if not isinstance(other, TaskVector):
            return NotImplemented
        check_compatible([self, other])
        out = {k: v.clone() for k, v in self.deltas.items()}
        for k, v in other.deltas.items():
            if k in out:
                out[k] += v
            else:
                out[k] = v.clone()
        return self.derive(out, "add", other)

    def __neg__(self) -> TaskVector:
        return self.map(lambda _, v: -v, "negate")

    def __sub__(self, other: TaskVector) -> TaskVector:
        return self + (-other)

    def __mul__(self, scale: float) -> TaskVector:
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            return NotImplemented
        scale = finite_number(scale, "the scale of a task vector", "a scale such as 0.5 or -1")
        return self.map(lambda _, v: v * scale, f"scale {scale:g}")

    __rmul__ = __mul__

    def scaled(self, rules: Mapping[str, float], default: float = 1.0) -> TaskVector:
        """Per-module / per-layer λ: each tensor gets the λ of the first matching rule, else ``default``.

        Rules are globs on parameter names (``"*.mlp.*"``) or layer ranges (``"layers:10-19"``).
        """
        default = finite_number(default, "the default λ", "default=1.0")
        rules = {rule: finite_number(lam, f"λ for {rule!r}", f'{{"{rule}": 0.5}}') for rule, lam in rules.items()}

        def scale(name: str, v: torch.Tensor) -> torch.Tensor:
            lam = next((lam for rule, lam in rules.items() if _rule_matches(rule, name)), default)
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
    def save(self, path: str | Path, force: bool = True, inputs: tuple[str | Path, ...] = ()) -> Path:
        """Write ``path`` (safetensors, metadata JSON in its header) and ``path.json`` for people, each
        atomically: a reader sees the old file or the new one, never a mix. The old ``path.json`` goes
        first, so a kill between the two files leaves the ``.json`` missing, never describing another vector. NaN or inf deltas are
        refused before anything is written. With ``force=False`` an existing ``path`` is refused, checked
        again under the file's lock: of two writers started together, the second gets one line instead of
        both exiting 0 with one vector silently lost (:func:`mechkit.io.check_out` names ``inputs``)."""
        from safetensors.torch import save_file

        if not isinstance(force, bool):  # force="no" is truthy: an existing vector was replaced
            raise MechkitError(f"force must be True or False, not {type(force).__name__}", "pass force=False to keep "
                               "an existing file")
        if isinstance(inputs, str | bytes | os.PathLike) or not isinstance(inputs, tuple | list):
            raise MechkitError(f"inputs must be a tuple of paths, not {type(inputs).__name__}",
                               'pass inputs=("base.safetensors",)')  # a str was read letter by letter
        path = check_vector_out(path, force, inputs)
        refuse_non_finite(self.deltas, path, "a scale or λ too large, or a diverged fine-tune: "
                                             "recompute the vector with finite inputs")
        meta = {**self.meta, "schema": SCHEMA, "n_tensors": len(self.deltas), "numel": self.numel()}
        try:
            header = json.dumps(meta, default=str, allow_nan=False)
        except ValueError:
            raise MechkitError(f"refusing to write {path}: its metadata holds NaN or inf numbers",
                               "record finite numbers in the vector's metadata") from None
        from mechkit.io.fs_errors import one_line_errors
        from mechkit.io.outlock import out_lock

        # a full disk is one line, as the CLI gives it; out_lock makes the missing parents and removes them again
        # if the save fails, and two writers of one file never interleave the vector and its .json
        with one_line_errors(), out_lock(path):
            check_vector_out(path, force, inputs)  # again: another may have finished meanwhile
            side = path.with_name(path.name + ".json")
            side.unlink(missing_ok=True)  # killed before the new .json: it is missing, never the old one's
            with atomic_file(path) as tmp:
                save_file({k: v.contiguous() for k, v in self.deltas.items()}, str(tmp), metadata={"mechkit": header})
            write_atomic(side, json.dumps(meta, indent=2, default=str) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TaskVector:
        """Read a vector written by :meth:`save`, checking what it holds: a safetensors header naming
        each tensor once, a metadata JSON object of the right types (``tasks`` and ``ops`` lists of
        strings, ``base`` an object, ``recipe`` an object or null, counts that match the tensors), and
        finite floating-point deltas. Anything else is one line naming the file and the problem."""
        from safetensors import safe_open

        from mechkit.io.runfile import settled_file

        path, found = settled_file(path, "TaskVector.load", "the task vector",
                                   'TaskVector.load("v.safetensors")')  # checked, its run rolled back first
        if not found:
            if os.path.lexists(path):  # a directory, a FIFO, a device or a broken link: there, but no vector
                raise MechkitError(f"{path} is not a regular file, so not a task vector",
                                   "pass the .safetensors file `mechkit taskvec extract` wrote")
            raise MechkitError(f"task vector not found: {path}", "extract one with `mechkit taskvec extract`")
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:  # safetensors opens paths as UTF-8 text
            raise MechkitError(f"the task vector's path {str(path)!r} is not UTF-8, which safetensors cannot open",
                               "rename the file (or its folder) to a UTF-8 name") from None
        header = _check_header(path)
        raw = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
        meta = _parse_meta(path, raw.get("mechkit", "{}"))
        if meta.get("schema") != SCHEMA:
            raise MechkitError(f"{path} is not a mechkit task vector (no {SCHEMA} header)",
                               "pass a file written by `mechkit taskvec extract` or `merge`, not model weights")
        _check_counts(path, meta, _header_shapes(header))  # from the header: a crafted size fails before any read
        try:
            with safe_open(str(path), framework="pt") as f:
                deltas = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        except Exception as err:
            raise MechkitError(f"cannot read task vector {path}: {first_line(err, 160)}",
                               "the file may be truncated — extract it again") from err
        _check_meta(path, meta, deltas)
        return cls(deltas, meta, path=path)

    def summary(self) -> dict:
        """What ``mechkit taskvec info`` prints."""
        layers = sorted({layer_of(k) for k in self.deltas} - {None})
        return {"tasks": self.meta.get("tasks", []), "tensors": len(self.deltas), "numel": self.numel(),
                "nonzero": self.nonzero(), "norm": round(self.norm(), 6),
                "layers": f"{layers[0]}-{layers[-1]}" if layers else "-", "ops": self.meta.get("ops", []),
                "base": {k: v for k, v in (self.meta.get("base") or {}).items() if k != "probe"},  # values: not for people
                "recipe": self.meta.get("recipe")}


def check_vector_out(out: str | Path, force: bool, inputs: tuple = ()) -> Path:
    """Refuse, before the model loads, an --out where the vector cannot go: :func:`~mechkit.io.check_out` for
    the file, and the same for ``OUT.json``, the readable copy of its metadata written beside it. Without
    this a user's ``OUT.json`` was overwritten without --force, and a directory of that name was found only
    after the work, with the vector already written and its .json missing."""
    import os

    from mechkit.io.fs_errors import NAME_MAX, SUFFIX_ROOM, refuse_unencodable
    from mechkit.io.patharg import path_text

    out = path_text(out)  # a PathLike giving bytes decoded, a trailing / kept (check_out refuses it)
    if out is None:
        raise MechkitError("TaskVector.save takes a path (a str or pathlib.Path)", 'pass one, e.g. '
                           'vector.save("v.safetensors")')
    refuse_unencodable(out)  # a lone surrogate: os.fsencode below raised a raw UnicodeEncodeError
    longest = NAME_MAX - SUFFIX_ROOM - len(".json")
    if len(os.fsencode(Path(out).name)) > longest:
        raise MechkitError(f"the file name of --out {str(out)[:40]}… is {len(os.fsencode(Path(out).name))} bytes; with the "
                           f".json mechkit writes beside it and its temporary copies it may be at most {longest}",
                           f"choose a name of at most {longest} bytes")
    path = check_out(out, force, kind="file", inputs=inputs)
    side = path.with_name(path.name + ".json")
    if os.path.lexists(side) and (side.is_dir() or not side.is_file()):
        raise MechkitError(f"{side} is not a regular file, and mechkit writes the vector's metadata there "
                           f"(beside --out {out})", "choose another --out")
    if side.exists() and not force:
        raise MechkitError(f"{side} already exists, and mechkit writes the vector's metadata there (beside "
                           f"--out {out})", "pass --force to overwrite both or choose another --out")
    check_out(Path(side), force=True, kind="file", inputs=inputs)
    from mechkit.io.replace import refuse_foreign_file

    for target in (path, side):  # another writer's model files are never replaced, whatever --force says
        refuse_foreign_file(target, "the task vector")
    return path



_REWRITE = "write it again with `mechkit taskvec extract` or `merge`"


def _check_header(path: Path) -> dict:
    """The safetensors header, naming every tensor once (safetensors itself keeps the last of two)."""
    def pairs(items: list) -> dict:
        seen: dict = {}
        for key, value in items:
            if key in seen:
                raise MechkitError(f"{path}: tensor {key!r} is named twice in the safetensors header",
                                   f"the file was edited or corrupted — {_REWRITE}")
            seen[key] = value
        return seen

    try:
        with open(path, "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            if size > path.stat().st_size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(size), object_pairs_hook=pairs)
    except MechkitError:
        raise
    except (OSError, ValueError, struct.error, RecursionError) as err:
        raise MechkitError(f"cannot read task vector {path}: not safetensors ({first_line(err, 120)})",
                           "the file may be truncated — extract it again") from None
    if not isinstance(header, dict):
        raise MechkitError(f"cannot read task vector {path}: its safetensors header is not an object", _REWRITE)
    return header


def _header_shapes(header: dict) -> dict[str, list]:
    return {k: v.get("shape") for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _check_counts(path: Path, meta: dict, shapes: dict[str, list]) -> None:
    """The metadata's tensor and number counts against what the file holds (``shapes``: name -> shape)."""
    numel = 0
    for shape in shapes.values():
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise MechkitError(f"cannot read task vector {path}: a tensor's shape in its header is not a list of "
                               "sizes", _REWRITE)
        numel += math.prod(shape)
    for key, actual in (("n_tensors", len(shapes)), ("numel", numel)):
        if key in meta and (not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] != actual):
            raise MechkitError(f"{path}: metadata {key!r} is {meta[key]!r} but the file holds {actual}",
                               f"tensors were added, removed or reshaped after writing — {_REWRITE}")


def _parse_meta(path: Path, raw: str) -> dict:
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise MechkitError(f"{path}: its mechkit metadata is not valid JSON ({first_line(err, 80)})",
                           _REWRITE) from None
    if not isinstance(meta, dict):
        raise MechkitError(f"{path}: its mechkit metadata is a JSON {type(meta).__name__}, not an object",
                           _REWRITE)
    return meta


def _check_meta(path: Path, meta: dict, deltas: dict[str, torch.Tensor]) -> None:
    def bad(key: str, want: str) -> MechkitError:
        return MechkitError(f"{path}: metadata {key!r} must be {want}, not {json.dumps(meta[key], default=str)[:60]}",
                            _REWRITE)

    for key in ("tasks", "ops"):
        if key in meta and not (isinstance(meta[key], list) and all(isinstance(x, str) for x in meta[key])):
            raise bad(key, "a list of strings")
    if "base" in meta:
        base = meta["base"]
        if not isinstance(base, dict) or not all(isinstance(base.get(k, ""), str) for k in ("spec", "name", "sha256",
                                                                                            "dtype")) \
                or not isinstance(base.get("architecture", {}), dict):
            raise bad("base", "an object of strings (spec, name, sha256, dtype) and an architecture object")
    if meta.get("recipe") is not None and not isinstance(meta["recipe"], dict):
        raise bad("recipe", "an object or null")
    _check_counts(path, meta, {k: list(v.shape) for k, v in deltas.items()})
    for name, t in deltas.items():
        if not t.is_floating_point():
            raise MechkitError(f"{path}: tensor {name} is {str(t.dtype).removeprefix('torch.')}, not floating point",
                               _REWRITE)
    found = non_finite(deltas)
    if found is not None:
        raise MechkitError(f"{path}: tensor {found[0]} holds {found[1]} values",
                           "the fine-tune diverged or a scale overflowed — recompute the vector")


def check_compatible(vectors: Sequence[TaskVector], shapes: bool = True) -> None:
    """Refuse to combine vectors of different base models, or (``shapes``) whose tensors of one name
    differ in shape.

    >>> a = TaskVector({"w": torch.ones(2)}, {"base": {"spec": "tiny:llama", "sha256": "aa"}})
    >>> b = TaskVector({"w": torch.ones(2)}, {"base": {"spec": "tiny:qwen2", "sha256": "bb"}})
    >>> try:
    ...     check_compatible([a, b])
    ... except MechkitError as err:
    ...     print(err.problem.split(": ", 1)[0])
    task vectors of different base models cannot be combined
    """
    for i, a in enumerate(vectors):
        for b in vectors[i + 1:]:
            reason = base_mismatch(a.meta.get("base"), b.meta.get("base"))
            if reason is not None:
                raise MechkitError(
                    f"task vectors of different base models cannot be combined: {a.describe()} has base "
                    f"{base_label(a.meta['base'])}, {b.describe()} has base {base_label(b.meta['base'])} ({reason})",
                    "extract every vector from the same base model")
    seen: dict[str, tuple[tuple, TaskVector]] = {}
    for tv in vectors if shapes else ():
        for name, v in tv.deltas.items():
            first = seen.setdefault(name, (tuple(v.shape), tv))
            if first[0] != tuple(v.shape):
                raise MechkitError(f"task vectors disagree on the shape of {name}: {first[0]} in "
                                   f"{first[1].describe()}, {tuple(v.shape)} in {tv.describe()}",
                                   "extract both from the same base model with the same --embeddings choice")


def analogy(a: TaskVector, b: TaskVector, c: TaskVector) -> TaskVector:
    """τ_D ≈ τ_C + τ_B − τ_A: "A is to B as C is to D" (Ilharco et al.'s task analogies)."""
    check_compatible([a, b, c])
    out = c + b - a
    out.meta["ops"] = [*c.meta.get("ops", []), "analogy c + b - a"]
    return out


__all__ = ["SCHEMA", "TaskVector", "analogy", "check_compatible", "layer_of"]
