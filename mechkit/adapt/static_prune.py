"""Stage 7. static pruning at the budget, and at the adaptive scheduler's measured latency.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mechkit.adapt.conformal import share_lower_bound
from mechkit.adapt.cost import forward_timer, prompt_ids, time_paired
from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


class PruneStage:
    """Static pruning at the budget, and at the adaptive scheduler's measured latency of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def prune_rows(self, budgets: Sequence[float], targets: Sequence[str] = ("neurons",), n: int | None = None,
                   timing_batch: int = 2, matched: dict[float, float] | None = None,
                   reconstruct: str = "lsq") -> list[dict]:
        """``mechkit prune --budget B`` (attribution guide; ``reconstruct`` as ``prune``'s option, by default
        its default, the least-squares refit) at each budget: the pruned
        copy's held-out accuracy on the same prompts, and its latency timed on every held-out input as
        the plans are (so its adherence to the budget is measured as theirs is). ``matched`` maps a
        budget to the adaptive scheduler's measured median latency there: a second copy is searched to
        that latency (``row["matched"]``), so pruning is compared with the scheduler at the latency the
        scheduler actually ran at, not only at the budget — the scheduler keeps a margin under every
        budget for adherence, and a copy chosen on its median latency alone does not."""
        from mechkit.pruning import PruneStudy

        if not budgets:
            return []
        n_test = n if n is not None else max(len(ps) for ps in self.test.values())
        study = PruneStudy(self.handle, self.tasks, targets=list(targets), n_calib=self.n_calib, n=n_test,
                           shots=self.shots, seed=self.seed, reconstruct=reconstruct, repeats=max(3, self.repeats),
                           timing_batch=timing_batch, step=self.step)
        rows = []
        for budget in budgets:
            row = self._pruned_copy(study, budget, budget, targets)
            target = (matched or {}).get(budget)
            if "error" not in row and target is not None:
                # the search aims under its budget and the copy must measure within it: a copy just faster
                # than the scheduler, so that with the (slower) copy at the budget the two bracket it
                row["matched"] = {**self._pruned_copy(study, target, budget, targets), "target": target}
            rows.append(row)
        return rows

    def _pruned_copy(self, study, search_budget: float, budget: float, targets: Sequence[str]) -> dict:
        """The copy ``study`` finds within ``search_budget`` of the dense latency: accuracy, search
        figures (``search_met``: whether its row measured within ``search_budget``), and its latency
        per held-out input with adherence to ``budget``."""
        try:
            found = study.budget("attribution", search_budget)
        except MechkitError as err:
            return {"budget": budget, "search_budget": search_budget, "error": str(err)}
        r = found["chosen_row"]
        key = hashlib.sha256(json.dumps([r["plan"], r["reconstruct"]], sort_keys=True).encode()).hexdigest()[:12]
        ratios = self._time_pruned(lambda: study.pruned(r), key)
        met = int(sum(x <= budget for x in ratios))
        return {"budget": budget, "search_budget": search_budget, "accuracy": r["accuracy"],
                "mean_accuracy": r["mean_accuracy"], "latency_ratio": float(np.median(ratios)),
                "latency_ratio_max": float(np.max(ratios)), "within": met, "inputs": len(ratios),
                "adherence": met / len(ratios), "adherence_lower95": share_lower_bound(met, len(ratios)),
                "search_latency_ratio": r["latency_ratio"], "search_met": found["met"], "mix": found["chosen"]["mix"],
                "sparsity": found["chosen"]["sparsity"], "targets": list(targets), "reconstruct": r["reconstruct"]}

    def _time_pruned(self, build: Callable[[], ModelHandle], key: str) -> list[float]:
        """The latency / dense of the copy ``build()`` makes on every held-out input, timed as the plans
        are (this study's clock, each pruned forward between two dense ones, median of ``repeats``);
        one step per input, keyed by the copy's plan. The copy is built only if an input is not
        stored yet (a least-squares refit is not free)."""
        copies: list[ModelHandle] = []

        def pruned() -> ModelHandle:
            if not copies:
                copies.append(build())
            return copies[0]

        ratios = []
        for task, prompts in self.test.items():
            for i, p in enumerate(prompts):
                def compute(text: str = p.text) -> float:
                    ids = prompt_ids(self.handle, text)
                    timers = [(name, forward_timer(h, ids, contextlib.nullcontext, self.clock))
                              for name, h in (("dense", self.handle), ("pruned", pruned()))]
                    seconds, _ = time_paired(timers, self.repeats, warmup=True)
                    return seconds["pruned"] / seconds["dense"]

                ratios.append(self.step(f"adapt|prune-time|{key}|{task}|{i}|{self.timing_tag}", compute))
        return ratios
