"""Algorithm 1 of seed 000 (§3.3.2, "Consistency-Diversity Task Selection"; also the slides, seed 001).

1. Embed every task and take its mean (and, for coverage, the pooled examples).
2. Sort the candidates by cosine similarity to the target, most similar first: T'_1, …, T'_M.
3. ``L ← {T'_1}``; for i = 2…M: if ``coverage(L ∪ T'_i; T0) ≥ (1 + p)·coverage(L; T0)`` add T'_i,
   otherwise stop.

Besides the selected set, :func:`select_tasks` returns the coverage of every prefix of the sorted
list (the seeds' Figure 8.1(b): the diversity score as tasks are added one by one) and why it stopped.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> target = rng.normal(size=(50, 2))
>>> pool = {"near": rng.normal(size=(50, 2)) + [0.5, 0], "far": rng.normal(size=(50, 2)) + [-9, 0]}
>>> s = select_tasks(target, pool, {k: v.mean(0) + [0, 20] for k, v in pool.items()}, target.mean(0) + [0, 20],
...                  p=0.1, estimator="empirical")
>>> s.selected, s.stop.split(":")[0]
(['near'], 'stopped at far')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from mechkit.errors import MechkitError
from mechkit.taskselect.coverage import cosine, coverage


@dataclass
class Selection:
    """What Algorithm 1 chose and why: ``order`` (candidates by similarity, or the order given),
    ``similarity`` per candidate, ``curve`` (coverage of each prefix of ``order``), ``selected``, ``stop``."""

    order: list[str]
    similarity: dict[str, float]
    curve: list[float]
    selected: list[str]
    stop: str
    p: float
    single: dict[str, float] = field(default_factory=dict)  # coverage({T}; T0) of each candidate alone

    def as_dict(self) -> dict:
        return asdict(self)


def ranking(target_vector: np.ndarray, vectors: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    """Candidates by cosine similarity to the target, most similar first (ties: the order given)."""
    sims = [(name, cosine(target_vector, v)) for name, v in vectors.items()]
    return sorted(sims, key=lambda item: -item[1])


def prefix_curve(target_points: np.ndarray, points: dict[str, np.ndarray], order: Sequence[str],
                 estimator: str) -> list[float]:
    """``coverage(T'_1..T'_k; T0)`` for k = 1…M: the pooled examples of the first k tasks."""
    mu0 = np.asarray(target_points, dtype=np.float64).mean(0)
    pooled: list[np.ndarray] = []
    curve = []
    for name in order:
        pooled.append(np.asarray(points[name], dtype=np.float64))
        curve.append(coverage(np.concatenate(pooled), mu0, estimator))
    return curve


def greedy_stop(order: Sequence[str], curve: Sequence[float], p: float) -> tuple[list[str], str]:
    """Lines 3–6 of Algorithm 1 on a precomputed prefix curve: keep adding while the coverage grows by
    at least the factor 1 + p; the first task that does not stops the loop (and is named)."""
    if p <= 0:
        raise MechkitError(f"the threshold p must be above 0, got {p}", "pass e.g. --p 0.1")
    if not order:
        raise MechkitError("the candidate pool is empty", "pass candidate tasks with --pool")
    for i in range(1, len(order)):
        if not curve[i] >= (1 + p) * curve[i - 1]:
            return list(order[:i]), (f"stopped at {order[i]}: coverage {curve[i]:.4g} < (1 + p)·{curve[i - 1]:.4g} "
                                     f"= {(1 + p) * curve[i - 1]:.4g}")
    return list(order), "the pool ran out: every candidate raised the coverage by the factor 1 + p"


def select_tasks(target_points: np.ndarray, points: dict[str, np.ndarray], vectors: dict[str, np.ndarray],
                 target_vector: np.ndarray, p: float = 0.1, estimator: str = "ledoit-wolf",
                 order: Sequence[str] | None = None) -> Selection:
    """Algorithm 1. ``points[T]`` ``[n, d]`` are a task's examples (coverage), ``vectors[T]`` its
    similarity vector (the mean, PC1 or a task vector). ``order`` replaces the similarity order (the
    *No Con.* ablation: a random order, the same stopping rule)."""
    sims = dict(ranking(target_vector, vectors))
    order = list(order) if order is not None else list(sims)
    curve = prefix_curve(target_points, points, order, estimator)
    selected, stop = greedy_stop(order, curve, p)
    mu0 = np.asarray(target_points, dtype=np.float64).mean(0)
    single = {name: coverage(points[name], mu0, estimator) for name in order}
    return Selection(order=order, similarity=sims, curve=curve, selected=selected, stop=stop, p=p, single=single)


__all__ = ["Selection", "greedy_stop", "prefix_curve", "ranking", "select_tasks"]
