"""Stage 3. the budget margin: split-conformal on calibration prompts timed as held-out inputs, then de-biased.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import numpy as np

from mechkit.adapt.conformal import ConformalMargin, calibrate_margin, require_residuals, residuals_needed
from mechkit.adapt.cost import prompt_ids, time_interleaved
from mechkit.adapt.measures import unit_plan
from mechkit.adapt.plan import ExecutionPlan, run_plan
from mechkit.adapt.tokens import TokenSelection
from mechkit.errors import MechkitError


class MarginStage:
    """The budget margin of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def margin_plan_set(self, budgets: Sequence[float]) -> list[ExecutionPlan]:
        """Up to ``margin_plans`` plans spanning the predicted ratios candidates take (from 0.3 below
        the lowest budget to the highest, dense included), evenly by predicted ratio: the static
        order cut to each target, without and with every token option. They do not depend on the
        margin, so the margin can be calibrated before the candidates that depend on it."""
        table, n = self.cost_table(), self.typical_tokens
        order = self.orders()["static"]
        targets = np.linspace(min(1.0, max(budgets)), max(0.0, min(budgets) - 0.3), 25)  # high to low
        pool: dict[str, ExecutionPlan] = {}
        for t in [None, *(TokenSelection(k, keep) for k, keep in self.token_options)]:
            usable = [u for u in order if t is None or u[1] != t.layer or u[0] == "mlp"]
            s = 0
            for target in targets:  # cutting more units never costs more: s only grows
                while s <= len(usable) and table.predict(unit_plan(usable[:s], t, "margin"), n) > target:
                    s += 1
                if s > len(usable):
                    break
                plan = unit_plan(usable[:s], t, "margin")
                pool.setdefault(plan.key(), plan)
        ranked = sorted(pool.values(), key=lambda p: table.predict(p, n))
        picks = np.unique(np.round(np.linspace(0, len(ranked) - 1, min(self.margin_plan_count, len(ranked)))))
        return [ranked[int(i)] for i in picks]

    def margin_calibration(self, budgets: Sequence[float]) -> tuple[ConformalMargin | None, dict]:
        """The split-conformal margin and its report: each margin prompt timed dense and under
        :meth:`margin_plan_set`, paired with dense, exactly as a held-out input is timed
        (:func:`~mechkit.adapt.cost.time_interleaved`); residual = measured − predicted ratio. With
        ``margin`` given: that value, nothing timed. One resumable step per prompt."""
        if self.margin is not None:
            return None, {"method": "given", "value": self.margin, "q": None}
        self.check_margin_sample()
        table = self.cost_table()
        plans = self.margin_plan_set(budgets)
        self._check_plan_count(len(plans))  # fewer distinct plans than --margin-plans: known before any timing
        per_plan, forwards, spent = self._time_plans(plans, "margin-time")
        residuals = [r for v in per_plan for r in v]
        lengths = [n for t in self.tasks for n in self.margin_lengths()[t]]
        predicted = [table.predict(p, n) for p in plans for n in lengths]
        margin = calibrate_margin(residuals, self.adherence, predicted)
        if not margin.finite:
            raise MechkitError(f"{margin.n} calibration residuals ({len(plans)} plans on "
                               f"{sum(map(len, self.margin_texts.values()))} prompts) cannot give a conformal margin "
                               f"for {self.adherence:g} adherence: it needs at least {residuals_needed(self.adherence)}",
                               "raise --margin-prompts, lower --adherence, or give --margin")
        self._memo["margin-groups"] = {p.key(): v for p, v in zip(plans, per_plan, strict=True)}
        r = np.asarray(residuals)
        report = {"method": "conformal", **margin.as_dict(), "prompts": sum(map(len, self.margin_texts.values())),
                  "plans": [{"plan": p.label(), "predicted": table.predict(p, self.typical_tokens),
                             "median_residual": float(np.median(v)), "max_residual": float(np.max(v))}
                            for p, v in zip(plans, per_plan, strict=True)],
                  "residuals": {"min": float(r.min()), "median": float(np.median(r)),
                                "p95": float(np.percentile(r, 95)), "max": float(r.max())},
                  "forwards": forwards, "seconds": spent}
        return margin, report

    def _time_plans(self, plans: Sequence[ExecutionPlan], kind: str) -> tuple[list[list[float]], int, float]:
        """``plans`` timed on every margin prompt against dense (one resumable step per prompt, keyed by
        the plan set): per plan its residuals (measured − table-predicted ratio), the forwards and seconds."""
        table = self.cost_table()
        digest = hashlib.sha256("|".join(p.key() for p in plans).encode()).hexdigest()[:12]
        per_plan: list[list[float]] = [[] for _ in plans]
        spent, forwards = 0.0, 0
        for task in self.tasks:
            for i, text in enumerate(self.margin_texts[task]):
                timed = self.step(f"adapt|{kind}|{task}|{i}|{self.timing_tag}|{digest}",
                                  lambda text=text: self._time_margin_input(plans, text))
                spent += timed["spent_s"]
                forwards += (len(plans) + 1) * self.repeats
                dense = timed["seconds"]["dense"]
                for j, plan in enumerate(plans):
                    per_plan[j].append(timed["seconds"][f"plan {j}"] / dense - table.predict(plan, timed["n_tokens"]))
        return per_plan, forwards, spent

    def _check_plan_count(self, n_plans: int) -> None:
        """Before the margin prompts are timed: a model that offers fewer distinct plans than
        ``--margin-plans`` asks (a tiny model has 3 to 7) gets as many more margin prompts as ``--adherence``
        needs when their number was left to the study, and is refused, naming the number, when it was given.
        It was refused after the timing, saying to raise --margin-prompts without saying how far."""
        import math

        n_prompts = sum(map(len, self.margin_texts.values()))
        needed = residuals_needed(self.adherence)
        if n_plans * n_prompts >= needed or n_plans == 0:
            return
        per_task = math.ceil(needed / (n_plans * max(1, len(self.margin_texts))))
        if self.margin_prompts is None and all(len(xs) >= per_task for xs in self.margin_pool.values()):
            self.margin_texts = {t: xs[:per_task] for t, xs in self.margin_pool.items()}
            self._memo.pop("margin-lengths", None)
            return
        raise MechkitError(f"this model offers {n_plans} distinct plans for the margin (--margin-plans asks "
                           f"{self.margin_plan_count}): {n_prompts} margin prompts × {n_plans} plans give "
                           f"{n_plans * n_prompts} residuals, and a conformal margin for {self.adherence:g} adherence "
                           f"needs at least {needed}",
                           f"pass --margin-prompts {per_task} (margin_prompts={per_task}) or more, or leave "
                           "--margin-prompts out (the study times as many as the model's plans need), lower "
                           "--adherence, or give --margin")

    def check_margin_sample(self) -> None:
        """Before any timing: margin prompts × plans too few for a finite conformal margin grow to what
        ``--adherence`` needs when their number was left to the study (``margin_prompts=None``, as documented:
        2 tasks × 4 prompts × 10 plans are 80 residuals of the 99 that 0.99 needs, so 5 per task), and are
        refused, naming a number of prompts that suffices on any model, when it was given
        (:meth:`~mechkit.adapt.config.AdaptConfig.check_margin_sample`: the number once named assumed
        ``margin_plans`` distinct plans, and was refused again on a model offering fewer)."""
        if self.margin is not None:
            return
        import math

        if self.margin_prompts is not None:  # given: what the settings alone decide (the plugin said it before the load)
            self.config.check_margin_sample(len(self.tasks))
            return
        n_prompts = sum(map(len, self.margin_texts.values()))
        needed = residuals_needed(self.adherence)
        if n_prompts * self.margin_plan_count >= needed:
            return
        per_task = math.ceil(needed / (self.margin_plan_count * max(1, len(self.margin_texts))))
        if all(len(xs) >= per_task for xs in self.margin_pool.values()):
            self.margin_texts = {t: xs[:max(per_task, len(self.margin_texts[t]))] for t, xs in self.margin_pool.items()}
            self._memo.pop("margin-lengths", None)
            return
        require_residuals(n_prompts * self.margin_plan_count, self.adherence,
                          f"{n_prompts} margin prompts × {self.margin_plan_count} plans")

    def _time_margin_input(self, plans: Sequence[ExecutionPlan], text: str) -> dict:
        start = time.perf_counter()
        ids = prompt_ids(self.handle, text)
        makers = [("dense", lambda: run_plan(self.handle))]
        makers += [(f"plan {j}", lambda p=p: run_plan(self.handle, p)) for j, p in enumerate(plans)]
        seconds, _ = time_interleaved(self.handle, ids, makers, self.repeats, self.clock)
        return {"n_tokens": int(ids.shape[1]), "seconds": seconds, "spent_s": time.perf_counter() - start}

    def margin_value(self, budgets: Sequence[float]) -> float:
        """The scheduler's margin: given, or calibrated (kept for the rest of the study)."""
        if "margin" not in self._memo:
            margin, self.margin_report = self.margin_calibration(budgets)
            self._memo["margin"] = self.margin if margin is None else margin.value
        return self._memo["margin"]
