"""A fingerprint of a model's weights that survives a change of dtype: a few values of each tensor.

A task vector records the sha256 of the base it was extracted from, but a hash compares only within one
dtype (a bfloat16 copy of float32 weights hashes differently). Across dtypes the base check fell back to the
architecture, so a vector of one model was applied to any other model of the same shape loaded in another
dtype (``taskvec sweep --dtype bfloat16``), silently. The first few values of each tensor, compared with a
tolerance wider than bfloat16's rounding, tell the same weights in two dtypes from other weights.

>>> import torch
>>> w = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
>>> v = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
>>> ours = {"w": tensor_probe(w), "n": tensor_probe(torch.ones(8))}
>>> probes_differ(ours, {"w": tensor_probe(w.bfloat16()), "n": tensor_probe(torch.ones(8))})
False
>>> probes_differ(ours, {"w": tensor_probe(v), "n": tensor_probe(torch.ones(8) * 2)})
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

VALUES = 4  # values per tensor: the first of its first row
_REL, _ABS = 2e-2, 1e-4  # wider than bfloat16's rounding (2**-8) and float16's flushed tiny values


def tensor_probe(tensor: Any) -> list[float]:
    """The first :data:`VALUES` values of the tensor's first row, as float32 numbers rounded for JSON."""
    if tensor.dim() == 0:
        return []
    row = tensor[0] if tensor.dim() >= 2 else tensor
    return [float(f"{float(x):.6g}") for x in row.reshape(-1)[:VALUES].float().tolist()]


def weights_probe(named: Iterable[tuple[str, Any]]) -> dict[str, list[float]]:
    """``{name: tensor_probe}`` for every floating-point tensor of ``named`` (finite values only)."""
    out = {}
    for name, tensor in named:
        if getattr(tensor, "is_floating_point", lambda: False)() and tensor.dim() > 0:
            values = tensor_probe(tensor.detach())
            if values and all(math.isfinite(v) for v in values):
                out[name] = values
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _REL * max(abs(a), abs(b)) + _ABS


def probes_differ(a: Mapping | None, b: Mapping | None) -> bool | None:
    """Whether two probes are of other weights: a tensor both name differs beyond rounding (the same weights in
    two dtypes agree on every value within it; a model whose blocks were renumbered by pruning layers differs
    only in the blocks after the gap). ``None`` where they cannot tell (a side without a probe, no tensor in
    common)."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    common = [k for k in a if k in b and isinstance(a[k], list) and isinstance(b[k], list) and len(a[k]) == len(b[k])]
    if not common:
        return None
    differ = sum(not all(isinstance(x, int | float) and isinstance(y, int | float) and _close(x, y)
                         for x, y in zip(a[k], b[k], strict=True)) for k in common)
    return differ > 0
