"""``mechkit prune``: a smaller, faster model without retraining, guided by what matters for the tasks.

For every guide and sparsity: build the plan from the guide's scores (calibration prompts only),
slice a physical copy, and measure exact-match accuracy on held-out prompts of each task,
perplexity on held-out text, parameters, FLOPs per token and forward latency as a ratio to the
dense model. ``--budget 0.7`` instead searches the plan that keeps the most calibration accuracy
within 70% of the dense latency (or FLOPs). ``--save-model`` writes the pruned model (the first
guide at the last sparsity, or the budget plan) as ``model/`` in the run directory, in safetensors;
``mechkit.load_model(DIR/model)`` reloads it exactly.
"""

from __future__ import annotations

from pathlib import Path

from mechkit.plugin import Option, Plugin, Result, RunContext

DEFAULT_TASKS = "capitalize,past-tense,country-capital"


def parse_levels(text: str, targets: list[str]) -> list[dict[str, float]]:
    """``"0.1,0.2"`` → one level per fraction (every target); ``"neurons=0.3,heads=0.2"`` → one level."""
    from mechkit.errors import MechkitError
    from mechkit.pruning.select import parse_sparsity

    if "=" in text:
        return [parse_sparsity(text, targets)]
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MechkitError(f"malformed --sparsity {text!r}", "use fractions like 0.2,0.3 or neurons=0.3,heads=0.2") from None
    return [parse_sparsity(v, targets) for v in values]


def parse_targets(text: str) -> list[str]:
    from mechkit.errors import MechkitError
    from mechkit.pruning.select import TARGETS

    targets = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise MechkitError(f"unknown --target {text!r}", f"use a comma list of {', '.join(TARGETS)}")
    return targets


class PrunePlugin(Plugin):
    name = "prune"
    version = "0.1.0"
    summary = "Prune heads, MLP channels or layers by an interpretability guide; measure accuracy and speed."
    options = (
        Option("guide", str, "attribution,wanda,magnitude,random",
               "Comma list of guides: random, magnitude, wanda, flap, gradient, attribution, induction, combined; "
               "GUIDE@ALLOCATION overrides --allocation for one guide (e.g. attribution@sensitivity)."),
        Option("target", str, "neurons", "Units to prune: comma list of neurons, heads, layers."),
        Option("sparsity", str, "0.2", "Fractions (0.1,0.2,0.3: each for every target) or neurons=0.3,heads=0.2."),
        Option("budget", float, None, "Instead of --sparsity: at most this fraction of the dense cost."),
        Option("budget_unit", str, "latency", "What --budget limits.", choices=("latency", "flops")),
        Option("tasks", str, DEFAULT_TASKS, "Comma-separated task ids (see `mechkit tasks`)."),
        Option("calib", int, 16, "Calibration prompts per task (scores and budget search only)."),
        Option("n", int, 30, "Held-out prompts per task (evaluation only)."),
        Option("shots", int, 10, "Demonstrations per prompt."),
        Option("allocation", str, "global", "Spread over layers: uniform, global, global-z, or sensitivity "
                                            "(measured per-layer MLP sensitivity on calibration prompts).",
               choices=("uniform", "global", "global-z", "sensitivity")),
        Option("gqa", str, "slot", "Heads under GQA: slot (same count from every group) or group (whole groups).",
               choices=("slot", "group")),
        Option("compensate", bool, True, "Replace removed units by their calibration mean (bias, FLAP).",
               is_flag=True),
        Option("protect_top_k", int, 10, "induction/combined guides: never remove the top-k induction and "
                                         "previous-token heads."),
        Option("save_model", bool, False, "Write the pruned model to DIR/model (safetensors).", is_flag=True),
        Option("repeats", int, 7, "Timed forward passes per model (median)."),
        Option("timing", str, "last", "Timed forward: logits of the last position only (answering a prompt, a "
                                      "generation's prefill) or of every position; both are reported, this one "
                                      "is the speedup and the budget.", choices=("last", "all")),
        Option("timing_batch", int, 8, "Prompts in the timed batch."),
        Option("batch_size", int, 16, "Prompts per forward pass when scoring."),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.errors import MechkitError
        from mechkit.pruning.guides import check_guide
        from mechkit.pruning.select import ALLOCATIONS
        from mechkit.tasks import parse_tasks

        p = ctx.params
        guides = [g.strip() for g in p["guide"].split(",") if g.strip()]
        for g in guides:
            name, _, alloc = g.partition("@")
            check_guide(name)
            if alloc and alloc not in ALLOCATIONS:
                raise MechkitError(f"unknown allocation {alloc!r} in --guide {g!r}", f"use {', '.join(ALLOCATIONS)}")
        targets = parse_targets(p["target"])
        levels = [] if p["budget"] is not None else parse_levels(p["sparsity"], targets)
        if p["budget"] is not None and not 0 < p["budget"] < 1:
            raise MechkitError(f"--budget {p['budget']} is outside (0, 1)", "use a fraction of the dense cost, e.g. 0.7")
        tasks = parse_tasks(p["tasks"])
        for opt, least in (("repeats", 1), ("timing_batch", 1), ("batch_size", 1), ("protect_top_k", 0)):
            if p[opt] < least:
                flag = "--" + opt.replace("_", "-")
                raise MechkitError(f"{flag} {p[opt]} is below {least}", f"pass {flag} {least} or more")
        if not guides:
            raise MechkitError("no guide given", "pass --guide attribution (or a comma list)")
        return _Run(ctx, guides, targets, levels, tasks).result()


class _Run:
    """One prune run: calibration, scores, then one row per (guide, level) or the budget search."""

    def __init__(self, ctx: RunContext, guides: list[str], targets: list[str], levels: list[dict], tasks: list[str]):
        from mechkit.eval.evaluation import task_prompts
        from mechkit.pruning.calibration import calibrate
        from mechkit.pruning.cost import heldout_text

        self.ctx, self.p, self.m = ctx, ctx.params, ctx.model
        self.guides, self.targets, self.levels, self.tasks = guides, targets, levels, tasks
        self.calib = calibrate(self.m, tasks, self.p["calib"], self.p["shots"], ctx.seed)
        self.test = task_prompts(tasks, self.p["n"], self.p["shots"], ctx.seed, None)
        calib_texts = {c.text for c in self.calib.prompts}
        self.test = {t: [q for q in ps if q.text not in calib_texts] for t, ps in self.test.items()}
        self.text, self.text_source = heldout_text()
        self.timing = [q.text for ps in self.test.values() for q in ps][: self.p["timing_batch"]]
        self._scores: dict = {}
        self._attribution = None
        self._circuit = None

    def scores(self, guide: str):
        from mechkit.pruning.guides import Scores
        from mechkit.pruning.pipeline import circuit_scores, guide_scores

        if guide not in self._scores:
            if guide in ("induction", "combined") and self._circuit is None:
                self._circuit = self.ctx.step("circuit", lambda: circuit_scores(self.m, seed=self.ctx.seed))
                self._circuit = {k: _array(v) for k, v in self._circuit.items()}
            if guide in ("attribution", "ablation", "induction", "combined") and self._attribution is None:
                raw = self.ctx.step("scores|attribution", lambda: _scores_dict(
                    guide_scores(self.m, "attribution", self.calib)))
                self._attribution = Scores(_array(raw["mlp"]), _array(raw["heads"]), _array(raw["layers"]),
                                           "attribution")
            s = guide_scores(self.m, guide, self.calib, seed=self.ctx.seed, protect_top_k=self.p["protect_top_k"],
                             circuit=self._circuit, attribution=self._attribution)
            self._scores[guide] = s
        return self._scores[guide]

    def measure(self, handle, plan=None) -> dict:
        """Held-out accuracy per task, perplexity, size and cost of a (pruned) handle."""
        from mechkit.eval.evaluation import evaluate
        from mechkit.pruning.cost import flops_per_token, n_params, perplexity

        metrics = evaluate(handle, self.test, self.p["batch_size"])
        acc = {t: metrics[t]["accuracy"] for t in self.tasks}
        return {"accuracy": acc, "mean_accuracy": sum(acc.values()) / len(acc),
                "perplexity": perplexity(handle, self.text), "params": n_params(handle),
                "flops_per_token": flops_per_token(handle), "plan": plan.as_dict() if plan else None}

    def sensitivity(self, name: str):
        from mechkit.pruning.sensitivity import layer_sensitivity

        values = self.ctx.step(f"sensitivity|{name}", lambda: layer_sensitivity(
            self.m, self.scores(name).mlp, self.calib).tolist())
        return _array(values)

    def plan(self, guide: str, level: dict):
        from mechkit.pruning.select import make_plan

        p = self.p
        name, _, alloc = guide.partition("@")
        alloc = alloc or p["allocation"]
        sens = self.sensitivity(name) if alloc == "sensitivity" and level.get("neurons") else None
        return make_plan(self.scores(name), self.m.anatomy, level, alloc, p["gqa"], p["compensate"], sens)

    def row(self, guide: str, level: dict) -> dict:
        from mechkit.pruning.cost import latency
        from mechkit.pruning.slicing import prune_copy

        p = self.p
        key = f"row|{guide}|{p['allocation']}|{sorted(level.items())}"

        def compute():
            plan = self.plan(guide, level)
            pruned = prune_copy(self.m, plan, self.calib.stats)
            out = self.measure(pruned, plan)
            last = p["timing"] == "last"
            dense_t, pruned_t = latency([self.m, pruned], self.timing, repeats=p["repeats"], last=last)
            other_d, other_p = latency([self.m, pruned], self.timing, repeats=max(3, p["repeats"] // 2), last=not last)
            out.update(latency_s=pruned_t, dense_latency_s=dense_t, latency_ratio=pruned_t / dense_t,
                       speedup=dense_t / pruned_t, timing=p["timing"],
                       speedup_other_timing=other_d / other_p)
            return out

        return {"guide": guide, "sparsity": level, **self.ctx.step(key, compute)}

    def result(self) -> Result:
        from mechkit.pruning.cost import latency

        dense = self.ctx.step("dense", lambda: self.measure(self.m))
        rows, budget = [], None
        with self.ctx.progress() as bar:
            if self.p["budget"] is not None:
                job = bar.add_task("budget search", total=None)
                budget = self.budget(bar, job)
                rows.append(budget["chosen_row"])
            else:
                job = bar.add_task("prune", total=len(self.guides) * len(self.levels))
                for guide in self.guides:
                    for level in self.levels:
                        bar.update(job, description=f"{guide} {level}")
                        rows.append(self.row(guide, level))
                        bar.advance(job)
        dense_t = latency([self.m], self.timing, repeats=self.p["repeats"], last=self.p["timing"] == "last")[0]
        dense.update(latency_s=dense_t, latency_ratio=1.0, speedup=1.0)
        files = self.save(rows) if self.p["save_model"] else {}
        return Result(results=self.results(dense, rows, budget), figures=self.figures(dense, rows), files=files)

    def budget(self, bar, job) -> dict:
        from mechkit.pruning.budget import cost_ratio_fn, masked_accuracy, search

        p, guide = self.p, self.guides[0]
        cost = cost_ratio_fn(self.m, p["budget_unit"], self.timing, repeats=max(3, p["repeats"] // 2),
                             last=p["timing"] == "last")
        acc = masked_accuracy(self.m, self.calib, p["batch_size"])

        def compute():
            margin = 0.95 if p["budget_unit"] == "latency" else 1.0  # measured latency is noisy
            found = search(lambda sparsity: self.plan(guide, sparsity), self.calib.stats, p["budget"] * margin,
                           self.targets, cost, acc,
                           on_step=lambda mix, s, r: bar.update(job, description=f"budget {mix} {r:.2f}"))
            return [{"mix": c.mix, "sparsity": c.sparsity, "cost_ratio": c.cost_ratio,
                     "calib_accuracy": c.calib_accuracy} for c in found]

        candidates = self.ctx.step(f"budget|{guide}|{p['budget']}|{p['budget_unit']}", compute)
        within = [c for c in candidates if c["calib_accuracy"] is not None]
        if not within:
            from mechkit.errors import MechkitError

            raise MechkitError(f"no plan of {', '.join(self.targets)} reaches {p['budget']} of the dense "
                               f"{p['budget_unit']}", "raise --budget or add targets (--target neurons,heads,layers)")
        chosen = max(within, key=lambda c: c["calib_accuracy"])
        sparsity = dict(chosen["sparsity"])
        for _ in range(3):  # the reported row must meet the budget; timing noise can put it just over
            row = self.row(guide, sparsity)
            measured = row["latency_ratio"] if p["budget_unit"] == "latency" else \
                row["flops_per_token"] / self.measure_flops_dense()
            if measured <= p["budget"]:
                break
            sparsity = {k: min(v * 1.05 + 0.01, 0.95) for k, v in sparsity.items()}
        return {"budget": p["budget"], "unit": p["budget_unit"], "guide": guide, "candidates": candidates,
                "chosen": chosen, "measured_ratio": measured, "met": measured <= p["budget"], "chosen_row": row}

    def measure_flops_dense(self) -> float:
        from mechkit.pruning.cost import flops_per_token

        return flops_per_token(self.m)

    def save(self, rows: list[dict]) -> dict:
        import shutil
        import tempfile

        from mechkit.pruning.plan import PrunePlan
        from mechkit.pruning.slicing import prune_copy, save_pruned

        row = rows[-1] if self.p["budget"] is not None else \
            [r for r in rows if r["guide"] == self.guides[0]][-1]
        pruned = prune_copy(self.m, PrunePlan.from_dict(row["plan"]), self.calib.stats)
        tmp = Path(tempfile.mkdtemp(prefix="mechkit-pruned-"))  # the report writer moves it to DIR/model
        try:
            return {"model": save_pruned(pruned, tmp)}
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def results(self, dense: dict, rows: list[dict], budget: dict | None) -> dict:
        summary = {"dense": _line(dense)}
        for r in rows:
            summary[f"{r['guide']} {_level(r['sparsity'])}"] = _line(r)
        if budget:
            summary["budget"] = (f"{budget['unit']} ≤ {budget['budget']:.2f}: chose {budget['chosen']['mix']} "
                                 f"{_level(budget['chosen']['sparsity'])}, measured {budget['measured_ratio']:.2f} "
                                 f"({'met' if budget['met'] else 'NOT met'})")
        return {"tasks": self.tasks, "guides": self.guides, "targets": self.targets, "dense": dense, "rows": rows,
                "budget": {k: v for k, v in budget.items() if k != "chosen_row"} if budget else None,
                "heldout_text": self.text_source, "calibration_prompts_per_task": self.p["calib"],
                "summary": summary}

    def figures(self, dense: dict, rows: list[dict]) -> dict:
        from mechkit.report import xy_plot

        series: dict[str, tuple[list, list]] = {}
        for r in rows:
            xs, ys = series.setdefault(r["guide"], ([], []))
            xs.append(r["speedup"])
            ys.append(r["mean_accuracy"])
        fig = xy_plot(series, f"Held-out accuracy vs measured speedup ({', '.join(self.tasks)})",
                      "forward speedup over dense (×)", "mean exact-match accuracy",
                      reference=(1.0, dense["mean_accuracy"]))
        return {"accuracy_vs_speedup": fig}


def _array(value):
    import numpy as np

    return np.asarray(value, dtype=float)


def _scores_dict(s) -> dict:
    return {"mlp": s.mlp.tolist(), "heads": s.heads.tolist(), "layers": s.layers.tolist()}


def _level(sparsity: dict) -> str:
    return ",".join(f"{k}={v:.2f}" for k, v in sparsity.items())


def _line(r: dict) -> str:
    acc = " ".join(f"{t} {a:.2f}" for t, a in r["accuracy"].items())
    return (f"acc {r['mean_accuracy']:.2f} ({acc}) | ppl {r['perplexity']:.1f} | params {r['params'] / 1e6:.1f}M | "
            f"speedup {r.get('speedup', 1.0):.2f}×")
