"""Writing a vector into the residual stream at each prompt's last token, and scoring under it.

:class:`ResidEdit` says what to write where (``replace`` for task vectors, ``add`` for function
vectors); :func:`score_edited` scores prompts under many edits in padded batches — every row has
its own last prompt position, so a 30-layer sweep is one batched pass over (layer, prompt) rows;
:func:`apply_vector` applies a vector around any forward or ``generate`` call.

>>> import torch, mechkit as mk
>>> from mechkit.actvec import ResidEdit, score_edited
>>> m = mk.load_model("tiny:llama")
>>> prompts = mk.build_prompts("capitalize", n=2, shots=0)
>>> edit = ResidEdit(layer=1, vector=torch.zeros(m.anatomy.d_model), mode="add")
>>> plain, edited = score_edited(m, prompts, [None, edit])
>>> plain.logprob == edited.logprob          # adding zero changes nothing
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mechkit.errors import MechkitError
from mechkit.eval.scoring import TaskScore, aggregate, encode_rows, score_rows
from mechkit.hooking.core import hooks
from mechkit.hooking.traced import pure
from mechkit.model.backends.whitelist import plain

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


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


class SavedVector(Protocol):
    """A vector that knows its own edits: a :class:`mechkit.actvec.vector.ActivationVector`. Named by its
    shape, since the vector builds :class:`ResidEdit` from this module."""

    def edits(self, layer: int | None = None, scale: float | None = None) -> tuple[ResidEdit, ...]: ...


def _as_tuple(edit: Edits) -> tuple[ResidEdit, ...]:
    if edit is None:
        return ()
    return (edit,) if isinstance(edit, ResidEdit) else tuple(edit)


class _RowEdits:
    """Which rows of the forward now running get which edits, at which position. Its hook is shipped by
    value on a remote model: no function here names a dataclass (nnsight ships the globals a function's
    source names, annotations included), and the edits it holds are plain data."""

    by_layer: dict[int, list[tuple[int, int, Any]]]  # layer -> (row, position, edit as plain data)

    def __init__(self) -> None:
        self.by_layer = {}

    def set(self, rows: Sequence[tuple[int, tuple[ResidEdit, ...]]]) -> None:
        """``rows``: per batch row, its last prompt position and its edits."""
        self.by_layer = {}
        for i, (position, edits) in enumerate(rows):
            for e in edits:  # the edit as plain data: the hook is shipped by value on a remote model
                self.by_layer.setdefault(e.layer, []).append((i, position, plain(e)))

    @pure  # only a replacement: on a remote model the residual stream stays on the server
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
    plan = _RowEdits()
    base = encode_rows(handle.tokenizer, prompts, None)
    rows = [(k, r) for k in range(len(edits)) for r in base]

    def prepare(idx: list[int]) -> None:
        plan.set([(rows[i][1].answer_start - 1, edits[rows[i][0]]) for i in idx])

    with hooks(handle, {f"blocks.{L}.hook_resid_post": plan.hook for L in _layers(edits)}):
        scored, _ = score_rows(handle, [r for _, r in rows], batch_size, prepare)
    per = len(base)
    return [aggregate(len(prompts), base, scored[k * per:(k + 1) * per]) for k in range(len(edits))]


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


@contextlib.contextmanager
def apply_vector(handle: ModelHandle, vector: SavedVector | Edits, layer: int | None = None,
                 scale: float | None = None) -> Iterator[None]:
    """Apply a vector at the last position of every multi-token forward inside the context.

    ``vector`` is a saved :class:`ActivationVector` (at ``layer`` × ``scale``, default its chosen
    layer, scale and span) or one or more :class:`ResidEdit`. That position is the prompt's last
    token for an unpadded prompt and for the prefill of ``generate`` (later one-token decoding steps
    are left alone). Padded batches: use :func:`score_edited`, which edits each row at its own position.
    """
    edits = vector.edits(layer, scale) if hasattr(vector, "edits") else _as_tuple(vector)
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
