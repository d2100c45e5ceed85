"""Stage 5. the signal and the scheduler: which task a prompt is, and the plans the scheduler chooses.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mechkit.adapt.conformal import calibrate_margin, debiased_residuals, plan_biases, require_residuals
from mechkit.adapt.cost import prompt_ids
from mechkit.adapt.measures import signal_features
from mechkit.adapt.plan import ExecutionPlan
from mechkit.adapt.scheduler import Scheduler, TaskSignal, structure_identity


class SignalStage:
    """The signal and the scheduler of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def signal(self) -> TaskSignal | None:
        """The task signal fitted on the calibration prompts (None for a single task)."""
        if len(self.tasks) < 2:
            return None
        texts = [p.text for t in self.tasks for p in self.calib[t]]
        labels = [t for t in self.tasks for _ in self.calib[t]]
        feats = self._once(f"adapt|signal-features|calib|{self.signal_layer}",
                          lambda: signal_features(self.handle, texts, self.signal_layer, self.batch_size).tolist())
        return TaskSignal.fit(np.asarray(feats), labels, self.signal_layer, self.seed)

    def scheduler(self, budgets: Sequence[float]) -> Scheduler:
        """The scheduler on the first margin's candidates; with ``debias`` (and a calibrated margin),
        rebuilt on the plans it chooses (:meth:`debiased`)."""
        if self._scheduler is None:
            sched = self._build(budgets, self.margin_value(budgets), {})
            if self.debias and self.margin is None:
                sched = self.debiased(sched, budgets)
            self._scheduler = sched
        return self._scheduler

    def _build(self, budgets: Sequence[float], margin: float, bias: dict[str, float]) -> Scheduler:
        return Scheduler(self.candidates(budgets, margin, bias), self.cost_table(), self.tasks, self.signal(),
                         margin, self.min_cv, select=self.select,
                         adherence=self.adherence if self.margin is None else None,
                         model=structure_identity(self.handle))

    def chosen_plans(self, sched: Scheduler, budgets: Sequence[float]) -> dict[str, ExecutionPlan]:
        """The plans ``sched`` chooses for the margin prompts (at their lengths) at every budget: the
        static choice and, when its task signal is trusted, the prompt's task's choice; by key,
        without the dense plan (the reference: its residual is timing noise)."""
        out: dict[str, ExecutionPlan] = {}
        for task in self.tasks:
            for n in self.margin_lengths()[task]:
                for budget in budgets:
                    picks = [sched.static(budget, n)]
                    if sched.adaptive_ok and task in sched.tasks:
                        picks.append(sched.for_task(task, budget, n))
                    for c in picks:
                        if not c.plan.is_dense:
                            out.setdefault(c.plan.key(), c.plan)
        return out

    def margin_lengths(self) -> dict[str, list[int]]:
        """Each task's margin prompts' token counts."""
        if "margin-lengths" not in self._memo:
            self._memo["margin-lengths"] = {t: [int(prompt_ids(self.handle, x).shape[1]) for x in xs]
                                            for t, xs in self.margin_texts.items()}
        return self._memo["margin-lengths"]

    def debiased(self, sched: Scheduler, budgets: Sequence[float], rounds: int = 2) -> Scheduler:
        """Calibrate on the plans that get chosen. The first margin comes from plans spanning the
        predicted ratios, but the scheduler picks, within a budget, the best plan whose prediction
        fits — preferentially the plans the table under-predicts, and plan types the spanning set may
        lack — so the chosen plans are not exchangeable with the timed ones. Here the plans ``sched``
        chooses (:meth:`chosen_plans`) are timed on the margin prompts exactly as the first set
        (:meth:`_time_margin_input`, one resumable step per prompt, keyed by the plan set); every
        timed plan gets a bias, its median residual (:func:`~mechkit.adapt.conformal.plan_biases`),
        added to its prediction; the margin becomes the conformal quantile of all residuals, both
        sets, de-biased leave-one-out (:func:`~mechkit.adapt.conformal.debiased_residuals`); and the
        candidates and scheduler are rebuilt. If the rebuilt scheduler then chooses a plan not yet
        timed, that is timed and the step repeats, at most ``rounds`` times; a plan still untimed
        keeps bias 0 under the pooled margin (the report lists it).

        A bias is the median of ``tasks × margin_prompts`` residuals: its own error (about
        ``1.25·σ/√k``) is what the leave-one-out de-biasing keeps in the pooled scores. The pooled
        count is the first calibration's plus the chosen plans', so a margin finite before stays finite.
        """
        table = self.cost_table()
        groups: dict[str, list[float]] = {k: list(v) for k, v in self._memo["margin-groups"].items()}
        seen: dict[str, tuple[ExecutionPlan, int, int | None]] = {}  # key: plan, round first chosen, round timed
        forwards, spent, done, margin = 0, 0.0, 0, None
        for round_ in range(1, rounds + 2):
            chosen = self.chosen_plans(sched, budgets)
            for k, p in chosen.items():
                seen.setdefault(k, (p, round_, 0 if k in groups else None))
            new = {k: p for k, p in chosen.items() if k not in groups}
            if (round_ > 1 and not new) or round_ > rounds:
                break
            if new:
                plans = list(new.values())
                per_plan, f, sec = self._time_plans(plans, "margin-chosen")
                forwards, spent, done = forwards + f, spent + sec, round_
                for p, r in zip(plans, per_plan, strict=True):
                    groups[p.key()] = r
                    seen[p.key()] = (p, seen[p.key()][1], round_)
            margin = calibrate_margin(debiased_residuals(groups), self.adherence)
            require_residuals(margin.n, self.adherence, "the first and the chosen plans' timings")
            sched = self._build(budgets, margin.value, plan_biases(groups))
        bias = plan_biases(groups)
        final = self.chosen_plans(sched, budgets)
        self.margin_report["chosen_plans"] = {
            "rounds": done, "first_margin": self.margin_report.get("value"),
            "margin": margin.as_dict() if margin else None, "forwards": forwards, "seconds": spent,
            "plans": [{"plan": p.label(), "predicted": table.predict(p, self.typical_tokens),
                       "bias": bias.get(k, 0.0), "chosen_in_round": r, "timed_in_round": t,
                       "chosen": k in final,
                       "median_residual": float(np.median(groups[k])) if k in groups else None}
                      for k, (p, r, t) in seen.items()],
            "untimed_chosen": [p.label() for k, p in final.items() if k not in groups]}
        return sched
