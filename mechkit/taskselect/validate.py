"""Validation: fine-tune a LoRA copy on each condition's tasks and score the target's held-out prompts.

One *unit* is one fine-tune (a :class:`~mechkit.taskselect.conditions.Condition` at one seed, or one
candidate alone for the transfer study) followed by exact match on the target's held-out prompts,
zero-shot and few-shot. Units are independent: :func:`finetune_units` runs on any executor (this
process, or Ray workers that each load the model once), each unit's result is kept as a step when it
arrives, and a unit checkpoints its training (``checkpoint_every``) so an interrupted one resumes.

Every unit trains ``steps`` AdamW steps of ``batch_size`` prompts drawn from a pool of exactly
``budget`` training examples split over its tasks: the sample budget is the same in every condition.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass(frozen=True)
class TrainConfig:
    """What every validation fine-tune shares (recorded in the report)."""

    target: str
    steps: int = 30
    budget: int = 240
    batch_size: int = 8
    lr: float = 1e-3
    rank: int = 8
    lora_alpha: float = 16.0
    eval_n: int = 40
    eval_shots: tuple[int, ...] = (0, 3)
    eval_seed: int = 0
    checkpoint_every: int = 10

    def as_dict(self) -> dict:
        d = asdict(self)
        d["eval_shots"] = list(self.eval_shots)
        return d


def unit_key(tasks: tuple[str, ...], counts: tuple[int, ...], seed: int, config: TrainConfig) -> str:
    """A step key naming everything that decides the unit's result (short: hashed)."""
    text = repr((tasks, counts, seed, sorted(config.as_dict().items())))
    return f"ft-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def training_rows(handle: ModelHandle, tasks: tuple[str, ...], counts: tuple[int, ...], seed: int) -> list:
    """Exactly ``counts[i]`` encoded zero-shot training prompts of ``tasks[i]`` (data seed per unit seed)."""
    from mechkit.eval.scoring import encode
    from mechkit.tasks import build_prompts

    rows = []
    for task, count in zip(tasks, counts, strict=True):
        if count:
            rows += [encode(handle.tokenizer, p.text, p.answer, p.terminator)
                     for p in build_prompts(task, n=count, shots=0, seed=1000 + seed)]
    return rows


def held_out(config: TrainConfig) -> dict[str, list]:
    """The target's evaluation prompts per shot count (``eval_seed``; no training set holds the target)."""
    from mechkit.tasks import build_prompts

    return {f"{s}-shot": build_prompts(config.target, n=config.eval_n, shots=s, seed=config.eval_seed)
            for s in config.eval_shots}


def run_unit(handle: ModelHandle, unit: dict, config: TrainConfig, checkpoints: str | None) -> dict[str, Any]:
    """Fine-tune (LoRA) on the unit's tasks, then score the target: ``{"0-shot": acc, ..., "loss": [...]}``."""
    from mechkit.eval.scoring import score_prompts
    from mechkit.model import load_model
    from mechkit.taskarith.finetune import Recipe, finetune

    tasks, counts, seed = tuple(unit["tasks"]), tuple(unit["counts"]), unit["seed"]
    scored = handle
    losses: list[float] = []
    if tasks:
        recipe = Recipe(task=",".join(tasks), steps=config.steps, lr=config.lr, method="lora", rank=config.rank,
                        lora_alpha=config.lora_alpha, batch_size=config.batch_size, seed=seed,
                        data_seed=1000 + seed, pool=sum(counts), eval_n=config.eval_n, eval_seed=config.eval_seed)
        where = Path(checkpoints) / unit_key(tasks, counts, seed, config) if checkpoints else None
        trained = finetune(handle, recipe, checkpoint=where, checkpoint_every=config.checkpoint_every,
                           rows=training_rows(handle, tasks, counts, seed))
        scored, losses = load_model(trained.model, tokenizer=handle.tokenizer), trained.losses
    scores = {name: score_prompts(scored, prompts).accuracy for name, prompts in held_out(config).items()}
    return {**scores, "loss_first": _mean(losses[:3]), "loss_last": _mean(losses[-3:])}


def finetune_units(handle: ModelHandle, shared: tuple, units: list):
    """Executor unit function: one :func:`run_unit` per unit, in order (module level, so Ray imports it)."""
    config, checkpoints = shared
    config = config if isinstance(config, TrainConfig) else TrainConfig(**{**config,
                                                                           "eval_shots": tuple(config["eval_shots"])})
    for unit in units:
        yield run_unit(handle, unit, config, checkpoints)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's ρ: the Pearson correlation of average ranks (ties share their mean rank); None when
    either side is constant or has fewer than three points.

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 35]), spearman([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """
    import numpy as np

    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: list[float]):
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for v in np.unique(values):  # ties: the mean of their ranks
        same = values == v
        ranks[same] = ranks[same].mean()
    return ranks


__all__ = ["TrainConfig", "finetune_units", "held_out", "run_unit", "spearman", "training_rows", "unit_key"]
