"""ICL task vectors (Hendel et al., 2023, "In-Context Learning Creates Task Vectors").

Run demonstrations plus a dummy query; the residual stream at the last prompt token after block L,
averaged over contexts and dummy queries, is the task vector θ_L. Replacing that position's
residual stream in a *zero-shot* query with θ_L at the right layer (:class:`ResidEdit` with
``mode="replace"``) makes the model do the task without demonstrations.
:func:`icl_task_vectors` extracts θ for every layer at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.eval.scoring import last_logits_only, pad_id, pad_right, prompt_ids
from mechkit.hooking.core import hooks
from mechkit.tasks import build_prompts

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def icl_task_vectors(handle: ModelHandle, task: str, n_contexts: int = 16, shots: int = 10, seed: int = 0,
                     batch_size: int = 8, prompts: Sequence | None = None) -> torch.Tensor:
    """``[n_layers, d_model]``: mean residual stream after each block at the last token of
    demonstrations + a dummy query (the query's own answer is never shown).

    Each prompt has its own demonstrations and dummy query, so the mean runs over both. Pass
    ``prompts`` to use your own contexts instead of ``build_prompts(task, n_contexts, shots, seed)``.
    """
    prompts = build_prompts(task, n=n_contexts, shots=shots, seed=seed) if prompts is None else prompts
    a = handle.anatomy
    total = torch.zeros(a.n_layers, a.d_model, dtype=torch.float64)
    encoded = prompt_ids(handle, prompts)
    keep = last_logits_only(handle)
    for start in range(0, len(encoded), batch_size):
        ids, mask, last = pad_right(encoded[start:start + batch_size], pad_id(handle.tokenizer))
        rows = torch.arange(len(ids))
        taken: dict[int, torch.Tensor] = {}

        def take(x, point, taken=taken, rows=rows, last=last):
            taken[point.layer] = x[rows, last.to(x.device)].detach().double().cpu()

        with torch.no_grad(), hooks(handle, {"blocks.*.hook_resid_post": take}):
            handle(ids.to(handle.device), attention_mask=mask.to(handle.device), **keep)
        for layer, values in taken.items():
            total[layer] += values.sum(0)
    return (total / len(encoded)).float()
