"""Stage 6. held-out: accuracy and measured latency per budget for the adaptive and the best static plan.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from mechkit.adapt.cost import prompt_ids, time_interleaved
from mechkit.adapt.measures import adherence, pooled_adherence, score_plan, signal_features
from mechkit.adapt.plan import ExecutionPlan, run_plan
from mechkit.adapt.scheduler import Scheduler, adaptive


class HeldOutStage:
    """Held-out of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def heldout(self, budgets: Sequence[float]) -> dict:
        """Per budget: adaptive and static accuracy per task, latency per input, adherence, plans, tokens."""
        sched = self.scheduler(budgets)
        prompts = [(t, i, p) for t in self.tasks for i, p in enumerate(self.test[t])]
        texts = [p.text for _, _, p in prompts]
        lengths = [prompt_ids(self.handle, x).shape[1] for x in texts]
        feats = np.asarray(self.step(f"adapt|signal-features|heldout|{self.signal_layer}", lambda: signal_features(
            self.handle, texts, self.signal_layer, self.batch_size).tolist())) if sched.signal else None
        scored: dict[tuple[str, str], dict] = {}

        def correct(task: str, plan: ExecutionPlan, index: int) -> bool:
            key = (task, plan.key())
            if key not in scored:
                scored[key] = self.step(f"adapt|heldout|{task}|{len(self.test[task])}|{plan.key()}",
                                        lambda: score_plan(self.handle, plan, self.test[task], self.batch_size))
            return bool(scored[key]["correct"][index])

        rows = []
        dense = {t: float(np.mean([correct(t, ExecutionPlan(), i) for i in range(len(self.test[t]))]))
                 for t in self.tasks}
        decisions: dict[float, list] = {}
        for budget in budgets:
            per = []
            for j, ((task, i, _p), n) in enumerate(zip(prompts, lengths, strict=True)):
                ad = sched.decide(feats[j:j + 1] if feats is not None else None, n, budget)
                st = sched.decide(None, n, budget, input_adaptive=False)
                per.append((task, i, ad, st))
            decisions[budget] = per
        timings = [self._time_input(sched, budgets, task, i, text)
                   for (task, i, _p), text in zip(prompts, texts, strict=True)]
        for budget in budgets:
            rows.append(self._budget_row(budget, decisions[budget], timings, correct, sched.margin))
        return {"dense": {"accuracy": dense, "mean_accuracy": float(np.mean(list(dense.values())))}, "rows": rows,
                "input_noise": self.input_noise(timings), "pooled_adherence": pooled_adherence(rows)}

    def _time_input(self, sched: Scheduler, budgets: Sequence[float], task: str, index: int, text: str) -> dict:
        """One held-out prompt timed (prefill, last-position logits) dense, under the adaptive scheduler
        and under the static plan at every budget, each forward between two dense ones (:func:`~mechkit.adapt.cost.time_paired`,
        as the margin's calibration prompts); medians of ``repeats``."""
        def compute() -> dict:
            ids = prompt_ids(self.handle, text)
            n = ids.shape[1]
            makers: list[tuple[str, Callable]] = [("dense", lambda: run_plan(self.handle)),
                                                  ("dense-again", lambda: run_plan(self.handle))]
            for b in budgets:
                makers.append((f"adaptive|{b}", lambda b=b: adaptive(self.handle, budget=b, scheduler=sched)))
                static = sched.decide(None, n, b, input_adaptive=False).plan
                makers.append((f"static|{b}", lambda static=static: run_plan(self.handle, static)))
            med, logs = time_interleaved(self.handle, ids, makers, self.repeats, self.clock)
            return {"n_tokens": n, "seconds": med,
                    "kept": {name: float(np.mean(entry["kept"])) for name, entry in logs.items()},
                    "label": {name: entry["label"] for name, entry in logs.items()}}

        # keyed by what decides the plans too: a resumed run with another margin or biases times afresh
        plans = hashlib.sha256(f"{sched.margin}|{sorted(sched.bias.items())}|{[c.plan.key() for c in sched.candidates]}"
                               .encode()).hexdigest()[:12]
        return self.step(f"adapt|time|{task}|{index}|{self.timing_tag}|{sorted(budgets)}|{plans}", compute)

    @staticmethod
    def input_noise(timings: list[dict]) -> dict:
        """The dense model timed twice per held-out input: |1 − second/first| — the resolution of one
        input's measured ratio (median, 95th percentile, max)."""
        dev = [abs(1 - t["seconds"]["dense-again"] / t["seconds"]["dense"]) for t in timings
               if "dense-again" in t["seconds"]]
        if not dev:
            return {"median": None, "p95": None, "max": None}
        return {"median": float(np.median(dev)), "p95": float(np.percentile(dev, 95)), "max": float(np.max(dev))}

    def _budget_row(self, budget: float, per: list, timings: list[dict], correct: Callable, margin: float) -> dict:
        noise = self.input_noise(timings)["p95"]
        noise = self.cost_table().noise if noise is None else noise
        out: dict = {"budget": budget, "margin": margin}
        for kind in ("adaptive", "static"):
            acc: dict[str, list[bool]] = {t: [] for t in self.tasks}
            ratios, kept, predicted, chosen = [], [], [], {t: {} for t in self.tasks}
            decided = []
            for (task, i, ad, st), timing in zip(per, timings, strict=True):
                d = ad if kind == "adaptive" else st
                decided.append(d)
                acc[task].append(correct(task, d.plan, i))
                secs = timing["seconds"]
                ratios.append(secs[f"{kind}|{budget}"] / secs["dense"])
                kept.append(timing["kept"].get(f"{kind}|{budget}", 1.0))
                predicted.append(d.predicted)
                label = d.plan.label()
                chosen[task][label] = chosen[task].get(label, 0) + 1
            accuracy = {t: float(np.mean(v)) if v else None for t, v in acc.items()}
            out[kind] = {
                "accuracy": accuracy, "mean_accuracy": float(np.mean([v for v in accuracy.values() if v is not None])),
                "latency_ratio": float(np.median(ratios)), "latency_ratio_max": float(np.max(ratios)),
                "predicted_ratio": float(np.median(predicted)),
                **adherence(budget, ratios, decided, noise, margin),
                "tokens_kept": float(np.mean(kept)), "plans": chosen}
        reasons: dict[str, int] = {}
        for _t, _i, ad, _st in per:
            reasons[ad.reason] = reasons.get(ad.reason, 0) + 1
        out["adaptive"]["reasons"] = reasons
        out["feasible"] = not (out["adaptive"]["infeasible_inputs"] or out["static"]["infeasible_inputs"])
        return out
