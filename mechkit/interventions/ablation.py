"""Head ablation through the per-head output hook (``blocks.L.attn.hook_z``); expert ablation (a mixture
of experts) through the routing and the MLP output (``blocks.L.mlp.hook_routing``, ``blocks.L.hook_mlp_out``).

Modes:
- ``zero``: the head's output is zeroed — exactly the same as zeroing that head's input columns
  of the attention output projection (a test proves it).
- ``mean``: replaced by its mean over a reference batch (all positions), which keeps the
  activation on-distribution.
- ``resample``: replaced, at each position, by the same head's output at the same position of a
  randomly drawn reference sequence (a random position where the reference is shorter), seeded.

An expert's output is its weighted output (``blocks.L.mlp.hook_expert_out``), 0 at tokens that did not
choose it. ``zero`` sets its routing weight to 0 (the other chosen experts keep theirs, not renormalised);
``mean`` and ``resample`` do that and add its mean weighted output over every reference position (zeros
where the reference did not choose it: the expected contribution per token) or the one at a drawn reference
position. The reference is recorded once; the ablated forward runs the bank as the model does.

On a remote nnsight model the hook functions are shipped by value and run where the model is: each is
self-contained (it closes over tensors only and names nothing but ``torch``, which NDIF's whitelist
allows, :mod:`mechkit.model.backends.whitelist`). Zero and mean are :func:`~mechkit.hooking.traced.pure` (no side
effects), so their activations stay on the server; resample draws from a generator, so it runs again
here on the activation the server saw (the generator here moves on as after a local run).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError, single_use
from mechkit.hooking.core import hooks, record
from mechkit.hooking.traced import pure
from mechkit.model.expertspec import Expert, experts_by_layer, parse_experts
from mechkit.model.headspec import (
    Head,
    HeadSelection,
    checked_seed,
    heads_by_layer,
    parse_heads,
    refuse_unused_ranking,
)

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
        rows, cols = _draws(ref, *z.shape[:2], gen)
        z = z.clone()
        z[:, :, idx.to(z.device)] = ref[rows, cols][:, :, idx].to(z)
        return z

    return fn


def _draws(ref: torch.Tensor, b: int, p: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random reference (sequence, position) for each of ``[b, p]``: the same position where the reference
    has it, else a random one."""
    rows = torch.randint(ref.shape[0], (b, p), generator=gen)
    cols = torch.arange(p).expand(b, p)
    cols = torch.where(cols < ref.shape[1], cols, torch.randint(ref.shape[1], (b, p), generator=gen))
    return rows, cols


def _reference_experts(handle: ModelHandle, by_layer: dict[int, list[int]], reference: torch.Tensor
                       ) -> dict[int, torch.Tensor]:
    """Each layer's ablated experts' summed weighted output on ``reference``: ``[batch, pos, d_model]``
    (only those columns are kept, not the whole ``[batch, pos, n_experts, d_model]`` grid)."""
    kept: dict[int, torch.Tensor] = {}

    def keep(out, point):
        kept[point.layer] = out[:, :, torch.tensor(by_layer[point.layer], device=out.device)].sum(2).detach()

    with torch.no_grad(), hooks(handle, {f"blocks.{layer}.mlp.hook_expert_out": keep for layer in by_layer}):
        handle(reference)
    return kept


def _added_fn(add: torch.Tensor):
    @pure
    def fn(out, _point):
        return out + add.to(out)

    return fn


def _resampled_fn(ref: torch.Tensor, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def fn(out, _point):
        rows, cols = _draws(ref, *out.shape[:2], gen)
        return out + ref[rows, cols].to(out)

    return fn


def _expert_fns(handle: ModelHandle, experts: list[Expert], mode: str, reference: torch.Tensor | None,
                seed: int) -> dict:
    by_layer = experts_by_layer(experts)
    refs = _reference_experts(handle, by_layer, reference) if mode != "zero" else {}
    fns: dict = {}
    for layer, es in by_layer.items():
        fns[f"blocks.{layer}.mlp.hook_routing"] = _zero_fn(torch.tensor(es, dtype=torch.long))
        if mode == "mean":
            fns[f"blocks.{layer}.hook_mlp_out"] = _added_fn(refs[layer].mean(dim=(0, 1)))
        elif mode == "resample":
            fns[f"blocks.{layer}.hook_mlp_out"] = _resampled_fn(refs[layer], seed + layer)
    return fns


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def ablate(
    handle: ModelHandle,
    heads: str | HeadSelection | Sequence[Head] | None = None,
    mode: str = "zero",
    *,
    experts: str | Sequence[Expert] | None = None,
    reference: torch.Tensor | None = None,
    seed: int = 0,
    top_k: int | None = None,
    scores: dict | None = None,
) -> Iterator[list]:
    """Ablate heads and/or a mixture of experts' experts while the context is open; yields what it
    resolved (the heads, then the experts).

    ``heads`` is a spec's text (read here), a :class:`~mechkit.model.headspec.HeadSelection` a run parsed
    already (resolved, not read again), or the heads themselves. ``experts`` is an expert spec
    (``"1.e2,*.e0"``, :mod:`mechkit.model.expertspec`) or :class:`~mechkit.model.expertspec.Expert` s.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> with mk.ablate(m, heads="0.1,1.3", mode="zero") as hs:
    ...     logits = m(m.to_tokens("hello"))
    >>> [str(h) for h in hs]
    ['0.1', '1.3']
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.ablate")
    seed = checked_seed(seed, "mk.ablate")  # else torch's Overflow / TypeError at the first resampled forward
    if mode not in MODES:
        raise MechkitError(f"unknown ablation mode {mode!r}", f"use one of: {', '.join(MODES)}")
    if heads is None and experts is None:
        raise MechkitError("nothing to ablate", "pass heads=... (e.g. '0.1,1.3') or experts=... (e.g. '1.e2')")
    refuse_unused_ranking(heads, top_k, scores)
    a = handle.anatomy
    resolved: list[Head] = [] if heads is None else \
        parse_heads(heads, a.n_layers, a.head_counts, scores=scores, top_k=top_k, seed=seed)
    chosen = [] if experts is None else parse_experts(experts, a)
    if mode != "zero" and reference is None:
        raise MechkitError(f"{mode} ablation needs reference inputs",
                           "pass reference=token ids (e.g. task prompts or random tokens)")
    by_layer = heads_by_layer(resolved)
    refs = _reference_z(handle, list(by_layer), reference) if mode != "zero" and by_layer else {}
    fns = _expert_fns(handle, chosen, mode, reference, seed) if chosen else {}
    for layer, hs in by_layer.items():
        idx = torch.tensor(hs, dtype=torch.long)
        if mode == "zero":
            fns[f"blocks.{layer}.attn.hook_z"] = _zero_fn(idx)
        elif mode == "mean":
            fns[f"blocks.{layer}.attn.hook_z"] = _mean_fn(idx, refs[layer])
        else:
            fns[f"blocks.{layer}.attn.hook_z"] = _resample_fn(idx, refs[layer], seed + layer)
    with hooks(handle, fns):
        yield [*resolved, *chosen]

