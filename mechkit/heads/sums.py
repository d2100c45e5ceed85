"""What a head sweep returns, and the metric whose gradient attribution patching takes.

Shared by the native sweep (:mod:`mechkit.heads.effects`) and the traced one
(:mod:`mechkit.heads.traced_effects`), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mechkit.eval.scoring import row_metrics


@dataclass
class HeadEffects:
    """Effects of ablating each head, ``[n_layers, n_heads]``: ablated − clean."""

    logprob: np.ndarray
    accuracy: np.ndarray | None
    clean_logprob: float
    clean_accuracy: float | None
    method: str


def absent_nan(grid: torch.Tensor | np.ndarray, anatomy) -> np.ndarray:
    """The grid as an array, NaN in the cells with no head (a layer that kept fewer heads: pruned)."""
    return np.where(anatomy.head_mask(), grid.numpy() if isinstance(grid, torch.Tensor) else grid, np.nan)


class LogprobSum:
    """The attribution metric: summed mean answer log-prob of a batch's rows, from its logits."""

    def __init__(self, batch, kept: bool) -> None:
        self.batch, self.kept = batch, kept

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.kept:
            logits = logits[:, self.batch.keep.to(logits.device)]
        return row_metrics(logits, self.batch)[0].sum()
