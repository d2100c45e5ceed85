"""Head ablation through the per-head output hook (``blocks.L.attn.hook_z``).

Modes:
- ``zero``: the head's output is zeroed — exactly the same as zeroing that head's input columns
  of the attention output projection (a test proves it).
- ``mean``: replaced by its mean over a reference batch (all positions), which keeps the
  activation on-distribution.
- ``resample``: replaced, at each position, by the same head's output at the same position of a
  randomly drawn reference sequence (a random position where the reference is shorter), seeded.

On a remote nnsight model the hook functions are shipped by value and run where the model is: each is
self-contained (it closes over tensors only and names nothing but ``torch``, which NDIF's whitelist
allows, :mod:`mechkit.model.backends.whitelist`). Zero and mean are :func:`~mechkit.hooking.traced.pure` (no side
effects), so their activations stay on the server; resample draws from a generator, so it runs again
here on the activation the server saw (the generator here moves on as after a local run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.hooking.core import hooks, record
from mechkit.hooking.traced import pure
from mechkit.model.headspec import Head, HeadSelection, heads_by_layer, parse_heads

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

MODES = ("zero", "mean", "resample")


def _reference_z(handle: ModelHandle, layers: list[int], reference: torch.Tensor) -> dict[int, torch.Tensor]:
    names = [f"blocks.{layer}.attn.hook_z" for layer in layers]
    with torch.no_grad(), record(handle, names) as cache:
        handle(reference)
    return {layer: cache[f"blocks.{layer}.attn.hook_z"] for layer in layers}


def _zero_fn(idx: torch.Tensor):
    @pure
    def fn(z, _point):
        return z.index_fill(2, idx.to(z.device), 0.0)

    return fn


def _mean_fn(idx: torch.Tensor, ref: torch.Tensor):
    mean = ref[:, :, idx].mean(dim=(0, 1))  # [k, d_head]

    @pure
    def fn(z, _point):
        z = z.clone()
        z[:, :, idx.to(z.device)] = mean.to(z)
        return z

    return fn


def _resample_fn(idx: torch.Tensor, ref: torch.Tensor, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def fn(z, _point):
        b, p = z.shape[:2]
        rows = torch.randint(ref.shape[0], (b, p), generator=gen)
        cols = torch.arange(p).expand(b, p)
        cols = torch.where(cols < ref.shape[1], cols, torch.randint(ref.shape[1], (b, p), generator=gen))
        z = z.clone()
        z[:, :, idx.to(z.device)] = ref[rows, cols][:, :, idx].to(z)
        return z

    return fn


@contextlib.contextmanager
def ablate(
    handle: ModelHandle,
    heads: str | HeadSelection | Sequence[Head],
    mode: str = "zero",
    *,
    reference: torch.Tensor | None = None,
    seed: int = 0,
    top_k: int = 10,
    scores: dict | None = None,
) -> Iterator[list[Head]]:
    """Ablate heads while the context is open; yields the resolved heads.

    ``heads`` is a spec's text (read here), a :class:`~mechkit.model.headspec.HeadSelection` a run parsed
    already (resolved, not read again), or the heads themselves.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> with mk.ablate(m, heads="0.1,1.3", mode="zero") as hs:
    ...     logits = m(m.to_tokens("hello"))
    >>> [str(h) for h in hs]
    ['0.1', '1.3']
    """
    if mode not in MODES:
        raise MechkitError(f"unknown ablation mode {mode!r}", f"use one of: {', '.join(MODES)}")
    a = handle.anatomy
    resolved = parse_heads(heads, a.n_layers, a.n_heads, scores=scores, top_k=top_k, seed=seed)
    by_layer = heads_by_layer(resolved)
    if mode != "zero" and reference is None:
        raise MechkitError(f"{mode} ablation needs reference inputs",
                           "pass reference=token ids (e.g. task prompts or random tokens)")
    refs = _reference_z(handle, list(by_layer), reference) if mode != "zero" else {}
    fns = {}
    for layer, hs in by_layer.items():
        idx = torch.tensor(hs, dtype=torch.long)
        if mode == "zero":
            fns[f"blocks.{layer}.attn.hook_z"] = _zero_fn(idx)
        elif mode == "mean":
            fns[f"blocks.{layer}.attn.hook_z"] = _mean_fn(idx, refs[layer])
        else:
            fns[f"blocks.{layer}.attn.hook_z"] = _resample_fn(idx, refs[layer], seed + layer)
    with hooks(handle, fns):
        yield resolved
