"""Task selection for multitask fine-tuning by consistency and diversity (seed 000 Ch. 3, Algorithm 1).

To adapt a model to a target task with little labelled data, fine-tune it first on other tasks that
are *consistent* with the target (similar in the model's feature space: cosine similarity of task
means) and *diverse* (their pooled examples cover the target: the inverse squared Mahalanobis distance
of the target mean). Modules, one concept each:

- :mod:`~mechkit.taskselect.coverage` — cosine similarity, shrinkage covariance, coverage;
- :mod:`~mechkit.taskselect.representations` — hidden states, first principal component, activation task vector,
  per-example LoRA gradients;
- :mod:`~mechkit.taskselect.gradients` — ``lora-grad``: the weight-space task vector of one SGD step, per example;
- :mod:`~mechkit.taskselect.select` — Algorithm 1 and its coverage curve;
- :mod:`~mechkit.taskselect.pool` — the target and its candidate pool, checked before a model loads;
- :mod:`~mechkit.taskselect.conditions` — Table 3.1's conditions at an equal sample budget;
- :mod:`~mechkit.taskselect.validate` — the LoRA fine-tune units and Spearman's ρ;
- :mod:`~mechkit.taskselect.study` — the study for one target;
- :mod:`~mechkit.taskselect.findings` — the finding sentence, tables and figures;
- :mod:`~mechkit.taskselect.rho` — ρ of an existing report's transfer gains under any representation.
"""

from mechkit.taskselect.conditions import METHODS, Condition, conditions, split_budget
from mechkit.taskselect.coverage import cosine, covariance, coverage, mahalanobis2
from mechkit.taskselect.pool import default_pool, resolve_pool
from mechkit.taskselect.select import Selection, select_tasks

__all__ = ["METHODS", "Condition", "Selection", "conditions", "cosine", "covariance", "coverage", "default_pool",
           "mahalanobis2", "resolve_pool", "select_tasks", "split_budget"]
