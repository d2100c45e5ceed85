"""mechkit's head scores beside TransformerLens' own head detector, on the same token sequences.

TransformerLens scores a head by how much of its attention falls on a detection pattern
(``transformer_lens.head_detector``: induction, previous-token, duplicate-token patterns built from the
tokens, and ``compute_head_attention_similarity_score``), averaged over sequences, with the patterns
of its own ``TransformerBridge`` over (a copy of) the model. Its normalisation differs from mechkit's
(attention on the detection pattern over all attention, all query positions, where mechkit averages
attention to the target over the repeated half), so agreement is in ranks: Spearman correlation and
the overlap of the top-k heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.heads.effects import spearman
from mechkit.heads.scores import grid_list
from mechkit.hooking.transformer_lens import bridge_for
from mechkit.model.headspec import top_heads

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

# mechkit kind -> TransformerLens detection pattern
TL_PATTERNS = {"induction": "induction_head", "previous-token": "previous_token_head",
               "duplicate-token": "duplicate_token_head"}


def transformer_lens_scores(handle: ModelHandle, tokens: torch.Tensor, batch_size: int = 8) -> dict[str, np.ndarray]:
    """TransformerLens' detector scores ``{kind: [n_layers, n_heads]}``, averaged over ``tokens``' rows; NaN
    where a pruned layer kept fewer heads (each layer's pattern has its own head count)."""
    from transformer_lens import head_detector

    bridge = bridge_for(handle)
    a = handle.anatomy
    out = {kind: np.where(a.head_mask(), 0.0, np.nan) for kind in TL_PATTERNS}
    for start in range(0, len(tokens), batch_size):
        batch = tokens[start:start + batch_size]
        with torch.no_grad():
            _, cache = bridge.run_with_cache(batch.to(handle.device),
                                             names_filter=lambda name: name.endswith("attn.hook_pattern"))
        for i, seq in enumerate(batch):
            for kind, name in TL_PATTERNS.items():
                detection = getattr(head_detector, f"get_{name}_detection_pattern")(seq.cpu())
                for layer in range(a.n_layers):
                    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][i].float().cpu()
                    for head in range(a.heads_in(layer)):
                        out[kind][layer, head] += head_detector.compute_head_attention_similarity_score(
                            pattern[head], detection_pattern=detection, exclude_bos=False,
                            exclude_current_token=False, error_measure="mul")
    return {kind: grid / len(tokens) for kind, grid in out.items()}


def agreement(ours: np.ndarray, theirs: np.ndarray, k: int) -> dict:
    """Spearman correlation of two score grids and the share of the top-``k`` heads they have in common.

    >>> a = np.array([[0.9, 0.1], [0.5, 0.2]])
    >>> agreement(a, a * 2, k=2)
    {'spearman': 1.0, 'top_k': 2, 'top_k_overlap': 1.0}
    """
    k = min(k, int(np.isfinite(np.asarray(ours, dtype=float)).sum()))
    mine = set(top_heads(ours, k))
    overlap = len(mine & set(top_heads(theirs, k))) / k
    return {"spearman": spearman(ours, theirs), "top_k": k, "top_k_overlap": overlap}


def transformer_lens_reference(handle: ModelHandle, tokens: torch.Tensor, scores: dict, k: int) -> dict:
    """``{"scores": TL's grids, "agreement": {kind: agreement}}`` for a ``detect`` report."""
    theirs = transformer_lens_scores(handle, tokens)
    return {"detector": "transformer_lens.head_detector (error_measure='mul')",
            "scores": {kind: grid_list(grid, handle.anatomy) for kind, grid in theirs.items()},  # None: no such head
            "agreement": {kind: agreement(np.asarray(scores[kind], dtype=float), theirs[kind], k)
                          for kind in TL_PATTERNS}}
