"""Calibration: the prompts every guide scores units on, optional generic text mixed in, and the unit
statistics measured on them.

Task prompts alone calibrate a model for its tasks and can cost it general ability (held-out
perplexity). ``text_weight`` mixes in generic text shipped with Python
(:func:`~mechkit.pruning.cost.calibration_text`, never the held-out text): the unit statistics (the
activation-aware guides' norms, the compensation means) and the reconstruction's least-squares
objective weight the generic tokens by ``text_weight`` and the task tokens by ``1 − text_weight``,
whatever their counts. The gradient and attribution guides can mix their task-prompt scores with the
same scores under the generic text's language-modelling loss, at a weight of their own
(:func:`~mechkit.pruning.pipeline.task_gradient_scores`). Layer sensitivity and the budget search's
accuracy read the task prompts only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mechkit.pruning.stats import UnitStats, collect_stats

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.reconstruct import TokenBatch

CALIB_SEED_OFFSET = 1000  # calibration prompts never share a seed with held-out ones


@dataclass
class Calibration:
    """Calibration prompts of the chosen tasks, generic text (mixed into the statistics and the token
    batches at ``text_weight``), and the unit statistics."""

    tasks: list[str]
    prompts: list
    stats: UnitStats
    generic: list[str] = field(default_factory=list)
    text_weight: float = 0.0

    @property
    def texts(self) -> list[str]:
        return [p.text + p.answer for p in self.prompts]

    def token_batches(self, handle: ModelHandle, batch_size: int = 8) -> list[TokenBatch]:
        """The calibration tokens with their weights (for :func:`~mechkit.pruning.reconstruct.reconstruct`)."""
        from mechkit.pruning.reconstruct import token_batches

        return token_batches(handle, [(self.texts, 1 - self.text_weight), (self.generic, self.text_weight)],
                             batch_size)


def calibrate(handle: ModelHandle, tasks: Sequence[str], n: int = 16, shots: int | None = 10, seed: int = 0,
              setting: str | None = None, text_weight: float = 0.0, n_text: int | None = None) -> Calibration:
    """Build ``n`` calibration prompts per task (seed offset from the held-out ones) and their stats,
    mixed with ``n_text`` chunks of generic text (default: as many as task prompts) at ``text_weight``."""
    from mechkit.eval.evaluation import task_prompts
    from mechkit.pruning.cost import calibration_text

    if not 0 <= text_weight <= 1:
        raise ValueError(f"text_weight {text_weight} is outside [0, 1]")
    by_task = task_prompts(list(tasks), n, shots, seed + CALIB_SEED_OFFSET, setting)
    prompts = [p for ps in by_task.values() for p in ps]
    stats = collect_stats(handle, [p.text + p.answer for p in prompts])
    generic = calibration_text(len(prompts) if n_text is None else n_text)  # also for the guides' text scores
    if text_weight > 0:
        stats = stats.mixed(collect_stats(handle, generic), text_weight)
    return Calibration(list(tasks), prompts, stats, generic, text_weight)
