"""The reference semantics of a plan: the dense model with pruned units masked by hooks.

Removed MLP channels and head outputs read zero, or their calibration mean when the plan
compensates; removed blocks pass their input through unchanged. Cheap (no copy), so guides are
compared and budgets searched on masked models; the sliced model computes exactly the same
function (:mod:`mechkit.pruning.slicing`, tested per family).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from mechkit.hooking.core import hooks

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.pruning.stats import UnitStats


def _fill(x: torch.Tensor, index: torch.Tensor, mean: torch.Tensor | None, dim: int) -> torch.Tensor:
    """``x`` with ``index`` along ``dim`` (channels: -1, heads: 2) set to 0 or to ``mean[index]``."""
    x = x.clone()
    index = index.to(x.device)
    if mean is None:
        x.index_fill_(dim, index, 0.0)
    else:
        values = mean[index].to(x)  # [k] for channels, [k, d_head] for heads
        x.index_copy_(dim, index, values.expand(*x.shape[:2], *values.shape).contiguous())
    return x


@contextlib.contextmanager
def masked(handle: ModelHandle, plan: UnitsToRemove, stats: UnitStats | None = None) -> Iterator[None]:
    """Run ``handle`` as if ``plan`` were applied (hooks; detached on exit, also on error)."""
    if plan.compensate and stats is None:
        raise ValueError("a compensating plan needs calibration statistics (collect_stats)")
    fns: dict[str, object] = {}
    gone = set(plan.layers)
    for layer, removed in plan.mlp.items():
        if removed and layer not in gone:
            idx = torch.tensor(sorted(removed))
            mean = stats.mlp_mean[layer] if plan.compensate else None
            fns[f"blocks.{layer}.mlp.hook_post"] = lambda x, p, idx=idx, mean=mean: _fill(x, idx, mean, -1)
    for layer, removed in plan.heads.items():
        if removed and layer not in gone:
            idx = torch.tensor(sorted(removed))
            mean = stats.head_mean[layer] if plan.compensate else None
            fns[f"blocks.{layer}.attn.hook_z"] = lambda x, p, idx=idx, mean=mean: _fill(x, idx, mean, 2)
    inputs: dict[int, torch.Tensor] = {}
    for layer in gone:
        fns[f"blocks.{layer}.hook_resid_pre"] = lambda x, p: inputs.__setitem__(p.layer, x)
        fns[f"blocks.{layer}.hook_resid_post"] = lambda x, p: inputs.pop(p.layer)
    with hooks(handle, fns):
        yield
