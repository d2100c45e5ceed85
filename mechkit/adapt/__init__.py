"""Adaptive inference under a latency budget: one model, an execution plan per input, training-free.

A model is a collection of shallower models: an :class:`ExecutionPlan` says which blocks, heads, MLP
channels and context tokens one forward runs, and :func:`run_plan` applies it to the loaded model at
run time (bypass wrappers and hooks, no weight copies), so switching plans costs nothing. Plans come
from mechkit's importance guides; their latency is measured on this machine and predicted by a
calibrated :class:`CostTable`; a :class:`Scheduler` picks, for a budget, the plan with the best
expected accuracy — per input through a cheap early-layer :class:`TaskSignal`, with a static
fallback. :func:`adaptive` runs a model within a budget; :class:`AdaptStudy` measures it all.

- :mod:`~mechkit.adapt.plan` — plans and their run-time application;
- :mod:`~mechkit.adapt.tokens` — token selection after layer K (FastV-style);
- :mod:`~mechkit.adapt.cost` — measured latencies and the calibrated cost table;
- :mod:`~mechkit.adapt.conformal` — the budget margin, calibrated split-conformally for a target adherence;
- :mod:`~mechkit.adapt.scheduler` — budget → plan, the task signal, :func:`adaptive`;
- :mod:`~mechkit.adapt.config` — :class:`AdaptConfig`, what a study is asked to do;
- :mod:`~mechkit.adapt.study` — calibration and held-out measurement (the ``adapt`` plugin's), one
  module per stage: :mod:`~mechkit.adapt.guides`, :mod:`~mechkit.adapt.costing`,
  :mod:`~mechkit.adapt.margin`, :mod:`~mechkit.adapt.candidates`, :mod:`~mechkit.adapt.signal`,
  :mod:`~mechkit.adapt.heldout`, :mod:`~mechkit.adapt.static_prune`, sharing :mod:`~mechkit.adapt.measures`.

>>> import mechkit as mk
>>> from mechkit.adapt import ExecutionPlan, TokenSelection, run_plan
>>> m = mk.load_model("tiny:llama")
>>> plan = ExecutionPlan(tokens=TokenSelection(layer=0, keep=0.5, tail=4))
>>> with run_plan(m, plan) as run:
...     out = m.model.generate(m.to_tokens("input: a b c d e f\\noutput:"), max_new_tokens=3, do_sample=False)
>>> run.log[0]["kept"][0] < 1
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mechkit.lazy import lazy_attributes

if TYPE_CHECKING:
    from mechkit.adapt.config import AdaptConfig
    from mechkit.adapt.conformal import ConformalMargin, calibrate_margin, conformal_quantile
    from mechkit.adapt.cost import CostTable, measure
    from mechkit.adapt.measures import score_plan, signal_features
    from mechkit.adapt.plan import ExecutionPlan, PlanRunner, channel_groups, run_plan
    from mechkit.adapt.scheduler import Candidate, Decision, Scheduler, TaskSignal, adaptive
    from mechkit.adapt.study import AdaptStudy
    from mechkit.adapt.tokens import TokenSelection
    from mechkit.model.handle import ModelHandle

# Imported on first use (PEP 562), so that reading a report's results (its tables, its finding)
# never loads torch through this package.
_MODULES = {  # module -> the names it exports here
    "config": ("AdaptConfig",),
    "conformal": ("ConformalMargin", "calibrate_margin", "conformal_quantile"),
    "cost": ("CostTable", "measure"),
    "measures": ("score_plan", "signal_features"),
    "plan": ("ExecutionPlan", "PlanRunner", "channel_groups", "run_plan"),
    "scheduler": ("Candidate", "Decision", "Scheduler", "TaskSignal", "adaptive"),
    "study": ("AdaptStudy",),
    "tokens": ("TokenSelection",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

DEFAULT_BUDGETS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def calibrate(handle: ModelHandle, tasks: Sequence[str], budgets: Sequence[float] = DEFAULT_BUDGETS,
              **options) -> Scheduler:
    """A scheduler for ``handle`` calibrated on ``tasks`` (see :class:`AdaptStudy` for ``options``):
    candidate plans for ``budgets``, their calibration accuracy, the cost table and the task signal."""
    from mechkit.adapt.study import AdaptStudy

    return AdaptStudy(handle, tasks, **options).scheduler(budgets)


__all__ = ["DEFAULT_BUDGETS", "AdaptConfig", "AdaptStudy", "Candidate", "ConformalMargin", "CostTable", "Decision",
           "ExecutionPlan", "PlanRunner", "Scheduler", "TaskSignal", "TokenSelection", "adaptive", "calibrate", "calibrate_margin",
           "channel_groups", "conformal_quantile", "measure", "run_plan", "score_plan", "signal_features"]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())
