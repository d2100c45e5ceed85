"""Calibration statistics of prunable units: per-channel and per-head activation moments, and block
influence, gathered in one hooked pass over calibration prompts (padding excluded)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mechkit.hooking.core import hooks

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass
class UnitStats:
    """Per layer: MLP channel mean / second moment ``[d_mlp]``, head output mean / second moment
    ``[n_heads, d_head]``, and block influence 1 − cos(block input, block output) (ShortGPT)."""

    mlp_mean: torch.Tensor  # [n_layers, d_mlp]
    mlp_sq: torch.Tensor
    head_mean: torch.Tensor  # [n_layers, n_heads, d_head]
    head_sq: torch.Tensor
    block_influence: torch.Tensor  # [n_layers]
    n_tokens: int

    @property
    def mlp_var(self) -> torch.Tensor:
        return (self.mlp_sq - self.mlp_mean ** 2).clamp_min(0)

    @property
    def mlp_norm(self) -> torch.Tensor:
        """‖X_j‖₂ over calibration tokens (Wanda's activation norm), per channel."""
        return (self.mlp_sq * self.n_tokens).sqrt()

    @property
    def head_var(self) -> torch.Tensor:
        return (self.head_sq - self.head_mean ** 2).clamp_min(0)

    def mixed(self, other: UnitStats, weight: float) -> UnitStats:
        """The moments of a mixture: ``other``'s tokens weigh ``weight`` in all, these ``1 − weight``
        (whatever the token counts); ``n_tokens`` is both counts together."""
        def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (1 - weight) * a + weight * b

        return UnitStats(mix(self.mlp_mean, other.mlp_mean), mix(self.mlp_sq, other.mlp_sq),
                         mix(self.head_mean, other.head_mean), mix(self.head_sq, other.head_sq),
                         mix(self.block_influence, other.block_influence), self.n_tokens + other.n_tokens)


def encode(handle: ModelHandle, texts: Sequence[str]) -> dict:
    """Padded ids and attention mask of ``texts``, each cut to the model's context where it has one."""
    limit = handle.context_length
    extra = {"truncation": True, "max_length": limit} if limit else {}
    return handle.tokenizer(list(texts), return_tensors="pt", padding=True, **extra)


def collect_stats(handle: ModelHandle, texts: Sequence[str], batch_size: int = 8) -> UnitStats:
    """One pass over ``texts`` accumulating float64 moments of every layer's MLP channels and heads."""
    a = handle.anatomy
    L = a.n_layers
    acc = {"mlp": torch.zeros(L, a.d_mlp, dtype=torch.float64), "mlp2": torch.zeros(L, a.d_mlp, dtype=torch.float64),
           "head": torch.zeros(L, a.n_heads, a.d_head, dtype=torch.float64),
           "head2": torch.zeros(L, a.n_heads, a.d_head, dtype=torch.float64),
           "infl": torch.zeros(L, dtype=torch.float64)}
    n_tokens = 0
    for start in range(0, len(texts), batch_size):
        enc = encode(handle, texts[start:start + batch_size])
        ids, attn = enc["input_ids"].to(handle.device), enc["attention_mask"].to(handle.device)
        mask = attn.bool()
        pre: dict[int, torch.Tensor] = {}

        def moments(x, point, key, mask=mask):
            v = x[mask].double().cpu()
            acc[key][point.layer] += v.sum(0)
            acc[key + "2"][point.layer] += (v * v).sum(0)

        def keep_pre(x, point, mask=mask, pre=pre):
            pre[point.layer] = x[mask].double()

        def influence(x, point, mask=mask, pre=pre):
            cos = torch.nn.functional.cosine_similarity(pre.pop(point.layer), x[mask].double(), dim=-1)
            acc["infl"][point.layer] += (1 - cos).sum().cpu()

        fns = {**{name: (lambda x, p: moments(x, p, "mlp")) for name in neuron_points(handle.anatomy)},
               "blocks.*.attn.hook_z": lambda x, p: moments(x, p, "head"),
               "blocks.*.hook_resid_pre": keep_pre, "blocks.*.hook_resid_post": influence}
        with torch.no_grad(), hooks(handle, fns):
            handle(ids, attention_mask=attn)
        n_tokens += int(mask.sum())
    n = max(n_tokens, 1)
    return UnitStats(acc["mlp"] / n, acc["mlp2"] / n, acc["head"] / n, acc["head2"] / n, acc["infl"] / n, n_tokens)


def neuron_points(anatomy) -> list[str]:
    """The MLP-neuron hook point, where the model has dense MLP neurons; none for a mixture of experts (its
    units are experts: neuron targets are refused, and head and layer pruning need no neuron statistics)."""
    return [] if anatomy.is_moe else ["blocks.*.mlp.hook_post"]
