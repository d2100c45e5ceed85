"""Which heads matter: scores on repeated random tokens, and the effect of removing each one.

- :mod:`~mechkit.heads.scores` — induction, previous-token and duplicate-token scores of every
  head (one forward pass, patterns reduced inside the attention hook), OV copying scores.
- :mod:`~mechkit.heads.effects` — the effect of zero-ablating each head on a task's answers:
  exact (replaying only the layers above the head) or attribution patching (one forward and one
  backward), and their rank agreement.

Head names and the ``--heads`` grammar are a primitive the interventions use too, so they live
in :mod:`mechkit.model.headspec` and are re-exported here.

>>> import mechkit as mk
>>> from mechkit import heads
>>> m = mk.load_model("tiny:llama")
>>> tokens = heads.repeated_tokens(m, n_seqs=2, seg_len=5)
>>> grid = heads.head_scores(m, tokens, seg_len=5).scores["induction"]
>>> heads.top_heads(grid, 2)[0] in heads.all_heads(m.anatomy.n_layers, m.anatomy.n_heads)
True
"""

from mechkit.heads.effects import HeadEffects, attribution_effects, exact_effects, spearman
from mechkit.heads.scores import (
    KINDS,
    HeadScores,
    compute_scores,
    copy_loss,
    head_scores,
    load_scores,
    ov_copying_scores,
    repeated_tokens,
    scores_from_report,
    token_loss,
)
from mechkit.model.headspec import Head, all_heads, parse_heads, random_heads, top_heads

__all__ = [
    "KINDS",
    "Head",
    "HeadEffects",
    "HeadScores",
    "all_heads",
    "attribution_effects",
    "compute_scores",
    "copy_loss",
    "exact_effects",
    "head_scores",
    "load_scores",
    "ov_copying_scores",
    "parse_heads",
    "random_heads",
    "repeated_tokens",
    "scores_from_report",
    "spearman",
    "token_loss",
    "top_heads",
]
