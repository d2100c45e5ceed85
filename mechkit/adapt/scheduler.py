"""From a latency budget (and the input) to an execution plan.

The :class:`Scheduler` holds candidate plans with their calibration accuracy per task, the
calibrated :class:`~mechkit.adapt.cost.CostTable` that predicts each plan's latency, and optionally
a :class:`TaskSignal`: a logistic regression (scikit-learn) that tells, from the residual stream
after an early block averaged over the prompt, which calibration task a prompt is. For a budget it
keeps the plans whose predicted latency plus a safety margin fits, and picks

- **static**: the plan with the best mean accuracy over all tasks — one plan for every input;
- **adaptive**: the plan with the best accuracy on the task the signal reads from this input.

It falls back to the static plan whenever the signal cannot be trusted: when its cross-validated
accuracy on the calibration prompts is below ``min_cv``, when a row's top probability is below
``min_confidence``, or when the rows of one batch disagree (a batch runs one plan).

The margin is what makes "fits" mean "measures within the budget": :class:`AdaptStudy
<mechkit.adapt.study.AdaptStudy>` sets it by split-conformal calibration
(:mod:`mechkit.adapt.conformal`) for a target adherence, and gives each candidate it timed among the
plans the scheduler chooses a ``bias`` (its median under-prediction) that :meth:`Scheduler.predicted`
adds to the cost table's prediction. The dense plan fits every budget ≥ 1: it
*is* the reference, whatever one measurement of it says. When no plan fits a budget, the budget is
infeasible at that adherence on this machine: the scheduler runs the cheapest plan and its
:class:`Decision` says so (``fits`` false, the reason naming it) — never silently over budget.

The signal costs nothing extra: the early blocks it reads run anyway (no plan skips them), and the
plan is chosen *inside* the forward, right after the signal block (:func:`adaptive`).

>>> import mechkit as mk
>>> from mechkit.adapt import ExecutionPlan
>>> from mechkit.adapt.cost import CostTable
>>> table = CostTable(beta_attn=0.3, beta_mlp=0.6, gamma=0.0, eta=0.0, dense_a=0.0, dense_b=0.001, n_layers=2)
>>> cands = [Candidate(ExecutionPlan(), "static", {"a": 1.0, "b": 1.0}),
...          Candidate(ExecutionPlan(layers=(1,)), "static", {"a": 0.2, "b": 0.6})]
>>> s = Scheduler(cands, table, ["a", "b"], margin=0.0)
>>> s.static(0.6, 50).plan.label(), s.static(1.0, 50).plan.label()
('skip L1', 'dense')
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.adapt.cost import CostTable
from mechkit.adapt.plan import ExecutionPlan, PlanRunner, run_plan
from mechkit.adapt.scheduler_file import SCHEMA, SELECT, check_scheduler_data
from mechkit.errors import MechkitError, single_use

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle



@dataclass
class Candidate:
    """A plan the scheduler may choose: where it came from (``"static"``: the guide's order pooled
    over tasks, or a task id: that task's order) and its calibration accuracy (and answer
    log-prob) on each task it was scored on. ``bias`` is added to the cost table's prediction of
    the plan: the median amount the table under-predicted it when the plan was timed on calibration
    prompts (0: never timed, or not corrected; see :mod:`mechkit.adapt.conformal`)."""

    plan: ExecutionPlan
    source: str
    accuracy: dict[str, float]
    logprob: dict[str, float] = field(default_factory=dict)
    bias: float = 0.0

    def as_dict(self) -> dict:
        return {"plan": self.plan.as_dict(), "source": self.source, "accuracy": self.accuracy,
                "logprob": self.logprob, "bias": self.bias}

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        return cls(ExecutionPlan.from_dict(d["plan"]), d["source"], dict(d["accuracy"]), dict(d.get("logprob", {})),
                   float(d.get("bias", 0.0)))


@dataclass
class TaskSignal:
    """Which task a prompt is, from ``[d_model]`` features after block ``layer``: standardised, then a
    multinomial logistic regression. Stored as arrays (no pickle), so a scheduler file is plain JSON."""

    layer: int
    classes: list[str]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    cv_accuracy: float

    @classmethod
    def fit(cls, features: np.ndarray, labels: Sequence[str], layer: int, seed: int = 0) -> TaskSignal:
        """Fit on calibration features; ``cv_accuracy`` is the stratified k-fold accuracy (k ≤ 5)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_score
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        labels = list(labels)
        classes = sorted(set(labels))
        if len(classes) < 2:
            raise MechkitError("a task signal needs calibration prompts of at least two tasks",
                               "calibrate on two or more tasks, or run the static scheduler")
        X = np.asarray(features, dtype=np.float64)
        k = min(5, min(labels.count(c) for c in classes))
        model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        cv = float(np.mean(cross_val_score(model, X, labels, cv=StratifiedKFold(k, shuffle=True, random_state=seed)))) \
            if k >= 2 else 0.0
        model.fit(X, labels)
        scaler, clf = model[0], model[1]
        coef, intercept = clf.coef_, clf.intercept_
        if len(clf.classes_) == 2:  # binary: sklearn keeps one row; make it a two-class softmax
            coef, intercept = np.vstack([-coef / 2, coef / 2]), np.array([-intercept[0] / 2, intercept[0] / 2])
        return cls(layer, [str(c) for c in clf.classes_], scaler.mean_, scaler.scale_, coef, intercept, cv)

    def proba(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        """``[b, n_classes]`` probabilities."""
        X = features.detach().float().cpu().numpy() if torch.is_tensor(features) else np.asarray(features)
        z = ((X - self.mean) / self.scale) @ self.coef.T + self.intercept
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def as_dict(self) -> dict:
        return {"layer": self.layer, "classes": self.classes, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "intercept": self.intercept.tolist(), "cv_accuracy": self.cv_accuracy}

    @classmethod
    def from_dict(cls, d: dict) -> TaskSignal:
        arr = {k: np.asarray(d[k], dtype=np.float64) for k in ("mean", "scale", "coef", "intercept")}
        return cls(int(d["layer"]), list(d["classes"]), cv_accuracy=float(d["cv_accuracy"]), **arr)


@dataclass
class Decision:
    """What the scheduler chose for one batch, and why."""

    plan: ExecutionPlan
    task: str | None  # the task the plan was chosen for (None: the static plan)
    reason: str
    predicted: float  # predicted latency ratio
    fits: bool  # whether the predicted latency plus the margin is within the budget (False: infeasible)


class Scheduler:
    """Budget → plan, statically or per input (see the module doc).

    ``margin`` is subtracted from every budget before comparing predicted latencies, so measured
    latencies stay within the budget despite prediction error and noise; ``adherence`` is the share
    of inputs it was calibrated to keep within (:func:`mechkit.adapt.conformal.calibrate_margin`;
    ``None``: a margin given by hand, or none — ``margin`` defaults to 0, the predictions taken at
    face value).
    """

    def __init__(self, candidates: Sequence[Candidate], cost: CostTable, tasks: Sequence[str],
                 signal: TaskSignal | None = None, margin: float | None = None, min_cv: float = 0.9,
                 min_confidence: float = 0.6, select: str = "logprob", adherence: float | None = None,
                 model: dict | None = None):
        self.model = dict(model) if model else None  # the structure it was calibrated on (structure_identity)
        if select not in SELECT:
            raise MechkitError(f"unknown selection metric {select!r}", f"use one of: {', '.join(SELECT)}")
        self.candidates, self.cost, self.tasks, self.signal = list(candidates), cost, list(tasks), signal
        self.select = select
        self.margin = 0.0 if margin is None else float(margin)
        if not self.margin >= 0:
            raise MechkitError(f"margin {margin} is negative or not a number", "pass a margin of 0 or more")
        self.adherence = adherence
        self.min_cv, self.min_confidence = min_cv, min_confidence
        if not self.candidates:
            raise MechkitError("a scheduler needs candidate plans", "calibrate with at least one plan")
        self.bias = {c.plan.key(): c.bias for c in self.candidates if c.bias}
        # decide() runs inside the forward it schedules, so its cost is latency: a candidate's predicted
        # ratio (per prompt length) and ranking key (per task set) are computed once, not per decision
        self._cost_memo: dict[tuple[int, int], float] = {}
        self._key_memo: dict[tuple[int, tuple[str, ...]], tuple[float, float]] = {}
        self._pools: dict[str | None, list[Candidate]] = {}

    @property
    def signal_layer(self) -> int:
        """The block after which the plan is chosen (0 without a signal: block 0 always runs)."""
        return self.signal.layer if self.signal is not None else 0

    @property
    def adaptive_ok(self) -> bool:
        """Whether the input signal is trusted (cross-validated accuracy ≥ ``min_cv``)."""
        return self.signal is not None and self.signal.cv_accuracy >= self.min_cv

    def predicted(self, plan: ExecutionPlan, n_tokens: int) -> float:
        """The cost table's latency ratio for ``plan`` plus the plan's calibrated bias (if a candidate has one)."""
        return self.cost.predict(plan, n_tokens) + self.bias.get(plan.key(), 0.0)

    def fits(self, plan: ExecutionPlan, budget: float, n_tokens: int) -> bool:
        """Whether ``plan`` may run under ``budget``: its predicted ratio plus the margin is within
        it, or it is the dense plan and the budget is at least the dense latency."""
        return self._admits(plan, self.predicted(plan, n_tokens), budget)

    def _admits(self, plan: ExecutionPlan, predicted: float, budget: float) -> bool:
        return (plan.is_dense and budget >= 1.0) or predicted + self.margin <= budget

    def feasible(self, budget: float, n_tokens: int) -> bool:
        """Whether any candidate fits ``budget`` on a prompt of ``n_tokens`` (else it is infeasible at
        this margin: the scheduler runs the cheapest plan and says so)."""
        return any(self._fits(c, budget, n_tokens) for c in self.candidates)

    def _cost(self, c: Candidate, n_tokens: int) -> float:
        """:meth:`predicted` for a candidate, memoised."""
        memo = (id(c), n_tokens)
        if memo not in self._cost_memo:
            self._cost_memo[memo] = self.predicted(c.plan, n_tokens)
        return self._cost_memo[memo]

    def _fits(self, c: Candidate, budget: float, n_tokens: int) -> bool:
        """:meth:`fits` for a candidate, on the memoised prediction."""
        return self._admits(c.plan, self._cost(c, n_tokens), budget)

    def _best(self, pool: list[Candidate], tasks: tuple[str, ...], budget: float, n_tokens: int) -> Candidate:
        fitting = [c for c in pool if self._fits(c, budget, n_tokens)]
        if not fitting:  # infeasible: the cheapest plan there is (the Decision says it does not fit)
            return min(pool, key=lambda c: self._cost(c, n_tokens))
        # ties go to the plan that computes more: removing units rarely helps, a tie is noise
        return max(fitting, key=lambda c: (*self._key(c, tasks), self._cost(c, n_tokens)))

    def _key(self, c: Candidate, tasks: tuple[str, ...]) -> tuple[float, float]:
        memo = (id(c), tasks)
        if memo not in self._key_memo:
            acc = float(np.mean([c.accuracy[t] for t in tasks]))
            lp = float(np.mean([c.logprob.get(t, 0.0) for t in tasks]))
            self._key_memo[memo] = (lp, acc) if self.select == "logprob" else (acc, lp)
        return self._key_memo[memo]

    def _pool(self, task: str | None) -> list[Candidate]:
        """The candidates scored on ``task`` (``None``: on every task)."""
        if task not in self._pools:
            need = self.tasks if task is None else [task]
            self._pools[task] = [c for c in self.candidates if all(t in c.accuracy for t in need)]
        return self._pools[task]

    def static(self, budget: float, n_tokens: int) -> Candidate:
        """The best plan on all tasks (mean calibration ``select`` metric, then the other) that fits ``budget``."""
        return self._best(self._pool(None), tuple(self.tasks), budget, n_tokens)

    def for_task(self, task: str, budget: float, n_tokens: int) -> Candidate:
        """The best plan on ``task`` (its calibration ``select`` metric, then the other) that fits ``budget``."""
        return self._best(self._pool(task), (task,), budget, n_tokens)

    def decide(self, features: torch.Tensor | np.ndarray | None, n_tokens: int, budget: float,
               input_adaptive: bool = True) -> Decision:
        """The plan for a batch with early features ``[b, d]`` whose longest prompt has ``n_tokens``."""
        task, reason = None, "static scheduler"
        if input_adaptive and features is not None:
            if not self.adaptive_ok:
                cv = self.signal.cv_accuracy if self.signal is not None else None
                reason = "no trusted signal" + (f" (cross-validated accuracy {cv:.2f} < {self.min_cv})" if cv is not None
                                                else "")
            else:
                proba = self.signal.proba(features)
                picks = {self.signal.classes[i] for i in proba.argmax(1)}
                confident = bool(proba.max(1).min() >= self.min_confidence)
                if len(picks) == 1 and confident:
                    task, reason = picks.pop(), "task signal"
                else:
                    reason = "rows disagree" if len(picks) > 1 else "signal not confident"
        chosen = self.for_task(task, budget, n_tokens) if task else self.static(budget, n_tokens)
        fits = self._fits(chosen, budget, n_tokens)
        if not fits:
            reason += (f"; infeasible: no plan fits the budget {budget:g} after the margin {self.margin:.3f}, "
                       "the cheapest ran")
        return Decision(chosen.plan, task, reason, self._cost(chosen, n_tokens), fits)

    def plans(self) -> list[ExecutionPlan]:
        return [c.plan for c in self.candidates]

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "tasks": self.tasks, "margin": self.margin,
                "adherence": self.adherence,
                "min_cv": self.min_cv, "min_confidence": self.min_confidence, "select": self.select,
                "cost": self.cost.as_dict(),
                "signal": self.signal.as_dict() if self.signal else None,
                "candidates": [c.as_dict() for c in self.candidates],
                **({"model": self.model} if self.model else {})}

    @classmethod
    def from_dict(cls, d: dict) -> Scheduler:
        signal = TaskSignal.from_dict(d["signal"]) if d.get("signal") else None
        return cls([Candidate.from_dict(c) for c in d["candidates"]], CostTable.from_dict(d["cost"]), d["tasks"],
                   signal, d.get("margin"), d.get("min_cv", 0.9), d.get("min_confidence", 0.6),
                   d.get("select", "logprob"), d.get("adherence"), d.get("model"))

    def check_model(self, handle: ModelHandle) -> None:
        """Refuse ``handle`` when the scheduler was calibrated on a model of another structure: its plans
        name layers and heads, its costs and task signal are that model's (one line, before any forward)."""
        if not self.model:
            return
        mine = structure_identity(handle)
        recorded = dict(self.model)
        n = recorded.get("n_layers")
        if isinstance(n, int):  # a file from before per-layer counts were recorded was calibrated on every layer whole
            recorded.setdefault("head_counts", [recorded.get("n_heads")] * n)
            recorded.setdefault("mlp_widths", [recorded.get("d_mlp")] * n)
        diff = [k for k in recorded if k in mine and recorded[k] != mine[k]]
        if diff:
            k = diff[0]
            if k in ("dtype", "device"):
                option = "--dtype" if k == "dtype" else "--device"
                raise MechkitError(f"this scheduler's latency costs were measured with the model on {k} "
                                   f"{recorded[k]}, and this model is on {mine[k]}",
                                   f"load the model with {k}={recorded[k]!r}, or calibrate one with "
                                   f"`mechkit adapt --model ... {option} {mine[k]}`")
            structure = getattr(handle.model, "_mechkit_structure", None)
            why = ("pruned neurons or heads" if structure is not None and (structure.mlp_keep or structure.head_keep)
                   else "fewer than 2 blocks" if isinstance(mine.get("n_layers"), int) and mine["n_layers"] < 2
                   else None)  # a model adapt refuses: "calibrate one on it" could not be done
            raise MechkitError(f"this scheduler was calibrated on another model ({k} {recorded[k]!r}, this model "
                               f"has {mine[k]!r})",
                               f"use it on the model it was calibrated on: `mechkit adapt` cannot calibrate one on a "
                               f"model with {why}, such as this one" if why else
                               "calibrate one on this model with `mechkit adapt --model ...`")

    @classmethod
    def load(cls, path: str | Path) -> Scheduler:
        """A scheduler saved by ``mechkit adapt`` (``scheduler.json`` in its run directory)."""
        from mechkit.io.patharg import path_arg, text_path
        from mechkit.io.runfile import MAX_RUN_FILE_BYTES, read_run_file

        fix = "pass the scheduler.json of a `mechkit adapt` run (or its directory)"
        if text_path(path) is None:  # no path at all: the call named
            path_arg(path, "Scheduler.load", 'Scheduler.load("runs/adapt/scheduler.json")')
        # settled (a killed --force write of its run rolled back), its own regular file (a FIFO had hung), capped
        path, raw = read_run_file(path, MAX_RUN_FILE_BYTES, "scheduler.json", "scheduler", fix)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise MechkitError(f"cannot read a scheduler from {path} ({type(err).__name__}: {err})",
                               "pass the scheduler.json of a `mechkit adapt` run (or its directory)") from None
        check_scheduler_data(data, str(path))  # every field's type and range: a wrong one runs silently wrong
        try:
            sched = cls.from_dict(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise MechkitError(f"cannot read a scheduler from {path} ({type(err).__name__}: {err})",
                               "pass the scheduler.json of a `mechkit adapt` run (or its directory)") from None
        if not isinstance(sched.model, dict) or not sched.model.get("architecture"):
            # its plans name layers and heads of a model it does not say: on any other one they would run silently
            raise MechkitError(f"{path} records no model it was calibrated on, so it cannot be checked against this one",
                               "calibrate a scheduler on this model with `mechkit adapt --model ...` and use its "
                               "scheduler.json")
        return sched


def structure_identity(handle: ModelHandle) -> dict:
    """What a saved artifact tied to one model records and checks: its architecture and shape, layer by layer
    (a pruned model whose widest layer is whole has the dense model's ``n_heads`` and ``d_mlp``) and the
    setting its costs were timed in (:func:`timing_setting`), but not its weights' hash: a scheduler's plans
    and costs hold for another checkpoint of the same shape."""
    config = handle.model.config
    arch = (getattr(config, "architectures", None) or [type(handle.model).__name__])[0]
    a = handle.anatomy
    shape = a.as_dict()
    return {"architecture": arch, "vocab_size": getattr(config, "vocab_size", None),
            **{k: shape[k] for k in ("n_layers", "n_heads", "n_kv_heads", "d_head", "d_model", "d_mlp")},
            "head_counts": list(a.head_counts), "mlp_widths": [a.mlp_width(i) for i in range(a.n_layers)],
            **timing_setting(handle)}


def timing_setting(handle: ModelHandle) -> dict:
    """The dtype and device type the costs were measured in: latency ratios (attention against MLP work,
    per-block overhead) differ between float32 and bfloat16, and between a CPU and a GPU."""
    return {"dtype": str(handle.dtype).removeprefix("torch."), "device": handle.device.type}


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def adaptive(handle: ModelHandle, budget: float | None = None, *, scheduler: Scheduler | str | Path | None = None,
             budget_ms: float | None = None, input_adaptive: bool = True) -> Iterator[PlanRunner]:
    """Run ``handle`` within a latency budget while the context is open: ``budget`` as a fraction of
    the dense model's latency, or ``budget_ms`` milliseconds (through the cost table's dense latency
    for the prompt's length). Each new sequence gets its plan after the scheduler's signal block;
    cached generation keeps it. Yields the :class:`~mechkit.adapt.plan.PlanRunner`, whose ``log``
    says what every sequence ran and which tokens it kept; ``runner.decisions`` says why.

    >>> import mechkit as mk
    >>> from mechkit.adapt import Candidate, CostTable, ExecutionPlan, Scheduler, adaptive
    >>> m = mk.load_model("tiny:llama")
    >>> table = CostTable(beta_attn=0.3, beta_mlp=0.6, gamma=0.0, eta=0.0, dense_a=0.0, dense_b=0.001, n_layers=2)
    >>> s = Scheduler([Candidate(ExecutionPlan(), "static", {"t": 1.0}),
    ...                Candidate(ExecutionPlan(layers=(1,)), "static", {"t": 0.5})], table, ["t"], margin=0.0)
    >>> with adaptive(m, budget=0.6, scheduler=s) as run:
    ...     _ = m(m.to_tokens("input: cat\\noutput:"))
    >>> run.log[0]["label"]
    'skip L1'
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.adaptive")
    if scheduler is None:
        raise MechkitError("adaptive inference needs a scheduler calibrated on this model",
                           "pass scheduler=mechkit.adapt.calibrate(model, tasks) (with margin=0.05, say, for "
                           "one or two tasks) or the scheduler.json of a `mechkit adapt` run")
    if not isinstance(scheduler, (Scheduler, str, os.PathLike)):
        raise MechkitError(f"scheduler must be a Scheduler or the path of a scheduler.json, not "
                           f"{type(scheduler).__name__}", "pass scheduler=mechkit.adapt.calibrate(model, tasks) or "
                           "the scheduler.json of a `mechkit adapt` run (or its directory)")
    if not isinstance(input_adaptive, bool):
        raise MechkitError(f"input_adaptive must be True or False, not {input_adaptive!r}",
                           "pass input_adaptive=False for one static plan per budget, or leave it out")
    sched = scheduler if isinstance(scheduler, Scheduler) else Scheduler.load(scheduler)
    sched.check_model(handle)
    if (budget is None) == (budget_ms is None):
        raise MechkitError("give one latency budget", "pass budget=0.7 (of the dense latency) or budget_ms=...")
    for name, value in (("budget", budget), ("budget_ms", budget_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not value > 0):
            raise MechkitError(f"{name} must be a number above 0, not {value!r}",
                               "pass budget=0.7 (of the dense latency) or budget_ms=...")
    if budget is not None and not budget > 0:
        raise MechkitError(f"budget {budget} is not above 0", "use a fraction of the dense latency like 0.7")
    decisions: list[Decision] = []

    def choose(features: torch.Tensor, lengths: torch.Tensor) -> ExecutionPlan:
        n = int(lengths.max())
        fraction = budget if budget is not None else budget_ms / 1000 / sched.cost.dense_seconds(n)
        decision = sched.decide(features, n, fraction, input_adaptive)
        decisions.append(decision)
        return decision.plan

    with run_plan(handle, ExecutionPlan(), choose=choose, choose_after=sched.signal_layer,
                  candidates=sched.plans()) as runner:
        runner.decisions = decisions
        yield runner
