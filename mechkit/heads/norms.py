"""Per-head norms of the attention output projection: how large a residual write each head can make."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange

from mechkit.model.modules.linear import weight_out_in


def head_out_norms(handle: Any) -> list[list[float | None]]:
    """``[n_layers][n_heads]``: the Frobenius norm of each head's block of W_O (its input columns).

    Each layer is split by its own head count and head size: a pruned layer that kept fewer heads has
    fewer, and its cells past them hold ``None`` (a report's "no such head", left blank in the heatmap)
    (split by the widest layer's count, its W_O would be cut into blocks that are not heads).

    Reads weights: on a remote model run it through :func:`mechkit.model.backends.weight_reads.read_weights`.

    >>> import mechkit as mk
    >>> norms = head_out_norms(mk.load_model("tiny:gpt2"))
    >>> len(norms), len(norms[0]), all(v > 0 for row in norms for v in row)
    (2, 4, True)
    """
    a = handle.anatomy
    rows = []
    with torch.no_grad():
        for layer in range(a.n_layers):
            w = rearrange(weight_out_in(a.attn_out(layer)).float(), "m (h d) -> m h d", h=a.heads_in(layer))
            norms = w.pow(2).sum(dim=(0, 2)).sqrt().tolist()
            rows.append(norms + [None] * (a.n_heads - len(norms)))
    return rows
