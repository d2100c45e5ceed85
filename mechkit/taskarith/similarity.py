"""Estimates of the task correlation α between two task vectors.

The seeds define α = μ_T1ᵀ μ_T2 (> 0 aligned, < 0 contradictory, = 0 irrelevant) and estimate it for
real models as α̂ = E_X[Sim(f(X; Ψ1), f(X; Ψ2))]. We report three numbers:

- ``weight_cosine``: cos(τ_1, τ_2) of the flattened task vectors;
- ``output_cosine``: the seeds' estimate with Sim = cosine of the two fine-tuned models' next-token
  probability distributions at the last prompt token, averaged over prompts X of both tasks. It is
  never negative (probabilities are), so it separates aligned from unrelated tasks but cannot show
  contradiction;
- ``output_shift_cosine``: Sim = cosine of the *changes* the two vectors make to the next-token
  log-probabilities, f(X; Ψ0 + τ_i) − f(X; Ψ0), same prompts. Signed: negative when the two
  fine-tunings push the model's predictions in opposite directions (contradictory tasks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.taskarith.apply import arithmetic
from mechkit.taskarith.vector import TaskVector

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@torch.no_grad()
def last_token_logprobs(handle: ModelHandle, texts: Sequence[str], batch_size: int = 16) -> torch.Tensor:
    """``[len(texts), vocab]`` next-token log-probabilities after each text (right-padded batches)."""
    tok = handle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    out = []
    for start in range(0, len(texts), batch_size):
        rows = [tok(t)["input_ids"] for t in texts[start:start + batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        logits = handle(ids, attention_mask=mask.to(handle.device)).float()
        last = torch.tensor([len(r) - 1 for r in rows], device=logits.device)
        out.append(torch.log_softmax(logits[torch.arange(len(rows)), last], -1).cpu())
    return torch.cat(out)


def _mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())


def task_correlation(handle: ModelHandle, a: TaskVector, b: TaskVector, texts: Sequence[str],
                     scale_a: float = 1.0, scale_b: float = 1.0, allow_other_base: bool = False) -> dict[str, float]:
    """α̂ three ways (see the module docstring) for Ψ1 = Ψ0 + scale_a·a and Ψ2 = Ψ0 + scale_b·b.

    Both vectors must be of this model's base unless ``allow_other_base`` (see :mod:`.apply`).
    """
    with arithmetic(handle, allow_other_base=allow_other_base) as ta:
        base = last_token_logprobs(handle, texts)
        ta.set((a, scale_a))
        one = last_token_logprobs(handle, texts)
        ta.set((b, scale_b))
        two = last_token_logprobs(handle, texts)
    return {"weight_cosine": a.cosine(b),
            "output_cosine": _mean_cosine(one.exp(), two.exp()),
            "output_shift_cosine": _mean_cosine(one - base, two - base)}


__all__ = ["last_token_logprobs", "task_correlation"]
