"""Uneven per-layer budgets from measured layer sensitivity (exact, on calibration prompts only).

For each layer, remove a probe fraction of its MLP channels (the guide's least important ones,
with compensation) and measure the exact drop of the answer log-likelihood on the calibration
prompts — an ablation experiment per layer, replaying only the blocks from that layer up. A
quadratic model ΔL_l(s) ≈ c_l·(s/probe)² then gives the allocation minimising Σ ΔL_l at a mean
sparsity: s_l ∝ 1/c_l, clipped, so robust layers give more and fragile ones (often the first
MLPs, which act as an extension of the embedding) keep theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.eval.scoring import batches, forward_kept, row_metrics
from mechkit.model.edit.partial import capture_block_inputs, run_from
from mechkit.pruning.masking import masked
from mechkit.pruning.plan import UnitsToRemove

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.calibration import Calibration


def layer_sensitivity(handle: ModelHandle, mlp_scores: np.ndarray, calib: Calibration, probe: float = 0.5,
                      batch_size: int = 8) -> np.ndarray:
    """``[L]``: mean drop of answer log-prob when ``probe`` of a layer's channels are removed."""
    a = handle.anatomy
    k = int(round(probe * a.d_mlp))
    plans = [UnitsToRemove(mlp={layer: np.argsort(mlp_scores[layer], kind="stable")[:k].tolist()}, compensate=True)
             for layer in range(a.n_layers)]
    return plan_drops(handle, plans, calib, batch_size)


def plan_drops(handle: ModelHandle, plans: list[UnitsToRemove], calib: Calibration, batch_size: int = 8) -> np.ndarray:
    """Exact mean drop of answer log-prob on the calibration prompts for each single-layer plan
    (``plans[l]`` touches layer ``l`` only, so blocks below ``l`` are reused from the clean run)."""
    drop = np.zeros(len(plans))
    n = 0
    with torch.no_grad():
        for batch in batches(handle, calib.prompts, batch_size):
            with capture_block_inputs(handle) as inputs:
                base = row_metrics(forward_kept(handle, batch), batch)[0]
            keep = batch.keep.to(handle.device)
            for layer, plan in enumerate(plans):
                with masked(handle, plan, calib.stats):
                    out = row_metrics(run_from(handle, layer, inputs, positions=keep), batch)[0]
                drop[layer] += float((base - out).sum())
            n += len(batch.cols)
    return drop / max(n, 1)


def allocate(sensitivity: np.ndarray, fraction: float, probe: float = 0.5, max_fraction: float | None = None) -> np.ndarray:
    """Per-layer sparsities with mean ``fraction`` minimising Σ c_l (s_l/probe)², 0 ≤ s_l ≤ max_fraction.

    ``max_fraction`` defaults to the probe (never extrapolate past the measured level; the drop grows
    much faster than quadratically beyond it). Sensitivities below a tenth of the median (noise, or a
    removal that happened to help) are raised to that floor.
    """
    max_fraction = max(probe, fraction) if max_fraction is None else max_fraction
    sens = np.asarray(sensitivity, dtype=float)
    positive = sens[sens > 0]
    floor = 0.1 * float(np.median(positive)) if len(positive) else 1.0
    c = np.maximum(sens, floor)
    inv = 1.0 / c
    out = np.zeros_like(inv)
    free = np.ones(len(inv), dtype=bool)
    budget = fraction * len(inv)
    for _ in range(len(inv)):  # water-filling: clip the layers that hit the cap, spread the rest
        if not free.any():  # every layer is at the cap: the mean cannot reach ``fraction``
            break
        scale = (budget - max_fraction * (~free).sum()) / inv[free].sum()
        out[free] = inv[free] * scale
        over = free & (out > max_fraction)
        if not over.any():
            break
        out[over] = max_fraction
        free &= ~over
    return np.clip(out, 0.0, max_fraction)
