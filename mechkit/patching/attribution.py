"""Attribution patching: every patch of one hook point estimated from one forward and one backward pass.

Nanda (2023), "Attribution Patching: Activation Patching At Industrial Scale": to first order, patching
activation ``a`` of the target run with the source's ``a'`` changes the metric by
``(a' − a) · ∂metric/∂a``, the gradient taken on the target run. Summing that product over the patched
slice (one position of the residual stream, or one head at every position) gives the estimate of every
cell of :func:`~mechkit.patching.scan.scan`'s grid at once: one forward and one backward on the target,
one forward on the source, for every layer and every unit together.

It is exact where the metric is linear in the activation, and degrades where a patch moves the run far
(a whole residual stream at an early layer, through many nonlinearities). That is why a run that uses it
also reports its rank agreement with exact patching (:func:`agreement`), as ``sweep`` does for heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.hooking.core import gradients
from mechkit.patching.patch import source_cache
from mechkit.patching.scan import Metric, PatchScan, base_metric, column_labels, padded
from mechkit.patching.source_checks import (
    checked_answer_pos,
    checked_metric,
    checked_real,
    checked_rows,
    checked_target,
    source_act,
)

if TYPE_CHECKING:
    from mechkit.hooking.core import Cache
    from mechkit.model.handle import ModelHandle

# Which dims of the (source − target) · grad product each unit sums over, by the point's layout.
_SUMMED = {
    "pattern": {"position": (1, 3), "head": (2, 3)},   # [batch, heads, query, key]: a position is a query
    "heads": {"position": (2, 3), "head": (1, 3)},     # [batch, pos, heads, d_head]
    "stream": {"position": (2,)},                      # [batch, pos, d]
}


def attribute(handle: ModelHandle, target: torch.Tensor, source: Cache | torch.Tensor, point: str, metric: Metric,
              over: str = "position", answer_pos: int = -1) -> tuple[torch.Tensor, float]:
    """``([n_layers, n], metric(target))``: the first-order estimate of :func:`~mechkit.patching.scan.scan`'s
    grid (the metric after each single patch of ``blocks.L.{point}`` from ``source`` into ``target``).

    >>> import mechkit as mk
    >>> from mechkit.patching import logit_diff
    >>> m = mk.load_model("tiny:llama")
    >>> metric = lambda logits: logit_diff(logits, 5, 6)
    >>> est, base = attribute(m, m.to_tokens("ab"), m.to_tokens("ba"), "hook_resid_pre", metric)
    >>> est.shape
    torch.Size([2, 2])
    """
    if over not in ("position", "head"):
        raise MechkitError(f"over={over!r} is not position or head", "use over='position' or over='head'")
    checked_metric(metric, "attribute")
    names = [f"blocks.{L}.{point}" for L in range(handle.anatomy.n_layers)]
    target = checked_target(target, "attribute", one_prompt=True)
    pos = checked_answer_pos(answer_pos, target.shape[-1], "attribute") % target.shape[-1]
    cache = source_cache(handle, source, names, "attribute")
    value, found = gradients(handle, names, target, lambda logits: _summed(metric(logits[:, pos])))
    rows = []
    with torch.no_grad():
        for name in names:
            act, grad = found[name]
            src = source_act(cache, name, 1, "attribute")
            if src.shape[1:] != act.shape[1:]:  # broadcast silently (a one-position source) or failed inside torch
                raise MechkitError(f"attribute: the source's {name} is {list(src.shape)}; the target's is "
                                   f"{list(act.shape)}", "give a source prompt of the target's length, recorded on this model")
            delta = (src.to(grad.device, grad.dtype) - act.to(grad.device)) * grad
            rows.append(_unit_sums(delta, name.split(".", 2)[2], over)[0].double().cpu())
    base = float(value)
    return (padded(rows) + base).float(), base


def _summed(values: object) -> torch.Tensor:
    """The metric's value on the target's one row, summed for its gradient; one line where it is no tensor (a
    float raised a raw ``AttributeError`` on ``.sum()``) or no real number (a bool, a complex)."""
    if not isinstance(values, torch.Tensor):
        checked_rows(values, 1, "attribute")  # refuses it, naming what it is
    return checked_real(values, "attribute").sum()


def _unit_sums(delta: torch.Tensor, suffix: str, over: str) -> torch.Tensor:
    layout = "pattern" if suffix == "attn.hook_pattern" else "heads" if delta.dim() == 4 else "stream"
    if over not in _SUMMED[layout]:
        raise MechkitError(f"{suffix} has no head dimension", "use over='position', or a per-head point (attn.hook_z)")
    return delta.sum(dim=_SUMMED[layout][over])


def attribute_patching(handle: ModelHandle, clean: torch.Tensor, corrupted: torch.Tensor, point: str,
                       metric: Metric, over: str = "position", denoising: bool = True,
                       answer_pos: int = -1) -> PatchScan:
    """:func:`~mechkit.patching.scan.denoise` (or ``noise``) estimated by attribution patching: the same
    :class:`~mechkit.patching.scan.PatchScan`, its direction marked ``(attribution)``."""
    target, source = (corrupted, clean) if denoising else (clean, corrupted)
    checked_metric(metric, "attribute")
    checked_answer_pos(answer_pos, checked_target(source, "attribute", one_prompt=True).shape[-1], "attribute")
    values, base = attribute(handle, target, source, point, metric, over=over, answer_pos=answer_pos)
    with torch.no_grad():
        other = base_metric(metric, handle(source)[:, answer_pos], "attribute")
    clean_v, corrupted_v = (other, base) if denoising else (base, other)
    direction = ("denoising" if denoising else "noising") + " (attribution)"
    return PatchScan(point, over, values, clean_v, corrupted_v, direction, column_labels(handle, clean, corrupted, over,
                                                                                  values.shape[1]))


def agreement(exact: torch.Tensor, estimate: torch.Tensor, k: int = 5) -> dict:
    """Spearman rank correlation of two grids and the overlap of their top ``k`` cells (over the cells both
    have: NaN where a pruned layer lacks a head).

    >>> agreement(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 2.0], [4.0, 3.0]]), k=2)
    {'spearman': 0.8, 'top_k': 2, 'top_k_overlap': 1.0}
    """
    from mechkit.heads.effects import spearman

    a, b = exact.flatten().double(), estimate.flatten().double()
    both = ~(a.isnan() | b.isnan())
    a, b = a[both], b[both]
    k = min(k, a.numel())
    top_a, top_b = set(a.argsort(descending=True)[:k].tolist()), set(b.argsort(descending=True)[:k].tolist())
    rho = spearman(a.numpy(), b.numpy())
    return {"spearman": None if rho is None else round(rho, 6), "top_k": k, "top_k_overlap": len(top_a & top_b) / k}
