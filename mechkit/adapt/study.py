"""The adaptive-inference study: calibrate plans, costs and a signal; measure them on held-out prompts.

:class:`AdaptStudy` does, for one model and a set of tasks (calibration prompts at a seed offset,
held-out prompts never used for calibration):

1. **guides** — per task, the importance of every block, every block's attention and every MLP by a
   guide mechkit already has (``ablation``: the exact drop of the answer log-prob when that unit
   alone is bypassed, the clean prefix reused; ``attribution``: first-order estimates;
   ``induction``: attribution, but blocks holding the top induction / previous-token heads keep
   their attention), and their mean over tasks for the static order;
2. **cost table** — plans timed against the dense model on this machine, a
   :class:`~mechkit.adapt.cost.CostTable` fitted on them and validated on other plans and prompts,
   and the noise of the measurement itself (the dense model timed against itself);
3. **margin** — split-conformal (:mod:`mechkit.adapt.conformal`): calibration prompts the cost
   table was not fitted on are timed against the dense model exactly as held-out inputs are, each
   under plans spanning the predicted ratios; the margin is the ``⌈(n+1)·q⌉/n`` quantile of
   measured − predicted, so a share ``q`` (``adherence``) of inputs measure within their budget;
   ``margin`` given by hand skips this; then (``debias``) the plans the scheduler chooses on the
   calibration prompts are timed the same way, each gets its median residual as a bias added to its
   prediction, and the margin is recalibrated on the de-biased residuals (:meth:`AdaptStudy.debiased`);
4. **candidates** — units ranked by importance per saved latency (static and per task); for every
   budget, order and token option (none, or keep a share after layer K) the plan that bypasses the
   fewest of the order's units to fit the budget minus the margin; each scored on the calibration
   prompts (static plans on every task, a task's plans on that task);
5. **signal** — which task a prompt is, from the residual after an early block (logistic
   regression; cross-validated on calibration prompts);
6. **held-out** — for every budget and held-out prompt, the adaptive scheduler's plan and the best
   static plan: exact-match accuracy, and latency measured per input against the dense model (and
   the dense model against itself: the per-input noise); adherence strictly by measurement, with
   the dense plan counted as within any budget ≥ 1 (it *is* the reference: its measured ratio is
   pure noise), and within the measured noise; budgets no plan fits are reported as infeasible;
7. **static pruning** at the same budget (:class:`mechkit.pruning.PruneStudy`), where asked.

Each stage is a module (:mod:`~mechkit.adapt.guides`, :mod:`~mechkit.adapt.costing`,
:mod:`~mechkit.adapt.margin`, :mod:`~mechkit.adapt.candidates`, :mod:`~mechkit.adapt.signal`,
:mod:`~mechkit.adapt.heldout`, :mod:`~mechkit.adapt.static_prune`); :class:`AdaptStudy` holds what they
share (the :class:`~mechkit.adapt.config.AdaptConfig`, the prompts, the memo) and runs them in order.
Expensive steps go through ``step(key, compute)`` (a plugin passes its resumable ``ctx.step``);
their values are JSON-able.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> config = AdaptConfig(n_calib=3, n=2, shots=1, repeats=1, timing_prompts=1, token_options=((0, 0.5),),
...                       signal_layer=0, adherence=0.5, margin_prompts=1, margin_plans=2)
>>> study = AdaptStudy(m, ["capitalize", "past-tense"], config)
>>> out = study.run([0.8, 1.0])
>>> [r["budget"] for r in out["rows"]], 0 <= out["rows"][0]["adaptive"]["mean_accuracy"] <= 1
([0.8, 1.0], True)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mechkit.adapt.candidates import CandidateStage
from mechkit.adapt.config import CALIB_SEED_OFFSET, MARGIN_PROMPTS, AdaptConfig, Step, compute_now
from mechkit.adapt.conformal import check_adherence, residuals_needed
from mechkit.adapt.cost import CostTable, resolve_clock
from mechkit.adapt.costing import CostStage
from mechkit.adapt.guides import GuideStage
from mechkit.adapt.heldout import HeldOutStage
from mechkit.adapt.margin import MarginStage
from mechkit.adapt.scheduler import Scheduler
from mechkit.adapt.signal import SignalStage
from mechkit.adapt.static_prune import PruneStage
from mechkit.eval.evaluation import task_prompts
from mechkit.eval.scoring import check_texts_context

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


class AdaptStudy(GuideStage, CostStage, MarginStage, CandidateStage, SignalStage, HeldOutStage, PruneStage):
    """Calibration and held-out measurement of adaptive execution plans (see the module doc).

    ``config`` is an :class:`~mechkit.adapt.config.AdaptConfig` (what the plugin builds from its options);
    keywords instead build one (``AdaptStudy(m, tasks, n_calib=3)``), as scripts written before it do.
    ``step`` is the run's resumable step (a plugin's ``ctx.step``).
    """

    def __init__(self, handle: ModelHandle, tasks: Sequence[str], config: AdaptConfig | None = None, *,
                 step: Step = compute_now, **settings: Any):
        config = dataclasses.replace(config or AdaptConfig(), **settings).check(handle.anatomy.n_layers)
        self.config = config
        self.adherence = check_adherence(config.adherence)
        self.handle, self.tasks, self.guide, self.seed = handle, list(tasks), config.guide, config.seed
        self.token_options = [(int(k), float(keep)) for k, keep in config.token_options]
        self.signal_layer, self.protect_top_k = config.signal_layer, config.protect_top_k
        self.repeats, self.timing_prompts = config.repeats, config.timing_prompts
        self.margin, self.min_cv = config.margin, config.min_cv
        self.batch_size, self.step, self.debias = config.batch_size, step, bool(config.debias)
        self.clock = resolve_clock(handle, config.clock)
        self.select = config.select
        self._prompts(config)
        check_texts_context(handle, [p.text + p.answer + getattr(p, "terminator", "\n") for ps in (  # as scored
            *self.calib.values(), *self.test.values()) for p in ps] + [x for xs in self.margin_pool.values() for x in xs])
        lengths = [len(handle.tokenizer(p.text)["input_ids"]) for ps in self.calib.values() for p in ps]
        self.typical_tokens = int(statistics.median(lengths))
        self._cost: CostTable | None = None
        self._scheduler: Scheduler | None = None
        self._memo: dict[str, Any] = {}
        self.cost_report: dict = {}
        self.margin_report: dict = {}

    def _prompts(self, config: AdaptConfig) -> None:
        """Calibration, margin and held-out prompts (:func:`study_prompts`); a task left no held-out prompt is
        refused here, before any work (the plugin refuses it before the model loads: :func:`check_heldout`)."""
        self.calib, self.margin_pool, self.margin_texts, self.test = study_prompts(self.tasks, config, self.seed)
        self.margin_prompts, self.margin_plan_count = config.margin_prompts, config.margin_plans
        self.n_calib, self.shots = config.n_calib, config.shots

    def _once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``step(key, compute)``, kept in memory for the rest of the study."""
        if key not in self._memo:
            self._memo[key] = self.step(key, compute)
        return self._memo[key]

    def run(self, budgets: Sequence[float], prune_budgets: Sequence[float] = (),
            prune_targets: Sequence[str] = ("neurons",), prune_reconstruct: str = "lsq") -> dict:
        budgets = sorted(float(b) for b in budgets)
        sched = self.scheduler(budgets)
        held = self.heldout(budgets)
        matched = {r["budget"]: r["adaptive"]["latency_ratio"] for r in held["rows"]}
        prune = (self.prune_rows(prune_budgets, prune_targets, matched=matched, reconstruct=prune_reconstruct)
                 if prune_budgets else [])
        by_budget = {r["budget"]: r for r in prune}
        for row in held["rows"]:
            row["prune"] = by_budget.get(row["budget"])
        sig = sched.signal
        return {
            "tasks": self.tasks, "budgets": budgets, "guide": self.guide,
            "calibration_prompts_per_task": self.n_calib,
            "heldout_prompts": {t: len(ps) for t, ps in self.test.items()},
            "signal": {"layer": self.signal_layer, "cv_accuracy": sig.cv_accuracy if sig else None,
                       "trusted": sched.adaptive_ok, "min_cv": self.min_cv},
            "margin": sched.margin, "adherence_target": self.adherence, "margin_calibration": self.margin_report,
            "infeasible_budgets": [r["budget"] for r in held["rows"] if not r["feasible"]],
            "cost": self.cost_report, "dense": held["dense"], "rows": held["rows"],
            "input_noise": held["input_noise"], "pooled_adherence": held["pooled_adherence"], "select": sched.select,
            "protected_layers": self.protected_layers(),
            "orders": {src: [f"{k} {i}" for k, i in units] for src, units in self.orders().items()},
            "candidates": [{"plan": c.plan.label(), "source": c.source, "accuracy": c.accuracy,
                            "predicted_ratio": sched.predicted(c.plan, self.typical_tokens), "bias": c.bias}
                           for c in sched.candidates],
            "scheduler": sched.as_dict(),
        }


def draw_prompts(tasks: Sequence[str], config: AdaptConfig, seed: int) -> tuple[dict, dict, dict, set]:
    """Calibration prompts, the margin's prompt pool and the texts it times first, and every text the held-out
    prompts must not repeat: disjoint, drawn at a calibration seed, on text alone (no model).

    With ``margin_prompts`` left to the study (None) as many margin prompts are drawn as ``adherence``
    could need, one plan per prompt; the first :data:`MARGIN_PROMPTS` per task are timed, more only
    where the model offers fewer distinct plans (:meth:`MarginStage.margin_calibration`). All drawn are
    kept out of the held-out prompts, so timing more later never tests on a calibration prompt."""
    shots, timing_prompts, margin_prompts = config.shots, config.timing_prompts, config.margin_prompts
    calib = task_prompts(tasks, config.n_calib, shots, seed + CALIB_SEED_OFFSET)
    drawn_n = margin_prompts or MARGIN_PROMPTS
    if margin_prompts is None and config.margin is None:
        drawn_n = max(drawn_n, math.ceil(residuals_needed(config.adherence) / max(1, len(tasks))))
    # the margin's prompts: calibration-seeded, past the ones the cost table is fitted on
    fitted = {p.text for ps in calib.values() for p in ps[:timing_prompts]}
    extra = 0  # a later draw repeating a fitted prompt is dropped: draw on until every task has drawn_n
    while True:
        drawn = task_prompts(tasks, timing_prompts + drawn_n + extra, shots, seed + CALIB_SEED_OFFSET)
        pool = {t: [p.text for p in ps if p.text not in fitted][:drawn_n] for t, ps in drawn.items()}
        if all(len(xs) == drawn_n for xs in pool.values()) or extra > drawn_n:
            break
        extra += timing_prompts + 8
    texts = {t: xs[:margin_prompts or MARGIN_PROMPTS] for t, xs in pool.items()}
    seen = {p.text for ps in calib.values() for p in ps} | {x for xs in pool.values() for x in xs}
    return calib, pool, texts, seen


def study_prompts(tasks: Sequence[str], config: AdaptConfig, seed: int) -> tuple[dict, dict, dict, dict]:
    """``(calibration, margin pool, margin texts, held-out)`` prompts of a study (:func:`draw_prompts`, then the
    held-out ones that repeat none of them), on text alone; a task left no held-out prompt is refused
    (:func:`refuse_empty_heldout`)."""
    calib, pool, texts, seen = draw_prompts(tasks, config, seed)
    test = {t: [p for p in ps if p.text not in seen] for t, ps in task_prompts(tasks, config.n, config.shots, seed).items()}
    if not all(test.values()):
        refuse_empty_heldout(tasks, config, seed, test, seen)
    return calib, pool, texts, test


def check_heldout(tasks: Sequence[str], settings: dict, seed: int) -> None:
    """Refuse, before the model loads, a study whose prompts leave a task no held-out prompt: the prompts are
    drawn from text and the seed alone, so ``mechkit adapt --n 1 --shots 0`` was refused only once the model
    had loaded (minutes for a large one). The same line as :class:`AdaptStudy` says. ``settings``: the
    :class:`AdaptConfig` fields among them (the plugin's options; the rest, read only with the model, ignored)."""
    fields = {f.name for f in dataclasses.fields(AdaptConfig)} - {"seed"}
    study_prompts(tasks, AdaptConfig(**{k: v for k, v in settings.items() if k in fields}), seed)


def _left(tasks: Sequence[str], n: int, shots: int | None, seed: int, seen: set) -> bool:
    """Every task keeps a held-out prompt out of ``n`` drawn."""
    return all(any(p.text not in seen for p in ps) for ps in task_prompts(tasks, n, shots, seed).values())


def refuse_empty_heldout(tasks: Sequence[str], config: AdaptConfig, seed: int, test: dict, seen: set) -> None:
    """Refuse, before any work, a study that leaves a task no held-out prompt: held-out prompts equal to a
    calibration or margin prompt are dropped, and with small pools (``--shots 0``: the query alone) all ``n``
    can be. Its accuracy was NaN, refused as if the model had NaN weights after the whole study, or, with one
    task, numpy's error on an empty array. Each fix named is tried first: the smallest ``n`` that leaves every
    task a prompt (drawn whole at that ``n``), and one demonstration per prompt (``shots=1``)."""
    from mechkit.errors import MechkitError

    empty = [t for t in tasks if not test[t]]
    fixes = []
    wide = task_prompts(tasks, config.n + 200, config.shots, seed)  # drawn in order: a prefix is a smaller --n
    firsts = [next((i + 1 for i, p in enumerate(ps) if p.text not in seen), None) for ps in wide.values()]
    if None not in firsts and _left(tasks, max(firsts), config.shots, seed, seen):
        fixes.append(f"--n {max(firsts)} (n={max(firsts)}) or more")
    if not config.shots:
        one = dataclasses.replace(config, shots=1)
        if _left(tasks, config.n, 1, seed, draw_prompts(tasks, one, seed)[3]):
            fixes.append("--shots 1 (shots=1: demonstrations make each prompt its own)")
    fixes.append("another --seed" if fixes else "a larger --n or --shots, or another --seed")
    raise MechkitError(f"no held-out prompt is left for {', '.join(empty)}: the {config.n} drawn per task (--n "
                       f"{config.n}, seed {seed}) repeat calibration or margin prompts, which the test keeps out",
                       f"pass {', or '.join(fixes)}")
