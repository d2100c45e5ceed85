"""A norm's scale, read and frozen: what the logit lens and direct logit attribution divide by.

A LayerNorm or RMSNorm divides the residual stream by a per-position scale (the standard deviation,
or the root mean square) before its learned weight. TransformerLens records that scale as
``hook_scale``; mechkit derives it from the norm's input with the norm's own epsilon, whichever kind
the family uses (LayerNorm centres first, RMSNorm does not; Gemma's weight offset lives in
:meth:`mechkit.model.anatomy.Anatomy.final_norm_scale`). :func:`frozen` applies the norm with a given
scale, so the map from the residual stream to the logits becomes linear: the sum of every component's
projection is the real logit.
"""

from __future__ import annotations

import torch
from torch import nn

_EPS_NAMES = ("eps", "variance_epsilon", "variance_eps", "epsilon")


def centres(module: nn.Module) -> bool:
    """True for a LayerNorm (subtracts the mean), False for an RMSNorm."""
    name = type(module).__name__
    return isinstance(module, nn.LayerNorm) or ("LayerNorm" in name and "RMS" not in name)


def epsilon(module: nn.Module) -> float:
    for name in _EPS_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return 1e-5


def scale(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``[..., 1]``: what ``module`` divides ``x`` by (TransformerLens' ``hook_scale``), in float32."""
    x = x.float()
    if centres(module):
        x = x - x.mean(-1, keepdim=True)
    return (x.pow(2).mean(-1, keepdim=True) + epsilon(module)).sqrt()


def frozen(module: nn.Module, x: torch.Tensor, fixed: torch.Tensor, gamma: torch.Tensor | None,
           bias: bool = True) -> torch.Tensor:
    """``module(x)`` with its scale fixed at ``fixed`` (linear in ``x``): ``gamma`` is the effective weight
    (:meth:`~mechkit.model.anatomy.Anatomy.final_norm_scale`); ``bias=False`` leaves a LayerNorm's bias
    out, so a stack of components each gets only its own part."""
    x = x.float()
    if centres(module):
        x = x - x.mean(-1, keepdim=True)
    out = x / fixed.float()
    if gamma is not None:
        out = out * gamma.float()
    b = getattr(module, "bias", None)
    if bias and isinstance(b, torch.Tensor):
        out = out + b.float()
    return out
