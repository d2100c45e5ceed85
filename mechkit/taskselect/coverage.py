"""Consistency and diversity as numbers: cosine similarity of task means and coverage of the target.

Seed 000 §3.3.2 (the thesis proposal, cited in the docs' Background page) views each task's
representations as a Gaussian N(μ_T, C_T) and reduces

- *consistency* to similarity: ``CosSim(T0, Ti) = μ_T0ᵀ μ_Ti / (‖μ_T0‖ ‖μ_Ti‖)``;
- *diversity* to coverage: the covariance ellipsoid of the pooled fine-tuning data D covers the
  target mean iff ``(μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0) ≤ 1``, so
  ``coverage(D; T0) = 1 / ((μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0))``, the inverse squared Mahalanobis
  distance of μ_T0 from D.

A few dozen examples in 576 dimensions give a singular sample covariance, so C_D is estimated with
shrinkage: scikit-learn's Ledoit–Wolf by default (``"ledoit-wolf"``), or OAS (``"oas"``). Shrinkage
pulls C_D towards a multiple of the identity, which is *not* invariant to a linear change of
features; the exact formula (``"empirical"``, needing more examples than dimensions) is, and the
tests check that identity on it.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> d = rng.normal(size=(400, 3))
>>> d = (d - d.mean(0)) / d.std(0)  # mean 0, variance 1 along each axis
>>> round(coverage(d, np.array([2.0, 0.0, 0.0]), "empirical"), 2)  # 1/2² up to the sample's correlations
0.25
"""

from __future__ import annotations

import numpy as np

from mechkit.errors import MechkitError

ESTIMATORS = ("ledoit-wolf", "oas", "empirical")


def covariance(points: np.ndarray, estimator: str = "ledoit-wolf") -> np.ndarray:
    """``[d, d]`` covariance of ``points`` ``[n, d]`` by the named estimator (sample covariance, 1/n)."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or len(points) < 2:
        raise MechkitError(f"a covariance needs at least 2 points, got {len(points)}",
                           "use more examples per task (--n)")
    if estimator == "ledoit-wolf":
        from sklearn.covariance import LedoitWolf

        return LedoitWolf(assume_centered=False).fit(points).covariance_
    if estimator == "oas":
        from sklearn.covariance import OAS

        return OAS(assume_centered=False).fit(points).covariance_
    if estimator == "empirical":
        centred = points - points.mean(0)
        return centred.T @ centred / len(points)
    raise MechkitError(f"unknown covariance estimator {estimator!r}", f"use one of {', '.join(ESTIMATORS)}")


def mahalanobis2(points: np.ndarray, target_mean: np.ndarray, estimator: str = "ledoit-wolf") -> float:
    """``(μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0)`` with μ_D, C_D from ``points`` (a solve, never an inverse)."""
    points = np.asarray(points, dtype=np.float64)
    delta = points.mean(0) - np.asarray(target_mean, dtype=np.float64)
    cov = covariance(points, estimator)
    try:
        solved = np.linalg.solve(cov, delta)
    except np.linalg.LinAlgError:
        raise MechkitError(f"the covariance of {len(points)} points in {points.shape[1]} dimensions is singular",
                           singular_fix(estimator)) from None
    return float(delta @ solved)


def singular_fix(estimator: str) -> str:
    """The fix for a singular covariance: a shrinkage estimator where another one ran, else more examples
    (the estimator named was already the one used: following that fix changed nothing).

    >>> singular_fix("empirical")
    'use --estimator ledoit-wolf or oas (shrinkage), or more examples per task (--n)'
    >>> singular_fix("ledoit-wolf")
    'use more examples per task (--n), or --estimator oas'
    """
    if estimator not in SHRINKAGE:
        return "use --estimator ledoit-wolf or oas (shrinkage), or more examples per task (--n)"
    other = next(e for e in SHRINKAGE if e != estimator)
    return f"use more examples per task (--n), or --estimator {other}"


SHRINKAGE = ("ledoit-wolf", "oas")


def coverage(points: np.ndarray, target_mean: np.ndarray, estimator: str = "ledoit-wolf") -> float:
    """Seed 000 §3.3.2: ``coverage(D; T0) = 1 / ((μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0))`` (inf when μ_D = μ_T0)."""
    m2 = mahalanobis2(points, target_mean, estimator)
    return float("inf") if m2 <= 0 else 1.0 / m2


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Seed 000 §3.3.2: ``CosSim(T0, Ti) = μ_T0ᵀ μ_Ti / (‖μ_T0‖₂ ‖μ_Ti‖₂)`` (0 for a zero vector)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else 0.0


def similarity_matrix(vectors: dict[str, np.ndarray]) -> tuple[list[str], list[list[float]]]:
    """Every pair's cosine similarity: the task-similarity heatmap (seed 000 Figure 8.4's shape)."""
    names = list(vectors)
    return names, [[cosine(vectors[a], vectors[b]) for b in names] for a in names]


__all__ = ["ESTIMATORS", "cosine", "coverage", "covariance", "mahalanobis2", "similarity_matrix"]
