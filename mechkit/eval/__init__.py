"""Scoring a model on prompts: batched, teacher-forced exact match equal to greedy decoding's.

- :mod:`~mechkit.eval.scoring` — encode prompt + answer, pad into batches, unembed only the
  answer positions, score exact match and answer log-prob (:func:`score_prompts`); the row-level
  pieces other analyses batch with (:func:`score_rows`, :func:`batches`, :func:`row_metrics`).
- :mod:`~mechkit.eval.evaluation` — seeded prompts per task and the per-task evaluation loop the
  ablation-style analyses share.
- :mod:`~mechkit.eval.conditions` — the conditions of a head experiment (selected vs random heads) and
  the accuracy table over them.
- :mod:`~mechkit.eval.lengths` — every sequence length a head run feeds the model (``--seg-len``,
  ``--prompt``, ``--shots``), checked at once so one refusal names each change.

>>> import mechkit as mk
>>> from mechkit.eval import score_prompts
>>> m = mk.load_model("tiny:llama")
>>> score = score_prompts(m, mk.build_prompts("capitalize", n=4, shots=1))
>>> 0.0 <= score.accuracy <= 1.0 and len(score.correct) == 4
True
"""

from mechkit.eval.evaluation import evaluate, mean_std, reference_tokens, task_prompts
from mechkit.eval.scoring import (
    Batch,
    Encoded,
    TaskScore,
    aggregate,
    batches,
    check_context,
    encode,
    encode_rows,
    forward_kept,
    greedy_exact_match,
    last_logits_only,
    pad_batch,
    pad_id,
    pad_right,
    prompt_ids,
    row_metrics,
    score_prompts,
    score_rows,
    supports_logits_to_keep,
)

__all__ = [
    "Batch",
    "Encoded",
    "TaskScore",
    "aggregate",
    "batches",
    "check_context",
    "encode",
    "encode_rows",
    "evaluate",
    "forward_kept",
    "greedy_exact_match",
    "last_logits_only",
    "mean_std",
    "pad_batch",
    "pad_id",
    "pad_right",
    "prompt_ids",
    "reference_tokens",
    "row_metrics",
    "score_prompts",
    "score_rows",
    "supports_logits_to_keep",
    "task_prompts",
]
