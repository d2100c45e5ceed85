"""Budget mode: the plan that keeps the most calibration accuracy within a cost budget.

The budget is a fraction of the dense model's cost on this machine: measured forward latency
(median, interleaved with the dense model) or analytic FLOPs per token. For each *mix* of unit
types (a direction such as "MLP channels only" or "channels and heads together"), a bisection on
the sparsity finds the smallest pruning whose cost is within budget (a physical sliced copy is
timed at every step); each mix's plan is then scored on the calibration prompts (masked, so no
held-out prompt is ever used) and the best is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.pruning.cost import flops_per_token, latency, timing_reference
from mechkit.pruning.masking import masked
from mechkit.pruning.plan import UnitsToRemove
from mechkit.pruning.slicing import prune_copy

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.calibration import Calibration

MIXES: dict[str, dict[str, float]] = {
    "neurons": {"neurons": 1.0},
    "neurons+heads": {"neurons": 1.0, "heads": 1.0},
    "layers": {"layers": 1.0},
    "neurons+layers": {"neurons": 1.0, "layers": 0.5},
    "all": {"neurons": 1.0, "heads": 1.0, "layers": 0.5},
}


@dataclass
class Candidate:
    mix: str
    sparsity: dict[str, float]
    cost_ratio: float
    calib_accuracy: float | None = None
    plan: UnitsToRemove | None = None


def cost_ratio_fn(handle: ModelHandle, unit: str, timing_texts: Sequence[str], repeats: int = 5,
                  last: bool = True) -> Callable:
    """A function plan → cost of the pruned model as a fraction of the dense model's (latency against
    :func:`~mechkit.pruning.cost.timing_reference`: a dispatched model's plain copy where it fits)."""
    dense_flops = flops_per_token(handle)
    timed: list = []

    def ratio(plan: UnitsToRemove, stats) -> float:
        pruned = prune_copy(handle, plan, stats)
        if unit == "flops":
            return flops_per_token(pruned) / dense_flops
        if not timed:
            timed.append(timing_reference(handle)[0])
        dense_t, pruned_t = latency([timed[0], pruned], timing_texts, repeats=repeats, last=last)
        return pruned_t / dense_t

    return ratio


def _mixes(targets: Sequence[str]) -> dict[str, dict[str, float]]:
    return {name: mix for name, mix in MIXES.items() if set(mix) <= set(targets)}


def _cost(plan: UnitsToRemove, stats, cost: Callable) -> float:
    """``cost(plan, stats)``, or the dense model's whole cost (1) for a plan that removes nothing: its measured
    "speedup" is timing noise, and a 0.999 budget was "met" by a row that pruned nothing (every layer protected)."""
    return cost(plan, stats) if any(plan.counts().values()) else 1.0


def search(plan_for: Callable[[dict], UnitsToRemove], stats, budget: float, targets: Sequence[str], cost: Callable,
           accuracy: Callable, steps: int = 6, on_step: Callable | None = None) -> list[Candidate]:
    """One candidate per mix of ``targets``: the least pruning within ``budget`` (``plan_for(sparsity)``
    builds the plan, ``cost(plan, stats)`` measures it), with its calibration accuracy
    (``accuracy(plan)``). Mixes that cannot reach the budget come back with their best cost."""
    out = []
    for name, mix in _mixes(targets).items():
        lo, hi, best = 0.0, 0.9, None
        for _ in range(steps):
            mid = (lo + hi) / 2
            sparsity = {t: min(mid * w, 0.95) for t, w in mix.items()}
            plan = plan_for(sparsity)
            r = _cost(plan, stats, cost)
            if on_step:
                on_step(name, sparsity, r)
            if r <= budget:
                best, hi = Candidate(name, sparsity, r, plan=plan), mid
            else:
                lo = mid
        if best is None:
            sparsity = {t: min(hi * w, 0.95) for t, w in mix.items()}
            plan = plan_for(sparsity)
            best = Candidate(name, sparsity, _cost(plan, stats, cost), plan=plan)
        if best.cost_ratio <= budget:
            best.calib_accuracy = accuracy(best.plan)
        out.append(best)
    return out


def masked_accuracy(handle: ModelHandle, calib: Calibration, batch_size: int = 16,
                    prune: Callable[[UnitsToRemove], ModelHandle] | None = None) -> Callable:
    """plan → mean exact-match accuracy over the calibration prompts' tasks, on the masked model, or on
    ``prune(plan)`` where masking cannot say what the pruned model computes (least-squares refits)."""
    from mechkit.eval.scoring import score_prompts

    by_task: dict[str, list] = {}
    for p in calib.prompts:
        by_task.setdefault(p.task, []).append(p)

    def mean(model: ModelHandle) -> float:
        values = [score_prompts(model, ps, batch_size=batch_size).accuracy for ps in by_task.values()]
        return sum(values) / len(values)

    def acc(plan: UnitsToRemove) -> float:
        if prune is not None:
            return mean(prune(plan))
        with masked(handle, plan, calib.stats):
            return mean(handle)

    return acc
