"""Guides: importance scores for every prunable unit (higher = keep), computed without retraining.

=============  ===============================  ==============================  ==========================
guide          MLP channels                     query heads                     layers
=============  ===============================  ==============================  ==========================
random         uniform noise (seeded)           uniform noise                   uniform noise
magnitude      ‖W_down[:, j]‖ (seeds, Thm 3)    ‖W_o[:, head block]‖_F          block influence
wanda          ‖W_down[:, j]‖·‖X_j‖ (structured)  ‖W_o block‖_F·‖z_h‖            block influence
flap           Var(X_j)·‖W_down[:, j]‖²         Σ_d Var(z_hd)·‖W_o[:, hd]‖²     block influence
gradient       |∂L/∂m_j| of a unit mask (Michel et al.), zero baseline, on task calibration prompts
attribution    |Σ_t ∂L/∂a·(a − ā)|: first-order change of the answer loss when the unit is replaced by
               its mean — exactly what a compensated removal does (attribution patching per unit)
ablation       attribution for channels; exact ablation for heads (|Δ answer log-prob| of zeroing each
               head, the heads sweep) and for blocks (removing each block for real)
induction      (heads) attribution, but the top induction / previous-token heads are never removed
combined       mean of per-layer z-scores of wanda and attribution (+ induction protection for heads)
=============  ===============================  ==============================  ==========================

Block influence is ShortGPT's 1 − cos(block input, block output). ``gradient``, ``attribution`` and
``induction`` are task-calibrated: ``L`` is the answer log-likelihood on the calibration prompts of
the chosen tasks (never the held-out ones), averaged per prompt; scores are |per-prompt estimate|
averaged over prompts, so units that matter in either direction are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.errors import MechkitError
from mechkit.eval.scoring import batches, forward_kept, row_metrics
from mechkit.hooking.core import hooks
from mechkit.model.backends.grad import enable_grad
from mechkit.model.modules.linear import weight_out_in
from mechkit.pruning.stats import neuron_points

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.stats import UnitStats

GUIDES = ("random", "magnitude", "wanda", "flap", "gradient", "attribution", "ablation", "induction", "combined")
TASK_GUIDES = ("gradient", "attribution", "induction", "combined")


@dataclass
class Scores:
    """Importance per unit, higher = more important: ``mlp [L, d_mlp]``, ``heads [L, H]``, ``layers [L]``."""

    mlp: np.ndarray
    heads: np.ndarray
    layers: np.ndarray
    guide: str
    protected_heads: tuple[tuple[int, int], ...] = ()


def check_guide(guide: str) -> str:
    if guide not in GUIDES:
        raise MechkitError(f"unknown guide {guide!r}", f"use one of: {', '.join(GUIDES)}")
    return guide


# --- weight and activation statistics ------------------------------------------------------------

def _down_cols(handle: ModelHandle) -> torch.Tensor:
    """``[L, d_mlp]`` squared column norms of every MLP output projection."""
    a = handle.anatomy
    if not neuron_points(a):  # a mixture of experts: no neurons to score (neuron targets are refused)
        return torch.zeros(a.n_layers, a.d_mlp, dtype=torch.float64)
    return torch.stack([weight_out_in(a.mlp_out(i)).detach().double().pow(2).sum(0).cpu() for i in range(a.n_layers)])


def _o_cols(handle: ModelHandle) -> torch.Tensor:
    """``[L, H, d_head]`` squared column norms of every attention output projection, per head."""
    a = handle.anatomy
    return torch.stack([weight_out_in(a.attn_out(i)).detach().double().pow(2).sum(0).cpu()
                        .reshape(a.n_heads, a.d_head) for i in range(a.n_layers)])


def static_scores(guide: str, handle: ModelHandle, stats: UnitStats, seed: int = 0) -> Scores:
    """Scores that need no task gradients: random, magnitude, wanda, flap."""
    a = handle.anatomy
    if guide == "random":
        rng = np.random.default_rng(seed)
        return Scores(rng.random((a.n_layers, a.d_mlp)), rng.random((a.n_layers, a.n_heads)),
                      rng.random(a.n_layers), guide)
    down, o = _down_cols(handle), _o_cols(handle)
    influence = stats.block_influence.numpy()
    if guide == "magnitude":
        return Scores(down.sqrt().numpy(), o.sum(-1).sqrt().numpy(), influence, guide)
    if guide == "wanda":
        head_norm = (stats.head_sq.sum(-1) * stats.n_tokens).sqrt()
        return Scores((down.sqrt() * stats.mlp_norm).numpy(), (o.sum(-1).sqrt() * head_norm).numpy(), influence, guide)
    if guide == "flap":
        return Scores((stats.mlp_var * down).numpy(), (stats.head_var * o).sum(-1).numpy(), influence, guide)
    raise MechkitError(f"guide {guide!r} needs calibration gradients", "use task_scores() for it")


# --- task gradients -------------------------------------------------------------------------------

def gradient_scores(handle: ModelHandle, prompts: Sequence, stats: UnitStats, baseline: str = "mean",
                    batch_size: int = 8) -> Scores:
    """Per unit, mean over calibration prompts of |Σ_positions ∂logp(answer)/∂a · (a − base)|.

    ``base`` is the unit's calibration mean (``baseline="mean"``: the attribution guide) or zero
    (``"zero"``: Michel et al.'s head-mask gradient, generalised to channels and blocks). For a
    block, ``a`` is its output and ``base`` its input: the block's mask gradient.
    """
    def passes():
        for batch in batches(handle, prompts, batch_size):
            yield (lambda batch=batch: row_metrics(forward_kept(handle, batch), batch)[0]), batch.mask

    return _attribute(handle, passes(), stats, baseline, "attribution" if baseline == "mean" else "gradient")


def text_gradient_scores(handle: ModelHandle, texts: Sequence[str], stats: UnitStats, baseline: str = "mean",
                         batch_size: int = 8) -> Scores:
    """:func:`gradient_scores` with the language-modelling loss of generic text: per text, the mean
    log-prob of every next token stands for the answer log-prob (what held-out perplexity measures)."""
    from mechkit.pruning.stats import encode

    def passes():
        for start in range(0, len(texts), batch_size):
            enc = encode(handle, texts[start:start + batch_size])
            ids, mask = enc["input_ids"].to(handle.device), enc["attention_mask"].to(handle.device)

            def logp(ids=ids, mask=mask):
                logits = handle(ids, attention_mask=mask)[:, :-1].float()
                token = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
                valid = (mask[:, 1:] * mask[:, :-1]).to(token.dtype)
                return (token * valid).sum(1) / valid.sum(1).clamp_min(1)

            yield logp, mask

    return _attribute(handle, passes(), stats, baseline, "attribution" if baseline == "mean" else "gradient")


def _attribute(handle: ModelHandle, passes, stats: UnitStats, baseline: str, guide: str) -> Scores:
    """Sum |Σ_positions ∂logp/∂a · (a − base)| over the rows of ``passes`` (``(logp(), mask)`` pairs, logp
    one value per row), per unit; divided by the number of rows."""
    a = handle.anatomy
    L = a.n_layers
    mlp = torch.zeros(L, a.d_mlp, dtype=torch.float64)
    heads = torch.zeros(L, a.n_heads, dtype=torch.float64)
    layers = torch.zeros(L, dtype=torch.float64)
    n = 0
    for forward, mask in passes:
        acts: dict[str, torch.Tensor] = {}

        def keep(x, point, acts=acts):
            acts[point.name] = x
            return x

        names = [*neuron_points(a), "blocks.*.attn.hook_z", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_post"]
        with enable_grad(), hooks(handle, dict.fromkeys(names, keep)):
            logp = forward()
            order = sorted(acts)
            grads = dict(zip(order, torch.autograd.grad(logp.sum(), [acts[k] for k in order], allow_unused=True),
                             strict=True))
        valid = mask.to(handle.device).to(logp.dtype)
        with torch.no_grad():
            for layer in range(L):
                if neuron_points(a):
                    mlp[layer] += _unit_effect(acts, grads, f"blocks.{layer}.mlp.hook_post", valid,
                                               stats.mlp_mean[layer] if baseline == "mean" else None)
                heads[layer] += _unit_effect(acts, grads, f"blocks.{layer}.attn.hook_z", valid,
                                             stats.head_mean[layer] if baseline == "mean" else None)
                out, inp = f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.hook_resid_pre"
                delta = (acts[out] - acts[inp]).detach() * grads[out] * valid[..., None]
                layers[layer] += delta.sum(dim=(1, 2)).abs().sum().double().cpu()
        n += len(logp)
    n = max(n, 1)
    return Scores((mlp / n).numpy(), (heads / n).numpy(), (layers / n).numpy(), guide)


def mix_scores(task: Scores, text: Scores, weight: float) -> Scores:
    """``(1 − weight)·task + weight·text``: both in nats of mean log-prob per row, so they add as they are."""
    return Scores((1 - weight) * task.mlp + weight * text.mlp, (1 - weight) * task.heads + weight * text.heads,
                  (1 - weight) * task.layers + weight * text.layers, task.guide)


def _unit_effect(acts: dict, grads: dict, name: str, valid: torch.Tensor, mean: torch.Tensor | None) -> torch.Tensor:
    """Σ over prompts of |Σ_positions (and head dims) grad·(a − base)| for one hook point."""
    x, g = acts[name].detach(), grads[name]
    diff = x - mean.to(x) if mean is not None else x
    prod = diff * g * valid.reshape(*valid.shape, *([1] * (x.dim() - 2)))
    per_row = prod.sum(dim=1)  # [b, units] or [b, H, d]
    if per_row.dim() == 3:
        per_row = per_row.sum(-1)
    return per_row.abs().sum(0).double().cpu()


# --- combinations --------------------------------------------------------------------------------

def zscore_rows(x: np.ndarray) -> np.ndarray:
    """Standardise every layer's scores (last axis), so layers with larger scales do not dominate."""
    mu = x.mean(axis=-1, keepdims=True)
    sd = x.std(axis=-1, keepdims=True)
    return (x - mu) / np.where(sd > 0, sd, 1.0)


def protect_heads(scores: Scores, circuit: dict[str, np.ndarray], top_k: int) -> Scores:
    """Put the top-``top_k`` induction and previous-token heads above every other head."""
    protected: set[tuple[int, int]] = set()
    for kind in ("induction", "previous-token"):
        grid = circuit[kind]
        for flat in np.argsort(grid, axis=None)[::-1][:top_k]:
            protected.add(tuple(int(v) for v in np.unravel_index(flat, grid.shape)))
    heads = scores.heads.copy()
    bump = np.abs(heads).max() * 10 + 1
    for layer, h in protected:
        heads[layer, h] += bump
    return Scores(scores.mlp, heads, scores.layers, scores.guide, tuple(sorted(protected)))


def combined(wanda: Scores, attribution: Scores) -> Scores:
    """Mean of per-layer z-scores of the activation-aware and the task-attribution scores."""
    return Scores((zscore_rows(wanda.mlp) + zscore_rows(attribution.mlp)) / 2,
                  (zscore_rows(wanda.heads) + zscore_rows(attribution.heads)) / 2,
                  attribution.layers, "combined")
