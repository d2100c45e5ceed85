"""The budget margin, calibrated: split-conformal on measured latencies, so a target share of inputs fits.

The cost table predicts a plan's latency ratio before running it; what an input then measures also
carries the table's error and the machine's noise (the same input timed twice differs). The
scheduler subtracts a margin ``m`` from every budget, choosing only plans with
``predicted + m ≤ budget``. Split conformal prediction (Vovk et al.; Lei et al. 2018) sets ``m``
from data the table was not fitted on: calibration prompts are timed against the dense model
exactly as held-out inputs are (paired with dense forwards, medians), each under a set of plans spanning the
predicted ratios, and the residuals ``r = measured − predicted`` are sorted. With ``n`` residuals
and the target ``q``, the margin is the ``k = ⌈(n + 1)·q⌉``-th smallest (the
``⌈(n + 1)·q⌉/n`` empirical quantile): for a new (input, plan) pair exchangeable with the
calibration pairs, ``P(r ≤ m) ≥ q`` — at least ``q`` of inputs measure within ``predicted + m``,
hence within the budget. It is infinite when ``k > n`` (fewer than ``q/(1 − q)`` residuals: 99 for
``q = 0.99``), and never below 0 (a table that over-predicts is not a reason to spend more than the
budget).

The guarantee is marginal over (input, plan) pairs drawn like the calibration pairs: the pairs of
one input share its dense timing, so the sample is less independent than ``n`` suggests, and a
machine whose load changes between calibration and use breaks exchangeability. The held-out
report therefore says how many inputs did measure within ``predicted + m`` (the coverage).

**Selection bias.** A scheduler that picks, within a budget, the best plan whose prediction fits
prefers the plans the table *under*-predicts, and may pick plan types the spanning set never timed:
the plans it runs are not exchangeable with the calibration plans. :func:`plan_biases` and
:func:`debiased_residuals` correct for it on the plans actually chosen: each timed plan gets a
bias ``b_p`` (the median of its residuals, added to its prediction), and the margin becomes the
conformal quantile of the residuals with that bias removed. The median of ``k`` prompts is itself
noisy (its standard error is about ``1.25·σ/√k``), and removing a plan's in-sample median from its
own residuals shrinks them: each residual is therefore de-biased by the median of the plan's
*other* residuals (leave-one-out), as a new input is by the median of all ``k``; a plan timed on
fewer than :data:`MIN_BIAS_RESIDUALS` prompts keeps bias 0 and its raw residual.

>>> groups = {"a": [0.05, 0.06, 0.04], "b": [-0.02, 0.0, 0.01], "c": [0.3]}
>>> plan_biases(groups)
{'a': 0.05, 'b': 0.0}
>>> [round(x, 3) for x in debiased_residuals(groups)]  # a: r − median(others); c: one residual, raw
[0.0, 0.015, -0.015, -0.025, 0.005, 0.02, 0.3]

>>> conformal_quantile([0.3, -0.1, 0.0, 0.1, 0.2, -0.2, 0.05, 0.15, -0.05], 0.8)  # k = ⌈10·0.8⌉ = 8th
0.2
>>> margin = calibrate_margin([-0.3, -0.2, -0.1] * 3, 0.7)  # the table over-predicts: clamped to 0
>>> margin.value, margin.quantile, margin.k, margin.n
(0.0, -0.1, 7, 9)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mechkit.errors import MechkitError

MIN_BIAS_RESIDUALS = 2
"""A plan's bias needs residuals from at least this many prompts (a leave-one-out median needs two)."""


def check_adherence(q: float) -> float:
    """``q`` as a float strictly between 0 and 1 (a share of inputs), else a one-line error."""
    try:
        value = float(q)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value < 1:
        raise MechkitError(f"adherence {q!r} is not a share strictly between 0 and 1",
                           "pass a target such as 0.99 (99 % of inputs within the budget)")
    return value


def residuals_needed(q: float) -> int:
    """The fewest residuals whose conformal ``q``-quantile is finite: ``⌈(n + 1)·q⌉ ≤ n``.

    >>> residuals_needed(0.99), residuals_needed(0.9), residuals_needed(0.5)
    (99, 9, 1)
    """
    q = check_adherence(q)
    n = max(1, math.ceil(q / (1 - q) - 1e-9))
    while math.ceil((n + 1) * q - 1e-9) > n:  # floating point at the boundary
        n += 1
    return n


def require_residuals(count: int, q: float, what: str = "", fix: str = "") -> None:
    """Refuse, before any timing, a calibration whose ``count`` residuals cannot give a finite margin
    for ``q`` (see :func:`residuals_needed`); ``what`` says where the count comes from, ``fix`` (where the
    caller knows one that runs) replaces the general one.

    >>> require_residuals(120, 0.99)
    >>> require_residuals(80, 0.99, "2 tasks × 4 prompts × 10 plans")
    Traceback (most recent call last):
    mechkit.errors.MechkitError: 2 tasks × 4 prompts × 10 plans give 80 residuals; a conformal margin for 0.99 adherence needs at least 99 — raise --margin-prompts or --margin-plans, lower --adherence, or give --margin (in Python: margin_prompts=, margin_plans=, adherence= or margin=)
    """
    needed = residuals_needed(q)
    if count < needed:
        raise MechkitError(f"{what + ' give ' if what else ''}{count} residuals; a conformal margin for {q:g} "
                           f"adherence needs at least {needed}",
                           fix or "raise --margin-prompts or --margin-plans, lower --adherence, or give --margin "
                           "(in Python: margin_prompts=, margin_plans=, adherence= or margin=)")


def conformal_quantile(scores: Sequence[float], q: float) -> float:
    """The ``⌈(n + 1)·q⌉``-th smallest of ``scores`` (``inf`` when that exceeds ``n``): the split-
    conformal bound that a new exchangeable score stays under with probability at least ``q``."""
    q = check_adherence(q)
    values = np.sort(np.asarray(list(scores), dtype=float))
    if values.size and not np.all(np.isfinite(values)):
        raise MechkitError("a conformal score is not finite", "time the calibration prompts again")
    k = math.ceil((values.size + 1) * q - 1e-9)
    return float(values[k - 1]) if k <= values.size else math.inf


@dataclass
class ConformalMargin:
    """The calibrated margin and what it rests on: ``value = max(0, quantile)``, the quantile the
    ``k``-th of ``n`` residuals for the target ``q``; ``bins`` the same per predicted-ratio third
    (a diagnostic: residuals that grow with the ratio would want one margin per bin)."""

    value: float
    quantile: float
    q: float
    n: int
    k: int
    bins: list[dict] = field(default_factory=list)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)

    def as_dict(self) -> dict:
        finite = self.finite
        return {"value": self.value if finite else None, "quantile": self.quantile if finite else None,
                "q": self.q, "n": self.n, "k": self.k, "needed": residuals_needed(self.q), "bins": self.bins}


def calibrate_margin(residuals: Sequence[float], q: float, predicted: Sequence[float] | None = None) -> ConformalMargin:
    """The margin for target adherence ``q`` from calibration ``residuals`` (measured − predicted
    latency ratio), clamped to 0; with ``predicted`` also the per-third diagnostic."""
    q = check_adherence(q)
    quantile = conformal_quantile(residuals, q)
    n = len(residuals)
    bins = []
    if predicted is not None and n >= 3:
        r, p = np.asarray(residuals, dtype=float), np.asarray(predicted, dtype=float)
        for part in np.array_split(np.argsort(p, kind="stable"), 3):
            b = conformal_quantile(r[part], q)
            bins.append({"predicted_min": float(p[part].min()), "predicted_max": float(p[part].max()),
                         "n": int(part.size), "median": float(np.median(r[part])), "max": float(r[part].max()),
                         "quantile": b if math.isfinite(b) else None})
    return ConformalMargin(max(0.0, quantile), quantile, q, n, math.ceil((n + 1) * q - 1e-9), bins)


def plan_biases(groups: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Per plan (key → its residuals on the calibration prompts): the median residual, the amount the
    cost table under-predicts that plan; plans with fewer than :data:`MIN_BIAS_RESIDUALS` are left out
    (bias 0)."""
    return {key: float(np.median(r)) for key, r in groups.items() if len(r) >= MIN_BIAS_RESIDUALS}


def debiased_residuals(groups: Mapping[str, Sequence[float]]) -> list[float]:
    """Every residual less its plan's bias estimated without it (the median of the plan's other
    residuals: leave-one-out, so the pooled scores keep the noise of a median from a finite sample);
    a plan with fewer than :data:`MIN_BIAS_RESIDUALS` residuals contributes them raw. The pooled
    list has one score per residual, so the conformal count is unchanged."""
    out: list[float] = []
    for r in groups.values():
        r = [float(x) for x in r]
        if len(r) < MIN_BIAS_RESIDUALS:
            out += r
            continue
        out += [x - float(np.median(r[:i] + r[i + 1:])) for i, x in enumerate(r)]
    return out


def share_lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper–Pearson lower bound on a share from ``k`` of ``n`` inputs: what a measured
    adherence supports. 30 of 30 inputs within the budget supports only ≥ 0.905 at 95 % confidence;
    showing ≥ 0.99 takes 299 of 299.

    >>> round(share_lower_bound(30, 30), 3), round(share_lower_bound(299, 299), 4), share_lower_bound(0, 5)
    (0.905, 0.99, 0.0)
    """
    if n <= 0 or k <= 0:
        return 0.0
    from scipy.stats import beta

    return float(beta.ppf(1 - confidence, k, n - k + 1))

