"""Activation-space task vectors (Hendel et al., 2023, "In-Context Learning Creates Task Vectors").

Run demonstrations plus a dummy query; the residual stream at the last prompt token after block L,
averaged over contexts and dummy queries, is the task vector θ_L. Replacing that position's
residual stream in a *zero-shot* query with θ_L at the right layer makes the model do the task
without demonstrations. :func:`icl_task_vectors` extracts θ for every layer at once.

The same last-token machinery serves function vectors (:mod:`mechkit.functionvectors`, which are
*added* rather than substituted): :class:`ResidEdit` says what to write where, and
:func:`score_edited` scores prompts under many edits in padded batches — every row has its own
last prompt position, so a 30-layer sweep is one batched pass over (layer, prompt) rows.
:class:`ActivationVector` is a saved, reusable vector (safetensors, metadata in the header).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.hooking.core import hooks
from mechkit.scoring import (
    TaskScore,
    encode_rows,
    greedy_writes,
    maybe_other_spelling,
    pad_id,
    score_batch,
    supports_logits_to_keep,
)
from mechkit.tasks import build_prompts

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

METHODS = ("task-vector", "function-vector")


def pad_right(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and each row's last real position."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r))
        mask[i, :len(r)] = 1
    return ids, mask, mask.sum(dim=1) - 1


def prompt_ids(handle: ModelHandle, prompts: Sequence) -> list[list[int]]:
    return [handle.tokenizer(p.text)["input_ids"] for p in prompts]


def last_logits_only(handle: ModelHandle) -> dict:
    """Forward kwargs that unembed one position only (the extraction hooks read activations, the
    logits are thrown away), where the model supports ``logits_to_keep``."""
    return {"logits_to_keep": 1} if supports_logits_to_keep(handle.model) else {}


def icl_task_vectors(handle: ModelHandle, task: str, n_contexts: int = 16, shots: int = 10, seed: int = 0,
                     batch_size: int = 8, prompts: Sequence | None = None) -> torch.Tensor:
    """``[n_layers, d_model]``: mean residual stream after each block at the last token of
    demonstrations + a dummy query (the query's own answer is never shown).

    Each prompt has its own demonstrations and dummy query, so the mean runs over both. Pass
    ``prompts`` to use your own contexts instead of ``build_prompts(task, n_contexts, shots, seed)``.
    """
    prompts = build_prompts(task, n=n_contexts, shots=shots, seed=seed) if prompts is None else prompts
    a = handle.anatomy
    total = torch.zeros(a.n_layers, a.d_model, dtype=torch.float64)
    encoded = prompt_ids(handle, prompts)
    keep = last_logits_only(handle)
    for start in range(0, len(encoded), batch_size):
        ids, mask, last = pad_right(encoded[start:start + batch_size], pad_id(handle.tokenizer))
        rows = torch.arange(len(ids))
        taken: dict[int, torch.Tensor] = {}

        def take(x, point, taken=taken, rows=rows, last=last):
            taken[point.layer] = x[rows, last.to(x.device)].detach().double().cpu()

        with torch.no_grad(), hooks(handle, {"blocks.*.hook_resid_post": take}):
            handle(ids.to(handle.device), attention_mask=mask.to(handle.device), **keep)
        for layer, values in taken.items():
            total[layer] += values.sum(0)
    return (total / len(encoded)).float()


@dataclass(frozen=True)
class ResidEdit:
    """Write ``vector`` into the residual stream after block ``layer`` at a prompt's last token.

    ``mode="replace"`` substitutes it (task vectors), ``mode="add"`` adds it (function vectors).
    """

    layer: int
    vector: torch.Tensor = field(repr=False)
    mode: str = "replace"

    def __post_init__(self) -> None:
        if self.mode not in ("replace", "add"):
            raise MechkitError(f"unknown edit mode {self.mode!r}", "use mode='replace' or mode='add'")


Edits = ResidEdit | Sequence[ResidEdit] | None


def _as_tuple(edit: Edits) -> tuple[ResidEdit, ...]:
    if edit is None:
        return ()
    return (edit,) if isinstance(edit, ResidEdit) else tuple(edit)


class _Plan:
    """Which rows of the forward now running get which edits, at which position."""

    def __init__(self) -> None:
        self.by_layer: dict[int, list[tuple[int, int, ResidEdit]]] = {}

    def set(self, rows: Sequence[tuple[int, tuple[ResidEdit, ...]]]) -> None:
        """``rows``: per batch row, its last prompt position and its edits."""
        self.by_layer = {}
        for i, (position, edits) in enumerate(rows):
            for e in edits:
                self.by_layer.setdefault(e.layer, []).append((i, position, e))

    def hook(self, x: torch.Tensor, point) -> torch.Tensor | None:
        todo = [(i, pos, e) for i, pos, e in self.by_layer.get(point.layer, ()) if pos < x.shape[1]]
        if not todo:  # cached decoding steps (one new token) hold no prompt position
            return None
        x = x.clone()
        for i, pos, e in todo:
            v = e.vector.to(x)
            x[i, pos] = v if e.mode == "replace" else x[i, pos] + v
        return x


def _layers(edits: Sequence[tuple[ResidEdit, ...]]) -> list[int]:
    return sorted({e.layer for es in edits for e in es})


def score_edited(handle: ModelHandle, prompts: Sequence, edits: Sequence[Edits],
                 batch_size: int = 16) -> list[TaskScore]:
    """Exact-match scores of ``prompts`` under each entry of ``edits`` (``None`` = unedited).

    Every (edit, prompt) pair is one row; rows are sorted by length and batched whatever their
    edit, and each row is edited at its own last prompt position. Accuracy is that of
    :func:`mechkit.score_prompts` (including its greedy check of other spellings).
    """
    edits = [_as_tuple(e) for e in edits]
    tok, plan = handle.tokenizer, _Plan()
    base = encode_rows(tok, prompts, None)
    rows = [(k, r) for k in range(len(edits)) for r in base]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][1].ids))
    results: dict[int, tuple[bool, float]] = {}
    layer_hooks = {f"blocks.{L}.hook_resid_post": plan.hook for L in _layers(edits)}
    with torch.no_grad(), hooks(handle, layer_hooks):
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            plan.set([(rows[i][1].answer_start - 1, edits[rows[i][0]]) for i in idx])
            scored = score_batch(handle, [rows[i][1] for i in idx], pad_id(tok))
            for i, (ok, logprob, first, pred, _diff) in zip(idx, scored, strict=True):
                k, row = rows[i]
                if not ok and maybe_other_spelling(tok, row, first, pred):
                    plan.set([(row.answer_start - 1, edits[k])])
                    ok = greedy_writes(handle, row)
                results[i] = (ok, logprob)
    return [_aggregate(prompts, [(rows[i][1], results[i]) for i in range(len(rows)) if rows[i][0] == k])
            for k in range(len(edits))]


def _aggregate(prompts: Sequence, scored: list) -> TaskScore:
    correct = [False] * len(prompts)
    logprobs = [float("-inf")] * len(prompts)
    for row, (ok, lp) in scored:
        correct[row.prompt_index] |= ok
        logprobs[row.prompt_index] = max(logprobs[row.prompt_index], lp)
    n = max(len(prompts), 1)
    return TaskScore(sum(correct) / n, sum(logprobs) / n, correct, logprobs)


def patch_last_token(layer: int, position: int, vector: torch.Tensor) -> dict[str, Callable]:
    """A hook map replacing the residual stream after block ``layer`` at ``position`` with ``vector``.

    Forwards too short to contain ``position`` (cached decoding steps) are left alone.
    """
    def patch(x, _point):
        if x.shape[1] <= position:
            return None
        x = x.clone()
        x[:, position] = vector.to(x)
        return x

    return {f"blocks.{layer}.hook_resid_post": patch}


def patched_accuracy(handle: ModelHandle, prompts: Sequence, vectors: torch.Tensor,
                     layers: Sequence[int] | None = None, mode: str = "replace",
                     batch_size: int = 16) -> dict[int, float]:
    """Exact-match accuracy of ``prompts`` with ``vectors[L]`` written at each prompt's last token,
    per layer L (one batched pass over every layer)."""
    layers = list(range(handle.anatomy.n_layers) if layers is None else layers)
    vecs = vectors if vectors.dim() == 2 else vectors.expand(handle.anatomy.n_layers, -1)
    scores = score_edited(handle, prompts, [ResidEdit(L, vecs[L], mode) for L in layers], batch_size)
    return {L: s.accuracy for L, s in zip(layers, scores, strict=True)}


def choose_layer(curve: dict[int, float], logprobs: dict[int, float] | None = None) -> int:
    """The best layer of a dev curve: highest accuracy, then highest log-prob, then the earliest."""
    def key(L: int) -> tuple:
        return (curve[L], (logprobs or {}).get(L, 0.0), -L)

    return max(curve, key=key)


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
        path = Path(path)
        data = self.to_bytes()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

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


@contextlib.contextmanager
def apply_vector(handle: ModelHandle, vector: ActivationVector | Edits, layer: int | None = None,
                 scale: float | None = None) -> Iterator[None]:
    """Apply a vector at the last position of every multi-token forward inside the context.

    ``vector`` is a saved :class:`ActivationVector` (at ``layer`` × ``scale``, default its chosen
    layer, scale and span) or one or more :class:`ResidEdit`. That position is the prompt's last
    token for an unpadded prompt and for the prefill of ``generate`` (later one-token decoding steps
    are left alone). Padded batches: use :func:`score_edited`, which edits each row at its own position.
    """
    edits = vector.edits(layer, scale) if isinstance(vector, ActivationVector) else _as_tuple(vector)
    by_layer: dict[int, list[ResidEdit]] = {}
    for e in edits:
        by_layer.setdefault(e.layer, []).append(e)

    def fn(x, point):
        if x.shape[1] < 2:
            return None
        x = x.clone()
        for e in by_layer[point.layer]:
            v = e.vector.to(x)
            x[:, -1] = v if e.mode == "replace" else x[:, -1] + v
        return x

    with hooks(handle, {f"blocks.{L}.hook_resid_post": fn for L in by_layer}):
        yield
