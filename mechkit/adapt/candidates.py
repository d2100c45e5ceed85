"""Stage 4. candidates: for every budget, order and token option the plan that fits, scored on calibration prompts.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from mechkit.adapt.measures import score_plan, scores_only, unit_plan
from mechkit.adapt.plan import ExecutionPlan
from mechkit.adapt.scheduler import Candidate
from mechkit.adapt.tokens import TokenSelection


class CandidateStage:
    """Candidates of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def candidate_plans(self, budgets: Sequence[float], margin: float | None = None,
                        bias: dict[str, float] | None = None) -> list[tuple[str, ExecutionPlan]]:
        """``(source, plan)`` for every budget < 1, order and token option: the fewest of the order's
        units bypassed that fit the budget at the typical prompt length (after the scheduler's
        margin, default the first calibrated one; a plan's prediction plus its ``bias``, by key)."""
        table = self.cost_table()
        margin = self.margin_value(budgets) if margin is None else margin
        bias = bias or {}
        n = self.typical_tokens
        out: dict[str, tuple[str, ExecutionPlan]] = {}
        options: list[TokenSelection | None] = [None, *(TokenSelection(k, keep) for k, keep in self.token_options)]
        for source, order in self.orders().items():
            for budget in sorted(budgets):
                if budget >= 1:
                    continue
                for t in options:
                    # the selection needs its block's attention
                    usable = [u for u in order if t is None or u[1] != t.layer or u[0] == "mlp"]
                    for s in range(len(usable) + 1):
                        plan = unit_plan(usable[:s], t, source)
                        if table.predict(plan, n) + bias.get(plan.key(), 0.0) <= budget - margin:
                            out.setdefault(f"{source}|{plan.key()}", (source, plan))
                            break
        out["static|dense"] = ("static", ExecutionPlan(name="dense"))
        return list(out.values())

    def candidates(self, budgets: Sequence[float], margin: float | None = None,
                   bias: dict[str, float] | None = None) -> list[Candidate]:
        """Every candidate plan scored on the calibration prompts (static plans on every task), with
        its ``bias`` (by plan key) where it has one."""
        out, bias = [], bias or {}
        for source, plan in self.candidate_plans(budgets, margin, bias):
            tasks = self.tasks if source == "static" else [source]
            acc, lp = {}, {}
            for task in tasks:
                s = self._once(f"adapt|calib|{task}|{self.n_calib}|{plan.key()}",
                              lambda plan=plan, task=task: scores_only(score_plan(self.handle, plan, self.calib[task],
                                                                              self.batch_size)))
                acc[task], lp[task] = s["accuracy"], s["logprob"]
            out.append(Candidate(plan, source, acc, lp, bias.get(plan.key(), 0.0)))
        return out
