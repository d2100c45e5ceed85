"""Stage 2. the cost table: plans timed against the dense model on this machine, fitted and validated.

A part of :class:`mechkit.adapt.AdaptStudy`, which holds the state (config, prompts, memo) the stage reads.
"""

from __future__ import annotations

from mechkit.adapt.cost import CostTable, dense_noise, measure
from mechkit.adapt.measures import measured_row
from mechkit.adapt.plan import ExecutionPlan
from mechkit.adapt.tokens import TokenSelection


class CostStage:
    """The cost table of the adapt study (a mixin of :class:`~mechkit.adapt.study.AdaptStudy`)."""

    @property
    def timing_tag(self) -> str:
        """What every timing step's key carries: timings taken another way are not reused."""
        return f"{self.repeats}|{self.clock}|paired"

    def timing_texts(self, offset: int = 0) -> list[str]:
        texts = []
        for ps in self.calib.values():
            texts += [p.text for p in ps[offset:offset + self.timing_prompts]]
        return texts

    def cost_table(self) -> CostTable:
        """Fit on plans that span block, attention and MLP bypasses and the token options (plus one with
        masked heads and one with masked MLP channels: what masking costs); validate on other plans,
        timed on other prompts; the noise is the dense model timed against itself."""
        if self._cost is not None:
            return self._cost
        a = self.handle.anatomy
        first = self.signal_layer + 1
        spread = list(range(first, a.n_layers))
        every = {k: spread[::k] for k in (2, 3, 4, 6)}  # evenly spaced layers: cost does not depend on which
        tok = [TokenSelection(k, keep) for k, keep in self.token_options]
        fit_plans = [ExecutionPlan(layers=tuple(every[6])), ExecutionPlan(layers=tuple(every[3])),
                     ExecutionPlan(attn_layers=tuple(every[2])), ExecutionPlan(mlp_layers=tuple(every[3]))]
        fit_plans += [ExecutionPlan(tokens=t) for t in tok]
        mid = a.n_layers // 2
        fit_plans += [ExecutionPlan(heads={layer: (0,) for layer in range(mid, a.n_layers)}),
                      ExecutionPlan(mlp={layer: tuple(range(a.d_mlp // 4)) for layer in range(mid, a.n_layers)})]
        check_plans = [ExecutionPlan(layers=tuple(every[4])), ExecutionPlan(mlp_layers=tuple(every[2]))]
        check_plans += [ExecutionPlan(layers=tuple(x for x in every[6] if x != t.layer),
                                      attn_layers=tuple(x for x in spread[1::4] if x != t.layer), tokens=t) for t in tok]

        def rows(plans: list[ExecutionPlan], texts: list[str]) -> list[dict]:
            return [{"plan": m.plan.as_dict(), "n_tokens": m.n_tokens, "seconds": m.seconds, "dense_s": m.dense_s}
                    for m in measure(self.handle, plans, texts, self.repeats, self.clock)]

        tag = self.timing_tag
        fit_rows = self.step(f"adapt|cost-fit|{tag}", lambda: rows(fit_plans, self.timing_texts()))
        check_texts = self.timing_texts(self.timing_prompts)
        check_rows = self.step(f"adapt|cost-check|{tag}", lambda: rows(check_plans, check_texts))
        noise = self.step(f"adapt|noise|{tag}", lambda: dense_noise(self.handle, check_texts or self.timing_texts(),
                                                                     self.repeats, self.clock))
        fit = [measured_row(r) for r in fit_rows]
        table = CostTable.fit(fit, a.n_layers, noise=noise)
        self.cost_report = {
            "table": table.as_dict(), "typical_tokens": self.typical_tokens,
            "per_layer_ms": table.per_layer_ms(self.typical_tokens),
            "dense_ms": 1000 * table.dense_seconds(self.typical_tokens),
            "fit": table.validate(fit), "validation": table.validate([measured_row(r) for r in check_rows]),
            "noise": noise, "clock": self.clock}
        self._cost = table
        return table
