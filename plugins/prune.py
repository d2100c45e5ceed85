"""``mechkit prune``: a smaller, faster model without retraining, guided by what matters for the tasks.

For every guide and sparsity: build the plan from the guide's scores (calibration prompts only),
slice a physical copy — by default refitting the projections that read the removed units by
least squares on calibration activations (``--reconstruct lsq``; layer by layer on the pruned
model's own inputs with ``--sequential``; generic text mixed into calibration with
``--calib-text-weight``) — and measure exact-match accuracy on
held-out prompts of each task, perplexity on held-out text, parameters, FLOPs per token and
forward latency as a ratio to the dense model. ``--budget 0.7`` instead searches the plan that keeps the most calibration accuracy
within 70% of the dense latency (or FLOPs). ``--save-model`` writes the pruned model (the first
guide at the last sparsity, or the budget plan) as ``model/`` in the run directory, in safetensors;
``mechkit.load_model(DIR/model)`` reloads it exactly.

With ``--executor ray`` the guide × sparsity rows run on Ray workers (:mod:`mechkit.pruning.grid`), each
timed against the dense model in its own process (ratios stay same-process; absolute latencies grow when
workers share CPUs); the ``--budget`` search is sequential and always runs here.

The measurements are :class:`mechkit.pruning.PruneStudy`'s, asked through one
:class:`~mechkit.pruning.PruneConfig`; the results and finding they give are :mod:`mechkit.pruning.findings`'s;
this plugin declares the options, runs the rows or the budget search, and shapes the tables and the
accuracy-vs-speedup figure.
"""

from __future__ import annotations

from mechkit.options import DEFAULT_TASKS, EXECUTION, GuideList, SparsityLevels, TargetList, TaskList, unread
from mechkit.plugin import Option, Plugin, Result, RunContext

SAME_NAMES = ("n", "shots", "allocation", "gqa", "reconstruct", "sequential", "ridge", "guide_text_weight",
              "protect_top_k", "repeats", "timing", "timing_batch", "batch_size")
"""Options that are :class:`~mechkit.pruning.PruneConfig` fields of the same name."""


class PrunePlugin(Plugin):
    name = "prune"
    version = "0.1.0"
    needs = frozenset({"weight_writes", "weight_reads", "module_calls", "gradients", "generation"})
    pruned = frozenset({"layers"})  # docs/analyses/prune.md
    prepared = ("model",)  # --save-model's model, in $TMPDIR until the report moves it in
    pruned_why = {kind: ("it ranks units in layers × neurons and layers × heads grids and records what it keeps in the "
                         "dense model's numbering, so it cannot prune again a model pruned that way",
                         "prune the dense model with a higher --sparsity or a lower --budget")
                  for kind in ("neurons", "heads")}
    summary = "Prune heads, MLP channels or layers by an interpretability guide; measure accuracy and speed."
    options = (
        Option("guide", str, "attribution,wanda,magnitude,random",
               "Comma list of guides: random, magnitude, wanda, flap, gradient, attribution, induction, combined; "
               "GUIDE@ALLOCATION overrides --allocation for one guide (e.g. attribution@sensitivity).",
               parse=GuideList()),
        Option("target", str, "neurons", "Units to prune: comma list of neurons, heads, layers.",
               parse=TargetList()),
        Option("sparsity", str, None, "Fractions (0.1,0.2,0.3: each for every target) or neurons=0.3,heads=0.2 "
                                      "(default 0.2; not with --budget, which searches it).", parse=SparsityLevels()),
        Option("budget", float, None, "Instead of --sparsity: at most this fraction of the dense cost (a "
                                      "sequential search: it runs in this process, also with --executor ray).",
               min=0, min_exclusive=True, max=1, max_exclusive=True),
        Option("budget_unit", str, None, "What --budget limits (default latency).", choices=("latency", "flops")),
        Option("tasks", str, DEFAULT_TASKS, "Comma-separated task ids (see `mechkit tasks`).", parse=TaskList()),
        Option("calib", int, 16, "Calibration prompts per task (scores and budget search only).", min=1),
        Option("n", int, 30, "Held-out prompts per task (evaluation only).", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("allocation", str, "global", "Spread over layers: uniform, global, global-z, or sensitivity "
                                            "(measured per-layer MLP sensitivity on calibration prompts).",
               choices=("uniform", "global", "global-z", "sensitivity")),
        Option("gqa", str, "slot", "Heads under GQA: slot (same count from every group) or group (whole groups).",
               choices=("slot", "group")),
        Option("reconstruct", str, "lsq", "What replaces removed units: none (zero), mean (their calibration mean "
                                          "as a bias, FLAP) or lsq (refit the kept columns and a bias of the "
                                          "projection that read them, by ridge least squares on calibration "
                                          "activations).", choices=("none", "mean", "lsq")),
        Option("sequential", bool, False, "lsq: prune and refit layer by layer, each fit on the inputs the pruned "
                                          "layers below produce (about 4x the refit time; default: every fit "
                                          "on dense activations).", is_flag=True),
        Option("ridge", float, 1e-2, "lsq: ridge, a fraction of the mean input variance; large values tend to "
                                     "mean compensation.", min=0, max=1e6),
        Option("calib_text_weight", float, 0.5, "Weight of generic text (CPython's reference topics, never the "
                                                "held-out text) in the calibration statistics and the lsq fits; "
                                                "task prompts weigh the rest.", min=0, max=1),
        Option("guide_text_weight", float, 0.5, "gradient/attribution-based guides: weight of the same scores "
                                                "under the generic text's language-modelling loss (keeps general "
                                                "ability; 0 = the tasks only).", min=0, max=1),
        Option("protect_top_k", int, 10, "induction/combined guides: never remove the top-k induction and "
                                         "previous-token heads.", min=0),
        Option("save_model", bool, False, "Write the pruned model to DIR/model (safetensors).", is_flag=True),
        Option("repeats", int, 7, "Timed forward passes per model (median).", min=1),
        Option("timing", str, "last", "Timed forward: logits of the last position only (answering a prompt, a "
                                      "generation's prefill) or of every position; both are reported, this one "
                                      "is the speedup and the budget.", choices=("last", "all")),
        Option("timing_batch", int, 8, "Prompts in the timed batch.", min=1),
        Option("batch_size", int, 16, "Prompts per forward pass when scoring.", min=1),
        *EXECUTION,  # the rows of the guide × sparsity grid can run on Ray workers (the budget search cannot)
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.pruning import PruneConfig, PruneStudy
        from mechkit.pruning.figures import accuracy_vs_speedup, kept_heads
        from mechkit.pruning.findings import finding, prune_results
        from mechkit.report import draw

        opts = ctx.options
        guides, targets, tasks = opts["guide"], opts["target"], opts["tasks"]
        unread.prune_model(ctx.model.anatomy, targets, opts["gqa"], opts["budget"])  # before any work
        # the levels depend on --target (a bare fraction is for every target): resolved here, before any work
        levels = [] if opts["budget"] is not None else (opts["sparsity"] or SparsityLevels()("0.2")).resolve(targets)
        unread.prune_levels(ctx.model.anatomy, levels, guides, opts["allocation"], opts["gqa"])
        config = PruneConfig(**{name: opts[name] for name in SAME_NAMES}, targets=targets, n_calib=opts["calib"],
                             seed=ctx.seed, text_weight=opts["calib_text_weight"])
        study = PruneStudy(ctx.model, tasks, config, step=ctx.step)
        dense = study.dense()
        rows, budget = [], None
        with ctx.progress() as bar:
            if opts["budget"] is not None:
                job = bar.add_task("budget search", total=None)
                budget = study.budget(guides[0], opts["budget"], opts["budget_unit"] or "latency",
                                      on_step=lambda mix, s, r: bar.update(job, description=f"budget {mix} {r:.2f}"))
                rows.append(budget["chosen_row"])
            elif opts["executor"] == "ray":  # scores here, rows on the workers, each timed where it ran
                from mechkit.pruning.grid import grid_rows

                job = bar.add_task("prune", total=len(guides) * len(levels))
                rows = grid_rows(study, guides, levels, ctx.map_units, on_row=lambda: bar.advance(job))
            else:
                job = bar.add_task("prune", total=len(guides) * len(levels))
                for guide in guides:
                    for level in levels:
                        bar.update(job, description=f"{guide} {level}")
                        rows.append(study.row(guide, level))
                        bar.advance(job)
        dense.update(latency_s=study.dense_latency(), latency_ratio=1.0, speedup=1.0, timed_as=study.dense_timing)
        files = {}
        if opts["save_model"]:  # the budget plan, or the first guide at the last level; the writer moves it to model/
            saved = rows[-1] if budget else [r for r in rows if r["guide"] == guides[0]][-1]
            files = {"model": study.save(saved)}
        results = prune_results(study, guides, opts["calib"], dense, rows, budget)
        figures = {"accuracy_vs_speedup": draw(accuracy_vs_speedup(tasks, dense, rows))}
        if {"heads", "layers"} & set(targets):  # which heads each guide keeps at its highest sparsity
            a = ctx.model.anatomy
            last = {r["guide"]: r for r in rows}
            figures |= {f"kept_heads_{guide}": draw(kept_heads(r, a.n_layers, a.n_heads)) for guide, r in last.items()}
        return Result(results=results, figures=figures, files=files, finding=finding(results))

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        """--budget searches the sparsity: a --sparsity beside it, or a --budget-unit without it, would be ignored;
        so would the options of a reconstruction or guide not run (:func:`refuse_unread`)."""
        from mechkit.options import OptionError

        if parsed["budget"] is not None and parsed["sparsity"] is not None:
            raise OptionError("--sparsity and --budget were both given; --budget searches the sparsity itself",
                              "drop --sparsity, or drop --budget to measure the levels given")
        if parsed["budget"] is None and parsed["budget_unit"] is not None:
            raise OptionError(f"--budget-unit {parsed['budget_unit']} without --budget limits nothing",
                              "add --budget (a fraction of the dense cost), or drop --budget-unit")
        unread.prune(cls, parsed)

    @classmethod
    def writes(cls, params: dict) -> tuple[str, ...]:
        """``model/`` with --save-model: checked against --out before the model loads."""
        return ("model",) if params.get("save_model") else ()

    @classmethod
    def saved_model_bytes(cls, parsed: dict, handle) -> int:
        """A lower bound (the weights --target cannot remove): a model that fits ``ulimit -f`` is not refused."""
        from mechkit.pruning.cost import fewest_saved_bytes

        return fewest_saved_bytes(handle, parsed["target"])

    @classmethod
    def tables(cls, results: dict) -> list:
        """Guides × sparsity (mean accuracy, speedup), then every measured model, the dense one first."""
        from mechkit.report import Table

        rows, dense, tasks = results["rows"], results["dense"], results["tasks"]
        levels = list(dict.fromkeys(_level(r["sparsity"]) for r in rows))
        guides = list(dict.fromkeys(r["guide"] for r in rows))
        by = {(r["guide"], _level(r["sparsity"])): r for r in rows}

        def pivot(key: str) -> list[list]:
            return [[g, *((by[(g, lv)].get(key) if (g, lv) in by else None) for lv in levels)] for g in guides]

        note = (f"dense: mean accuracy {_num(dense['mean_accuracy'])} on {', '.join(tasks)}; "
                f"speedup: measured forward latency of dense / pruned")
        every = [["dense", *(dense["accuracy"].get(t) for t in tasks), dense["mean_accuracy"], dense.get("perplexity"),
                  dense["params"], 1.0]]
        every += [[f"{r['guide']} {_level(r['sparsity'])}", *(r["accuracy"].get(t) for t in tasks), r["mean_accuracy"],
                   r.get("perplexity"), r["params"], r.get("speedup")] for r in rows]
        return [Table("Mean exact-match accuracy: guide × sparsity", ["guide", *levels], pivot("mean_accuracy"),
                      note=note),
                Table("Speedup over dense: guide × sparsity", ["guide", *levels], pivot("speedup")),
                Table("Every model measured", ["model", *tasks, "mean", "perplexity", "parameters", "speedup"], every,
                      note=f"held-out perplexity on {results.get('heldout_text') or 'held-out text'}")]


def _level(sparsity: dict) -> str:  # as mechkit.pruning.findings.level_text: the tables must not import torch
    return ",".join(f"{k}={v:.2f}" for k, v in sparsity.items())


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "—" if v is None else format(v, fmt)
