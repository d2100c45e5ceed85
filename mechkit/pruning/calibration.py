"""Calibration: the prompts every guide scores units on, and the unit statistics measured on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.pruning.stats import UnitStats, collect_stats

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

CALIB_SEED_OFFSET = 1000  # calibration prompts never share a seed with held-out ones


@dataclass
class Calibration:
    """Calibration prompts of the chosen tasks and the unit statistics measured on them."""

    tasks: list[str]
    prompts: list
    stats: UnitStats

    @property
    def texts(self) -> list[str]:
        return [p.text + p.answer for p in self.prompts]


def calibrate(handle: ModelHandle, tasks: Sequence[str], n: int = 16, shots: int | None = 10, seed: int = 0,
              setting: str | None = None) -> Calibration:
    """Build ``n`` calibration prompts per task (seed offset from the held-out ones) and their stats."""
    from mechkit.eval.evaluation import task_prompts

    by_task = task_prompts(list(tasks), n, shots, seed + CALIB_SEED_OFFSET, setting)
    prompts = [p for ps in by_task.values() for p in ps]
    return Calibration(list(tasks), prompts, collect_stats(handle, [p.text + p.answer for p in prompts]))
