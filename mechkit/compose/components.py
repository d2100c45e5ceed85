"""Which components composition needs: ablation effects on the composite vs on each simple task.

For every attention head (zero-ablated at ``blocks.L.attn.hook_z``) and every MLP block (zero- or
mean-ablated as a whole at ``blocks.L.hook_mlp_out``) the *effect* on a prompt set is the change
of the mean per-token answer log-probability, ablated − clean, averaged over prompts (negative:
the component helps). Two methods, as in :mod:`mechkit.heads.effects`:

- ``exact``: heads through :func:`mechkit.heads.exact_effects`; each MLP block replaced for real,
  replaying only the blocks at and above it on the clean forward's captured inputs;
- ``attribution``: one forward and one backward pass per batch give ∂metric/∂activation for every
  head output and MLP output at once; the effect of replacing activation a by a' is estimated as
  Σ (a' − a)·∂metric/∂a over every (non-pad) position. The heads' estimate is exactly
  :func:`mechkit.heads.attribution_effects`' (a test checks it); for mean ablation a' is the
  block's mean output over the prompt set's positions, which enters linearly, so the same single
  pass also gives it: Σ(ā − a)·g = ā·Σg − Σa·g.

**Composite-specific effect.** With importance I_T(c) = −effect_T(c) (how much removing component
c lowers the answer log-prob of task T's prompts), the composite-specific effect is

    CS(c) = I_composite(c) − max(I_k(c), I_g(c))          (contrast "max", the default)
    CS(c) = I_composite(c) − (I_k(c) + I_g(c)) / 2         (contrast "mean")

where "composite" is the composite setting's prompts (demonstrations of the two marked simple
tasks, a composite query: the setting where composing is required) and k, g are the two marked
simple tasks' own prompts. CS(c) > 0 means the composite needs c more than either part does
(``max``: more than the part that needs it most); ranking by CS puts composition-specific
components first. Log-probs are per answer token, so tasks with longer answers are not favoured.

>>> import numpy as np
>>> composite_specific(np.array([-0.5, -0.1]), [np.array([-0.1, -0.3]), np.array([0.0, -0.2])])
array([ 0.4, -0.2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.errors import MechkitError
from mechkit.eval import batches, forward_kept, row_metrics
from mechkit.heads import Head, all_heads, exact_effects, top_heads
from mechkit.hooking.core import hooks
from mechkit.model.backends.grad import enable_grad
from mechkit.model.edit.partial import capture_block_inputs, run_from

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

__all__ = [
    "METHODS",
    "MLP_MODES",
    "ComponentEffects",
    "component_effects",
    "composite_specific",
    "exact_head_effects",
    "mlp_means",
    "ranks_of",
]

METHODS = ("attribution", "exact")
MLP_MODES = ("zero", "mean")
CONTRASTS = ("max", "mean")


@dataclass
class ComponentEffects:
    """Effects (ablated − clean mean answer log-prob) of every head ``[L, H]`` and MLP block ``[L]``."""

    heads: np.ndarray
    mlps: np.ndarray
    clean_logprob: float
    method: str
    mlp_mode: str

    def as_dict(self) -> dict:
        return {"heads": self.heads.tolist(), "mlps": self.mlps.tolist(), "clean_logprob": self.clean_logprob,
                "method": self.method, "mlp_mode": self.mlp_mode}

    @classmethod
    def from_dict(cls, d: dict) -> ComponentEffects:
        return cls(np.asarray(d["heads"], dtype=float), np.asarray(d["mlps"], dtype=float),
                   float(d["clean_logprob"]), d["method"], d["mlp_mode"])


def _check(method: str, mlp_mode: str) -> None:
    if method not in METHODS:
        raise MechkitError(f"unknown effect method {method!r}", f"use one of: {', '.join(METHODS)}")
    if mlp_mode not in MLP_MODES:
        raise MechkitError(f"unknown MLP ablation {mlp_mode!r}", f"use one of: {', '.join(MLP_MODES)}")


def mlp_means(handle: ModelHandle, prompts: Sequence, batch_size: int = 16) -> torch.Tensor:
    """``[n_layers, d_model]``: every MLP block's output averaged over the prompts' (non-pad)
    positions — what mean ablation puts in its place."""
    a = handle.anatomy
    total = torch.zeros(a.n_layers, a.d_model, dtype=torch.float64)
    count = 0.0
    for batch in batches(handle, prompts, batch_size):
        valid = batch.mask.to(handle.device)

        def take(out, point, valid=valid):
            total[point.layer] += (out.detach() * valid[:, :, None].to(out.dtype)).sum((0, 1)).double().cpu()

        with torch.no_grad(), hooks(handle, {"blocks.*.hook_mlp_out": take}):
            forward_kept(handle, batch)
        count += float(valid.sum())
    return (total / max(count, 1.0)).float()


def _attribution(handle: ModelHandle, prompts: Sequence, mlp_mode: str, batch_size: int) -> ComponentEffects:
    a = handle.anatomy
    heads = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    a_dot_g = torch.zeros(a.n_layers, dtype=torch.float64)
    sum_a = torch.zeros(a.n_layers, a.d_model, dtype=torch.float64)
    sum_g = torch.zeros_like(sum_a)
    clean, n, positions = 0.0, 0, 0.0
    for batch in batches(handle, prompts, batch_size):
        zs: dict[int, torch.Tensor] = {}
        outs: dict[int, torch.Tensor] = {}

        def keep(store):
            def fn(x, point):
                store[point.layer] = x
                return x  # returned, so the next module consumes it and gradients reach it

            return fn

        with enable_grad(), hooks(handle, {"blocks.*.attn.hook_z": keep(zs), "blocks.*.hook_mlp_out": keep(outs)}):
            row_lp, _ = row_metrics(forward_kept(handle, batch), batch)
            layers = sorted(zs)
            grads = torch.autograd.grad(row_lp.sum(), [zs[i] for i in layers] + [outs[i] for i in layers])
        with torch.no_grad():
            valid = batch.mask.to(handle.device)
            for layer, gz, gm in zip(layers, grads[:len(layers)], grads[len(layers):], strict=True):
                n_layer = zs[layer].shape[2]  # this layer's own heads (fewer where heads were pruned)
                heads[layer, :n_layer] += ((-zs[layer].detach()) * gz * valid[:, :, None, None].to(gz.dtype)
                                           ).sum((0, 1, 3)).double().cpu()
                out, gm = outs[layer].detach(), gm * valid[:, :, None].to(gm.dtype)
                a_dot_g[layer] += float((out * gm).sum())
                sum_g[layer] += gm.sum((0, 1)).double().cpu()
                sum_a[layer] += (out * valid[:, :, None].to(out.dtype)).sum((0, 1)).double().cpu()
            positions += float(valid.sum())
        clean += float(row_lp.detach().sum())
        n += len(batch.cols)
    mlps = -a_dot_g
    if mlp_mode == "mean":
        mlps = mlps + (sum_a / max(positions, 1.0) * sum_g).sum(-1)
    heads = np.where(a.head_mask(), (heads / n).numpy(), np.nan)  # NaN: a head a pruned layer does not have
    return ComponentEffects(heads, (mlps / n).numpy(), clean / n, "attribution", mlp_mode)


def _exact_mlps(handle: ModelHandle, prompts: Sequence, mlp_mode: str, batch_size: int,
                on_layer: Callable[[], None] | None) -> np.ndarray:
    a = handle.anatomy
    means = mlp_means(handle, prompts, batch_size) if mlp_mode == "mean" else None
    total = torch.zeros(a.n_layers, dtype=torch.float64)
    n = 0

    def replace(layer: int):
        def fn(out, _point):
            return torch.zeros_like(out) if means is None else means[layer].to(out).expand_as(out).clone()

        return fn

    with torch.no_grad():
        for batch in batches(handle, prompts, batch_size):
            with capture_block_inputs(handle) as inputs:
                base, _ = row_metrics(forward_kept(handle, batch), batch)
            keep = batch.keep.to(handle.device)
            for layer in range(a.n_layers):
                with hooks(handle, {f"blocks.{layer}.hook_mlp_out": replace(layer)}):
                    ablated, _ = row_metrics(run_from(handle, layer, inputs, positions=keep), batch)
                total[layer] += float((ablated - base).sum())
                if on_layer:
                    on_layer()
            n += len(batch.cols)
    return (total / max(n, 1)).numpy()


def component_effects(handle: ModelHandle, prompts: Sequence, method: str = "attribution", mlp_mode: str = "mean",
                      batch_size: int = 16, on_layer: Callable[[], None] | None = None) -> ComponentEffects:
    """Effects of ablating every head (zero) and every MLP block (``mlp_mode``) on ``prompts``.

    ``on_layer`` is called after each layer of an exact sweep (twice per layer and batch: heads,
    then MLPs), for a progress bar.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> eff = component_effects(m, mk.build_prompts("swap", n=2, shots=1))
    >>> eff.heads.shape, eff.mlps.shape
    ((2, 4), (2,))
    """
    _check(method, mlp_mode)
    if method == "attribution":
        return _attribution(handle, prompts, mlp_mode, batch_size)
    heads = exact_effects(handle, prompts, batch_size, on_layer=on_layer)
    mlps = _exact_mlps(handle, prompts, mlp_mode, batch_size, on_layer)
    return ComponentEffects(np.asarray(heads.logprob), mlps, heads.clean_logprob, "exact", mlp_mode)


def exact_head_effects(handle: ModelHandle, prompts: Sequence, heads: Sequence[Head],
                       batch_size: int = 16) -> list[float]:
    """The exact zero-ablation effect of each listed head (one at a time): the check of an
    attribution ranking's top heads, at the cost of only those heads."""
    total = [0.0] * len(heads)
    n = 0
    with torch.no_grad():
        for batch in batches(handle, prompts, batch_size):
            with capture_block_inputs(handle) as inputs:
                base, _ = row_metrics(forward_kept(handle, batch), batch)
            keep = batch.keep.to(handle.device)
            for i, h in enumerate(heads):
                def zero(z, _point, h=h):
                    return z.index_fill(2, torch.tensor([h.head], device=z.device), 0.0)

                with hooks(handle, {f"blocks.{h.layer}.attn.hook_z": zero}):
                    ablated, _ = row_metrics(run_from(handle, h.layer, inputs, positions=keep), batch)
                total[i] += float((ablated - base).sum())
            n += len(batch.cols)
    return [t / max(n, 1) for t in total]


def composite_specific(composite: np.ndarray, simple: Sequence[np.ndarray], contrast: str = "max") -> np.ndarray:
    """CS = I_composite − max (or mean) of the simple tasks' I, with I = −effect (module docstring)."""
    if contrast not in CONTRASTS:
        raise MechkitError(f"unknown contrast {contrast!r}", f"use one of: {', '.join(CONTRASTS)}")
    parts = np.stack([-np.asarray(s, dtype=float) for s in simple])
    reference = parts.max(0) if contrast == "max" else parts.mean(0)
    return -np.asarray(composite, dtype=float) - reference


def ranks_of(grid: np.ndarray, heads: Sequence[Head]) -> list[int]:
    """1-based ranks of ``heads`` when every head is ordered by ``grid``, highest first.

    >>> ranks_of(np.array([[0.1, 0.9], [0.5, 0.2]]), [Head(0, 1), Head(0, 0)])
    [1, 4]
    """
    grid = np.asarray(grid, dtype=float)
    order = top_heads(grid.tolist(), len(all_heads(*grid.shape)))
    position = {h: i + 1 for i, h in enumerate(order)}
    return [position[h] for h in heads]
