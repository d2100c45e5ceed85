"""Evaluate tasks under an intervention: the loop every ablation-style plugin shares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from mechkit.eval.scoring import score_prompts
from mechkit.tasks import build_prompts

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def task_prompts(tasks: Sequence[str], n: int, shots: int | None, seed: int,
                 setting: str | None = None) -> dict[str, list]:
    """Seeded prompts per task id (validated by the task registry).

    ``setting`` (``simple``, ``composite``, ``composite-in-context``) applies to composite ids such
    as ``capitalize+swap``; simple tasks keep their own default. A setting given where no task is a
    composite is refused: it would silently change nothing.
    """
    if setting is not None and not any("+" in task for task in tasks):
        from mechkit.tasks.prompt import TaskOptionError

        raise TaskOptionError(f"--setting {setting} applies to composite tasks (a+b), and none of "
                              f"{', '.join(tasks)} is one", "drop --setting, or add a composite such as capitalize+swap")
    return {task: build_prompts(task, n=n, shots=shots, seed=seed, setting=setting if "+" in task else None)
            for task in tasks}


def evaluate(handle: ModelHandle, prompts: dict[str, list], batch_size: int = 16) -> dict[str, dict]:
    """``{task: {"accuracy", "logprob", "n"}}`` for the model as it is right now."""
    return {task: score_prompts(handle, ps, batch_size=batch_size).as_dict() for task, ps in prompts.items()}


def reference_tokens(handle: ModelHandle, prompts: dict[str, list], per_task: int = 8) -> torch.Tensor:
    """Token ids of some prompts, cropped to a common length, for mean/resample ablation.

    Cropping (rather than padding) keeps pad tokens out of the reference activations.
    """
    encoded = [handle.text_tokenizer()(p.text)["input_ids"] for ps in prompts.values() for p in ps[:per_task]]
    width = min(len(ids) for ids in encoded)
    return torch.tensor([ids[:width] for ids in encoded], dtype=torch.long)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    t = torch.tensor(list(values), dtype=torch.float64)
    return float(t.mean()), float(t.std(unbiased=False)) if len(t) > 1 else 0.0
