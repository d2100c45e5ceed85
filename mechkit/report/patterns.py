"""Attention patterns for a page: recorded on one sequence, quantized to a byte each, base64 in the HTML.

A report page must stay one small file that opens offline, yet a click on a head should show where
it attends. Storing float32 patterns as JSON numbers would cost ~10 bytes per weight; this stores one.

**Encoding** (``mechkit.patterns/v1``), for ``T`` tokens and the recorded heads in order:

- causal heads put no weight above the diagonal, so only the lower triangle is kept: query row
  ``t`` holds its ``t + 1`` weights on keys ``0..t`` (``T(T+1)/2`` values per head);
- each row is scaled by its own maximum ``m`` and rounded to a byte, ``q = round(255 · p / m)``, so the
  top source of every query keeps the byte 255 exactly and a diffuse row keeps its relative detail;
- ``m`` itself is stored per row as a little-endian uint16, ``round(65535 · m)``;
- ``data`` and ``row_max`` are those bytes, head-major then row-major, base64-encoded.

Decoding is ``p = q / 255 · M / 65535``; the error is at most ``m/510 + 1/131070 < 0.002`` per weight.
On the embedded model's detect page (270 heads, 51 tokens) that is 386 kB of bytes, 514 kB of base64.

>>> import numpy as np
>>> p = np.array([[[1.0, 0.0], [0.25, 0.75]]])            # one head, two tokens
>>> enc = Patterns(["a", "b"], [Head(0, 1)], p).to_json()
>>> float(np.abs(Patterns.from_json(enc).values - p).max()) < 0.002
True
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mechkit.errors import MechkitError
from mechkit.model.headspec import Head, check_heads

if TYPE_CHECKING:
    import torch

    from mechkit.model.handle import ModelHandle

ENCODING = "mechkit.patterns/v1"
MAX_ERROR = 1 / 510 + 1 / 131070
"""The largest difference between a stored weight and the one decoded (a row whose maximum is 1)."""


@dataclass
class Patterns:
    """Attention patterns of some heads on one sequence: ``values[i]`` is ``heads[i]``'s ``[T, T]``
    pattern (query × key), ``tokens`` the ``T`` tokens as text."""

    tokens: list[str]
    heads: list[Head]
    values: np.ndarray  # [len(heads), T, T]
    name: str = "patterns"

    def of(self, head: Head) -> np.ndarray:
        """One head's ``[T, T]`` pattern."""
        return self.values[self.heads.index(head)]

    def top_sources(self, head: Head) -> list[int]:
        """For each query, the key it attends to most (the dot the viewer draws)."""
        return [int(i) for i in np.asarray(self.of(head)).argmax(axis=1)]

    def stripe(self, head: Head) -> tuple[int, int]:
        """``(hits, repeats)``: of the queries whose token occurred before, how many attend most to the token
        after its latest earlier occurrence: the induction stripe, counted on this sequence.

        >>> p = Patterns(list("abab"), [Head(0, 0)], np.array([[[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0],
        ...                                                   [0, .2, .8, 0]]], dtype=float))
        >>> p.stripe(Head(0, 0))
        (2, 2)
        """
        last: dict[str, int] = {}
        hits = repeats = 0
        for t, (tok, top) in enumerate(zip(self.tokens, self.top_sources(head), strict=True)):
            if tok in last and last[tok] + 1 < len(self.tokens):
                repeats += 1
                hits += top == last[tok] + 1
            last[tok] = t
        return hits, repeats

    def to_json(self) -> dict[str, Any]:
        """The patterns as :data:`ENCODING` (see the module docstring), JSON-able."""
        values = np.asarray(self.values, dtype=np.float64)
        n, T = len(self.heads), len(self.tokens)
        if values.shape != (n, T, T):
            raise MechkitError(f"patterns of shape {values.shape} for {n} heads and {T} tokens",
                               "pass one [T, T] pattern per head")
        rows = np.tril(values)  # [n, T, T]; causal: nothing above the diagonal
        peak = rows.max(axis=2, keepdims=True)  # [n, T, 1]
        scaled = np.where(peak > 0, rows / np.where(peak > 0, peak, 1), 0)
        q = np.rint(np.clip(scaled, 0, 1) * 255).astype(np.uint8)
        lower = np.tril_indices(T)
        data = q[:, lower[0], lower[1]]  # [n, T(T+1)/2], row-major in each head
        row_max = np.rint(np.clip(peak[..., 0], 0, 1) * 65535).astype("<u2")  # [n, T]
        return {"encoding": ENCODING, "name": self.name, "tokens": list(self.tokens),
                "heads": [[h.layer, h.head] for h in self.heads], "n_tokens": T,
                "data": _b64(data.tobytes()), "row_max": _b64(row_max.tobytes())}

    @classmethod
    def from_json(cls, d: dict) -> Patterns:
        """Patterns back from :meth:`to_json` (within :data:`MAX_ERROR`)."""
        if d.get("encoding") != ENCODING:
            raise MechkitError(f"patterns encoded as {d.get('encoding')!r}, not {ENCODING!r}",
                               "read them with the mechkit that wrote them")
        n, T = len(d["heads"]), int(d["n_tokens"])
        q = np.frombuffer(base64.b64decode(d["data"]), dtype=np.uint8).reshape(n, T * (T + 1) // 2)
        peak = np.frombuffer(base64.b64decode(d["row_max"]), dtype="<u2").reshape(n, T) / 65535
        values = np.zeros((n, T, T))
        lower = np.tril_indices(T)
        values[:, lower[0], lower[1]] = q / 255
        values *= peak[:, :, None]
        return cls(list(d["tokens"]), [Head(int(a), int(b)) for a, b in d["heads"]], values, d.get("name", "patterns"))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def record_patterns(handle: ModelHandle, ids: torch.Tensor, heads: Sequence[Head] | None = None,
                    name: str = "patterns") -> Patterns:
    """The attention patterns of ``heads`` (default: every head) on the first sequence of ``ids``.

    Recorded at ``blocks.{L}.attn.hook_pattern`` through :func:`mechkit.record`, the path detect's scores
    read, so it works on every backend (native, nnsight, ``remote="local"``); only the layers named are
    computed by eager attention.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> p = record_patterns(m, m.to_tokens("abcabc"), [Head(1, 2)])
    >>> p.values.shape, round(float(p.values[0].sum(axis=1)[-1]), 4)
    ((1, 6, 6), 1.0)
    """
    import torch

    from mechkit.hooking.core import record

    a = handle.anatomy
    heads = list(heads) if heads is not None else [Head(layer, h) for layer in range(a.n_layers)
                                                   for h in range(a.heads_in(layer))]
    check_heads(a, heads)
    ids = ids[:1].to(handle.device)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in sorted({h.layer for h in heads})]
    with torch.no_grad(), record(handle, names) as cache:
        handle(ids)
    values = np.stack([cache[f"blocks.{h.layer}.attn.hook_pattern"][0, h.head].float().cpu().numpy()
                       for h in heads]) if heads else np.zeros((0, ids.shape[1], ids.shape[1]))
    return Patterns(handle.to_str_tokens(ids[0]), heads, values, name)


__all__ = ["ENCODING", "MAX_ERROR", "Patterns", "record_patterns"]
