"""What one shuffle condition measures: the copying signature and the task accuracy with some heads'
weights moved (``mechkit shuffle``; the conditions themselves come from :mod:`mechkit.eval.conditions`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from mechkit.eval.evaluation import evaluate
from mechkit.heads.scores import copy_loss, token_loss
from mechkit.interventions import shuffle_heads

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def shuffle_metrics(handle: ModelHandle, mapping: dict, tokens, prompts: dict, *, component: str, gqa: str,
                    seg_len: int, batch_size: int) -> dict:
    """The loss per position on the held-out repeated ``tokens`` (and on each copy) and ``evaluate``'s
    metrics per task, with ``mapping``'s weights moved ({}: the clean model); the weights are restored after."""
    with shuffle_heads(handle, mapping, component=component, gqa=gqa) if mapping else nullcontext():
        loss = token_loss(handle, tokens, batch_size)
        first, second = copy_loss(loss, seg_len)
        out = {"loss_first_copy": first, "loss_second_copy": second, "loss_per_position": loss.tolist()}
        if prompts:
            out["tasks"] = evaluate(handle, prompts, batch_size)
    return out
