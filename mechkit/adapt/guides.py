"""Stage 1. guides: per task, the importance of every block, attention and MLP, and the orders they give.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

import numpy as np

from mechkit.adapt.config import KINDS


class GuideStage:
    """Guides of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    def unit_scores(self) -> dict[str, dict[str, list[float]]]:
        """Importance (higher = keep) of every block, attention and MLP, per task and ``"static"``
        (their mean over tasks): ``{source: {"block": [L], "attn": [L], "mlp": [L]}}``."""
        def compute() -> dict:
            out = {t: self._task_scores(t) for t in self.tasks}
            out["static"] = {kind: np.mean([out[t][kind] for t in self.tasks], axis=0).tolist() for kind in KINDS}
            return out

        return self._once(f"adapt|unit-scores|{self.guide}", compute)

    def _task_scores(self, task: str) -> dict[str, list[float]]:
        """``ablation``: the exact drop of the answer log-prob when the unit alone is bypassed (the
        clean prefix reused); otherwise the attribution guide's block score and the sums of its head
        and channel scores."""
        from mechkit.pruning import UnitsToRemove, calibrate, guide_scores
        from mechkit.pruning.sensitivity import plan_drops

        a = self.handle.anatomy
        calib = calibrate(self.handle, [task], self.n_calib, self.shots, self.seed)
        if self.guide == "ablation":
            out = {}
            for kind in KINDS:
                plans = [UnitsToRemove(layers=[i]) if kind == "block" else
                         UnitsToRemove(heads={i: list(range(a.n_heads))}) if kind == "attn" else
                         UnitsToRemove(mlp={i: list(range(a.d_mlp))}) for i in range(a.n_layers)]
                out[kind] = np.abs(plan_drops(self.handle, plans, calib, self.batch_size)).tolist()
            return out
        sc = guide_scores(self.handle, "attribution", calib)
        return {"block": np.asarray(sc.layers, float).tolist(), "attn": np.asarray(sc.heads, float).sum(1).tolist(),
                "mlp": np.asarray(sc.mlp, float).sum(1).tolist()}

    def protected_layers(self) -> list[int]:
        """Blocks whose attention always runs: for the ``induction`` guide, those holding the top
        induction and previous-token heads (on repeated random tokens)."""
        if self.guide != "induction":
            return []

        def compute() -> list[int]:
            from mechkit.pruning import circuit_scores

            circuit = circuit_scores(self.handle, seed=self.seed)
            layers: set[int] = set()
            for kind in ("induction", "previous-token"):
                grid = np.asarray(circuit[kind])
                for flat in np.argsort(grid, axis=None)[::-1][:self.protect_top_k]:
                    layers.add(int(np.unravel_index(flat, grid.shape)[0]))
            return sorted(layers)

        return self._once(f"adapt|protected|{self.protect_top_k}", compute)

    def orders(self) -> dict[str, list[tuple[str, int]]]:
        """Per source (``static`` and each task): the skippable units ``(kind, layer)``, cheapest
        importance per saved latency first (the cost table's share of a block's attention or MLP)."""
        table, protected = self.cost_table(), set(self.protected_layers())
        cost = {"block": table.beta_attn + table.beta_mlp, "attn": table.beta_attn, "mlp": table.beta_mlp}
        first = self.signal_layer + 1
        out = {}
        for source, scores in self.unit_scores().items():
            units = [(kind, i) for kind in KINDS for i in range(first, len(scores[kind]))
                     if not (i in protected and kind != "mlp") and cost[kind] > 0]
            out[source] = sorted(units, key=lambda u: (scores[u[0]][u[1]] / cost[u[0]], KINDS.index(u[0]), u[1]))
        return out
