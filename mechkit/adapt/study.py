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

Expensive steps go through ``step(key, compute)`` (a plugin passes its resumable ``ctx.step``);
their values are JSON-able.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> study = AdaptStudy(m, ["capitalize", "past-tense"], n_calib=3, n=2, shots=1, repeats=1, timing_prompts=1,
...                    token_options=((0, 0.5),), signal_layer=0, adherence=0.5, margin_prompts=1, margin_plans=2)
>>> out = study.run([0.8, 1.0])
>>> [r["budget"] for r in out["rows"]], 0 <= out["rows"][0]["adaptive"]["mean_accuracy"] <= 1
([0.8, 1.0], True)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mechkit.adapt.conformal import (
    ConformalMargin,
    calibrate_margin,
    check_adherence,
    debiased_residuals,
    plan_biases,
    require_residuals,
    residuals_needed,
    share_lower_bound,
)
from mechkit.adapt.cost import (
    CostTable,
    Measured,
    dense_noise,
    forward_timer,
    measure,
    prompt_ids,
    resolve_clock,
    time_interleaved,
    time_paired,
)
from mechkit.adapt.plan import ExecutionPlan, run_plan
from mechkit.adapt.scheduler import Candidate, Scheduler, TaskSignal, adaptive
from mechkit.adapt.tokens import TokenSelection
from mechkit.errors import MechkitError
from mechkit.eval.evaluation import task_prompts
from mechkit.eval.scoring import aggregate, encode_rows, score_rows

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

Step = Callable[[str, Callable[[], Any]], Any]
GUIDES = ("attribution", "ablation", "induction")
KINDS = ("block", "attn", "mlp")  # the units a candidate plan bypasses
CALIB_SEED_OFFSET = 1000  # as mechkit.pruning's calibration: never the held-out prompts' seed


def compute_now(_key: str, compute: Callable[[], Any]) -> Any:
    return compute()


class _Stop(Exception):
    """Raised after the signal block: the rest of the forward is not needed."""


def score_plan(handle: ModelHandle, plan: ExecutionPlan, prompts: Sequence, batch_size: int = 8) -> dict:
    """Exact-match accuracy (equal to greedy decoding's under the plan) and answer log-prob of
    ``prompts`` under ``plan``, with each prompt's correctness and the share of tokens kept."""
    rows = encode_rows(handle.tokenizer, prompts, None)
    with run_plan(handle, plan) as runner:
        def prepare(indices: list[int]) -> None:  # the query is the prompt's last token, not the answer's
            runner.set_queries([rows[i].answer_start - 1 for i in indices])

        scored, decoded = score_rows(handle, rows, batch_size, prepare=prepare)
    score = aggregate(len(prompts), rows, scored, decoded)
    kept = [s for entry in runner.log for s in entry["kept"]]
    return {"accuracy": score.accuracy, "logprob": score.logprob, "correct": list(score.correct),
            "kept": float(np.mean(kept)) if kept else 1.0}


def signal_features(handle: ModelHandle, texts: Sequence[str], layer: int, batch_size: int = 8) -> np.ndarray:
    """``[n, d_model]``: each prompt's residual stream after block ``layer``, averaged over its tokens —
    what the adaptive scheduler reads (the forward stops there)."""
    out: list[torch.Tensor] = []

    def grab(features: torch.Tensor, _lengths: torch.Tensor) -> ExecutionPlan:
        out.append(features.detach().float().cpu())
        raise _Stop

    with run_plan(handle, choose=grab, choose_after=layer), torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = handle.tokenizer(list(texts[i:i + batch_size]), return_tensors="pt", padding=True)
            with contextlib.suppress(_Stop):
                handle.model(input_ids=enc["input_ids"].to(handle.device),
                             attention_mask=enc["attention_mask"].to(handle.device), use_cache=False)
    return torch.cat(out).numpy()


class AdaptStudy:
    """Calibration and held-out measurement of adaptive execution plans (see the module doc).

    ``token_options`` are ``(K, keep)`` pairs: keep that share of the context after block ``K``;
    ``signal_layer`` is the block whose output the scheduler reads (blocks up to it always run);
    ``repeats`` timed runs per plan and input (medians), ``timing_prompts`` calibration prompts per
    task for the cost table; ``adherence`` the share of inputs the budget margin is calibrated to
    keep within budget, from ``margin_prompts`` calibration prompts per task each timed under
    ``margin_plans`` plans (:meth:`margin_calibration`); ``margin`` given skips that calibration and
    is the scheduler's safety margin; ``select`` is its ranking metric
    (:data:`mechkit.adapt.scheduler.SELECT`); ``clock`` the timing clock
    (:func:`mechkit.adapt.cost.resolve_clock`); ``debias`` corrects the predictions of the plans the
    scheduler chooses and recalibrates the margin on them (:meth:`debiased`; off: the first margin
    and the table's predictions, as before).
    """

    def __init__(self, handle: ModelHandle, tasks: Sequence[str], *, guide: str = "attribution", n_calib: int = 8,
                 n: int = 10, shots: int | None = 10, seed: int = 0,
                 token_options: Sequence[tuple[int, float]] = ((6, 0.5), (6, 0.3), (12, 0.5), (12, 0.3), (18, 0.5),
                                                               (18, 0.3)),
                 signal_layer: int = 1, protect_top_k: int = 10, repeats: int = 2, timing_prompts: int = 1,
                 margin: float | None = None, min_cv: float = 0.9, batch_size: int = 8, clock: str = "auto",
                 select: str = "logprob", adherence: float = 0.99, margin_prompts: int = 4, margin_plans: int = 10,
                 debias: bool = True, step: Step = compute_now):
        if guide not in GUIDES:
            raise MechkitError(f"unknown adapt guide {guide!r}", f"use one of: {', '.join(GUIDES)}")
        self.adherence = check_adherence(adherence)
        if margin is not None and not margin >= 0:
            raise MechkitError(f"margin {margin} is negative or not a number", "pass a margin of 0 or more")
        if margin_prompts < 1 or margin_plans < 1:
            raise MechkitError("the budget margin needs at least one prompt and one plan timed",
                               "pass margin_prompts ≥ 1 and margin_plans ≥ 1")
        L = handle.anatomy.n_layers
        if not 0 <= signal_layer < L - 1:
            raise MechkitError(f"signal layer {signal_layer} is outside 0..{L - 2}", "use an early layer such as 1")
        for k, keep in token_options:
            if not signal_layer <= k < L - 1 or not 0 < keep <= 1:
                raise MechkitError(f"token option keep {keep} after layer {k} is out of range",
                                   f"select after a layer in {signal_layer}..{L - 2} (at or above the signal "
                                   "layer), keeping a share in (0, 1]")
        self.handle, self.tasks, self.guide, self.seed = handle, list(tasks), guide, seed
        self.token_options = [(int(k), float(keep)) for k, keep in token_options]
        self.signal_layer, self.protect_top_k = signal_layer, protect_top_k
        self.repeats, self.timing_prompts, self.margin, self.min_cv = repeats, timing_prompts, margin, min_cv
        self.batch_size, self.step, self.debias = batch_size, step, bool(debias)
        self.clock = resolve_clock(handle, clock)
        self.select = select
        self.calib = task_prompts(self.tasks, n_calib, shots, seed + CALIB_SEED_OFFSET)
        self.margin_prompts, self.margin_plan_count = margin_prompts, margin_plans
        # the margin's prompts: calibration-seeded, past the ones the cost table is fitted on
        fitted = {p.text for ps in self.calib.values() for p in ps[:timing_prompts]}
        drawn = task_prompts(self.tasks, timing_prompts + margin_prompts, shots, seed + CALIB_SEED_OFFSET)
        self.margin_texts = {t: [p.text for p in ps if p.text not in fitted][:margin_prompts] for t, ps in drawn.items()}
        seen = {p.text for ps in self.calib.values() for p in ps} | {x for xs in self.margin_texts.values() for x in xs}
        test = task_prompts(self.tasks, n, shots, seed)
        self.test = {t: [p for p in ps if p.text not in seen] for t, ps in test.items()}
        self.n_calib, self.shots = n_calib, shots
        lengths = [len(handle.tokenizer(p.text)["input_ids"]) for ps in self.calib.values() for p in ps]
        self.typical_tokens = int(statistics.median(lengths))
        self._cost: CostTable | None = None
        self._scheduler: Scheduler | None = None
        self._memo: dict[str, Any] = {}
        self.cost_report: dict = {}
        self.margin_report: dict = {}

    def _once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``step(key, compute)``, kept in memory for the rest of the study."""
        if key not in self._memo:
            self._memo[key] = self.step(key, compute)
        return self._memo[key]

    # --- 1. guides ---------------------------------------------------------------------------------

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
        from mechkit.pruning import PrunePlan, calibrate, guide_scores
        from mechkit.pruning.sensitivity import plan_drops

        a = self.handle.anatomy
        calib = calibrate(self.handle, [task], self.n_calib, self.shots, self.seed)
        if self.guide == "ablation":
            out = {}
            for kind in KINDS:
                plans = [PrunePlan(layers=[i]) if kind == "block" else
                         PrunePlan(heads={i: list(range(a.n_heads))}) if kind == "attn" else
                         PrunePlan(mlp={i: list(range(a.d_mlp))}) for i in range(a.n_layers)]
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

    # --- 2. cost table -------------------------------------------------------------------------------

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
        fit = [_measured(r) for r in fit_rows]
        table = CostTable.fit(fit, a.n_layers, noise=noise)
        self.cost_report = {
            "table": table.as_dict(), "typical_tokens": self.typical_tokens,
            "per_layer_ms": table.per_layer_ms(self.typical_tokens),
            "dense_ms": 1000 * table.dense_seconds(self.typical_tokens),
            "fit": table.validate(fit), "validation": table.validate([_measured(r) for r in check_rows]),
            "noise": noise, "clock": self.clock}
        self._cost = table
        return table

    # --- 3. the budget margin -------------------------------------------------------------------

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
                while s <= len(usable) and table.predict(_plan(usable[:s], t, "margin"), n) > target:
                    s += 1
                if s > len(usable):
                    break
                plan = _plan(usable[:s], t, "margin")
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

    def check_margin_sample(self) -> None:
        """Refuse, before any timing, margin prompts × plans too few for a finite conformal margin."""
        if self.margin is None:
            n_prompts = sum(map(len, self.margin_texts.values()))
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

    # --- 4. candidates -------------------------------------------------------------------------------

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
                        plan = _plan(usable[:s], t, source)
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
                              lambda plan=plan, task=task: _scored(score_plan(self.handle, plan, self.calib[task],
                                                                              self.batch_size)))
                acc[task], lp[task] = s["accuracy"], s["logprob"]
            out.append(Candidate(plan, source, acc, lp, bias.get(plan.key(), 0.0)))
        return out

    # --- 5. signal -----------------------------------------------------------------------------------

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
                         adherence=self.adherence if self.margin is None else None)

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

    # --- 6. held-out ---------------------------------------------------------------------------------

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

    # --- 7. static pruning: at the budget, and at the adaptive scheduler's measured latency --------

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

    # --- everything ----------------------------------------------------------------------------------

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


def adherence(budget: float, ratios: Sequence[float], decisions: Sequence, noise: float, margin: float) -> dict:
    """The shares of inputs within ``budget`` from their measured latency ratios and the scheduler's
    decisions: ``adherence`` strictly by measurement; ``adherence_dense_met`` counting an input that ran
    the dense plan under a budget ≥ 1 as within it (the plan *is* the reference; its measured ratio is
    the noise of timing one model twice), the others strictly; ``adherence_with_noise`` within
    ``budget + noise``; ``coverage`` the share measured within ``predicted + margin`` (what the
    conformal margin promises); ``dense_inputs`` how many ran dense under a budget ≥ 1;
    ``infeasible_inputs`` how many had no plan that fits (the cheapest ran); ``within`` of ``inputs``
    the count behind ``adherence_dense_met``, and ``adherence_lower95`` the share that count supports
    (:func:`~mechkit.adapt.conformal.share_lower_bound`).

    >>> from mechkit.adapt.scheduler import Decision
    >>> from mechkit.adapt.plan import ExecutionPlan
    >>> dense = Decision(ExecutionPlan(), None, "static scheduler", 1.0, True)
    >>> a = adherence(1.0, [1.04, 0.98], [dense, dense], noise=0.05, margin=0.0)
    >>> a["adherence"], a["adherence_dense_met"], a["adherence_with_noise"], a["dense_inputs"]
    (0.5, 1.0, 1.0, 2)
    """
    dense = [d.plan.is_dense and budget >= 1.0 for d in decisions]
    met = int(sum(r <= budget or x for r, x in zip(ratios, dense, strict=True)))
    return {"adherence": float(np.mean([r <= budget for r in ratios])),
            "adherence_dense_met": met / len(ratios), "within": met, "inputs": len(ratios),
            "adherence_lower95": share_lower_bound(met, len(ratios)),
            "adherence_with_noise": float(np.mean([r <= budget + noise for r in ratios])),
            "coverage": float(np.mean([r <= d.predicted + margin for r, d in zip(ratios, decisions, strict=True)])),
            "dense_inputs": int(sum(dense)), "infeasible_inputs": int(sum(not d.fits for d in decisions))}


def pooled_adherence(rows: Sequence[dict]) -> dict:
    """Per scheduler (adaptive, static): inputs within their budget (dense = met) over every budget's
    inputs, pooled, and the share that supports (:func:`~mechkit.adapt.conformal.share_lower_bound`):
    one budget's few inputs cannot show 99 %, all budgets' together come closer."""
    out = {}
    for kind in ("adaptive", "static"):
        within = sum(r[kind]["within"] for r in rows)
        n = sum(r[kind]["inputs"] for r in rows)
        out[kind] = {"within": within, "inputs": n, "share": within / n if n else None,
                     "lower95": share_lower_bound(within, n)}
    return out


def _plan(units: Sequence[tuple[str, int]], tokens: TokenSelection | None, source: str) -> ExecutionPlan:
    """The plan bypassing ``units`` (``(kind, layer)``; attention and MLP of one layer make the block)."""
    by = {kind: {i for k, i in units if k == kind} for kind in KINDS}
    blocks = by["block"] | (by["attn"] & by["mlp"])
    plan = ExecutionPlan(layers=tuple(blocks), attn_layers=tuple(by["attn"] - blocks),
                         mlp_layers=tuple(by["mlp"] - blocks), tokens=tokens)
    c = plan.counts()
    parts = [f"{c[k]} {w}" for k, w in (("layers", "blocks"), ("attn_layers", "attn"), ("mlp_layers", "MLP")) if c[k]]
    if tokens is not None:
        parts.append(f"tokens {tokens.keep:g}@L{tokens.layer}")
    plan.name = f"{source}: " + (" + ".join(parts) or "dense")
    return plan


def _measured(row: dict) -> Measured:
    return Measured(ExecutionPlan.from_dict(row["plan"]), int(row["n_tokens"]), float(row["seconds"]),
                    float(row["dense_s"]))


def _scored(s: dict) -> dict:
    return {"accuracy": s["accuracy"], "logprob": s["logprob"]}
