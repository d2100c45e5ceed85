"""``mechkit adapt``: one model that adapts to a latency budget at run time, training-free.

Execution plans (which blocks run, which context tokens stay after layer K) come from an importance
guide on calibration prompts; their latency is measured here and predicted by a calibrated cost table;
a scheduler picks, per budget, the plan with the best calibration accuracy — per input from an
early-layer task signal, or one static plan. On held-out prompts it reports, per budget, accuracy and
measured latency for the adaptive scheduler, the best static plan and static pruning (compared at the
scheduler's measured latency), adherence to the budget (its margin calibrated split-conformally for
``--adherence``, then ``--debias``-ed), the plans chosen and the accuracy–latency frontier; the
scheduler is saved as ``scheduler.json`` for ``mechkit.adapt.adaptive(model, budget=0.7,
scheduler="DIR/scheduler.json")``.

The measurements are :class:`mechkit.adapt.AdaptStudy`'s, asked through one :class:`~mechkit.adapt.AdaptConfig`;
what they say (the same-latency comparison, summary, finding) is :mod:`mechkit.adapt.findings`'s; this
plugin declares the options and shapes the tables and figures.
"""

from __future__ import annotations

import json

from mechkit.options import DEFAULT_TASKS, NumberList, OptionError, OrAuto, TargetList, TaskList, unread
from mechkit.plugin import Option, Plugin, Result, RunContext

SAME_NAMES = ("guide", "n", "shots", "signal_layer", "protect_top_k", "repeats", "timing_prompts", "margin", "min_cv",
              "batch_size", "clock", "select", "adherence", "margin_prompts", "margin_plans", "debias")
"""Options that are :class:`~mechkit.adapt.AdaptConfig` fields of the same name."""


class AdaptPlugin(Plugin):
    name = "adapt"
    version = "0.2.0"  # 0.2: same_latency compares at the scheduler's latency (pruned copies bracketing it)
    needs = frozenset({"module_calls", "patterns", "generation", "gradients", "weight_writes"})
    pruned = frozenset({"layers"})  # docs/analyses/prune.md: removed blocks leave a shallower dense model
    pruned_why = {kind: ("its execution plans skip heads and MLP channel groups counted on the dense model's widths, "
                         "and its static-pruning baseline (--prune-budgets) prunes the model again, which a model "
                         "with pruned neurons or heads cannot be", "run it on the dense model")
                  for kind in ("neurons", "heads")}
    summary = "Adaptive inference under a latency budget: per-input execution plans and token selection."
    options = (
        Option("tasks", str, DEFAULT_TASKS, "Comma-separated task ids (see `mechkit tasks`).", parse=TaskList()),
        Option("budgets", str, "0.5,0.6,0.7,0.8,0.9,1.0", "Latency budgets, fractions of the dense latency.",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, sort=True, example="0.5,0.7,1.0")),
        Option("guide", str, "attribution", "Block importance: attribution (first-order), ablation (exact "
                                            "bypass of each block) or induction (attribution; blocks with the "
                                            "top induction/previous-token heads always run).",
               choices=("attribution", "ablation", "induction")),
        Option("token_layers", str, "auto", "Token selection after these blocks (blank: none; auto: the blocks at "
                                        "20, 40 and 60% of the depth from --signal-layer on, 6,12,18 on 30 "
                                        "blocks); each with every --token-keep.",
               parse=OrAuto(NumberList(int, min=0, sort=True, allow_empty=True))),
        Option("token_keep", str, "0.5,0.3", "Shares of the context tokens kept after a --token-layers block.",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, sort=True, allow_empty=True)),
        Option("signal_layer", int, None, "The block after which the scheduler reads the task signal (blocks up "
                                          "to it always run; default 1, or 0 on a model of 2 blocks).", min=0),
        Option("select", str, "logprob", "What ranks plans within a budget: the calibration prompts' mean answer "
                                         "log-prob (smooth) or their exact-match accuracy (coarse with few prompts).",
               choices=("logprob", "accuracy")),
        Option("min_cv", float, 0.9, "Trust the task signal only at this cross-validated accuracy; else static.",
               min=0, max=1),
        Option("adherence", float, 0.99, "Target share of inputs measured within the budget: the margin "
                                         "subtracted from each budget is the split-conformal ⌈(n+1)q⌉/n quantile of "
                                         "measured − predicted latency on calibration prompts.",
               min=0, max=1, min_exclusive=True, max_exclusive=True),
        Option("margin_prompts", int, None, "Calibration prompts per task timed for the margin, each against dense "
                                            "under --margin-plans plans (not the cost table's fitting prompts); "
                                            "tasks × prompts × plans must reach q/(1−q) residuals (99 for 0.99). "
                                            "Default: 4, or as many as that needs where the model offers fewer "
                                            "distinct plans.", min=1),
        Option("margin_plans", int, 10, "Plans spanning the predicted ratios timed on each margin prompt.", min=1),
        Option("debias", bool, True, "Time the plans the scheduler chooses on the margin prompts too: each gets "
                                     "its median residual added to its prediction, and the margin is recalibrated "
                                     "on the de-biased residuals (--no-debias: the first margin, as before).",
               is_flag=True),
        Option("margin", float, None, "Safety margin subtracted from each budget, given by hand (skips the "
                                      "conformal calibration; default: calibrated for --adherence).", min=0, max=1),
        Option("calib", int, 8, "Calibration prompts per task (guides, candidate scores, signal).", min=2),
        Option("n", int, 10, "Held-out prompts per task.", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("repeats", int, 3, "Timed runs per plan and input, each between two dense runs (medians).", min=1),
        Option("clock", str, "auto", "Latency clock: wall (elapsed), cpu (the timing thread's CPU time: latency on an idle "
                                     "core, less sensitive to other jobs on a shared machine) or auto (cpu on a one-thread "
                                     "CPU run, else wall).", choices=("auto", "wall", "cpu")),
        Option("timing_prompts", int, 1, "Calibration prompts per task timed for the cost table.", min=1),
        Option("prune_budgets", str, "0.7", "Budgets at which to run static pruning for comparison (blank: none).",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, max_exclusive=True, sort=True,
                                allow_empty=True)),
        Option("prune_targets", str, "neurons", "Units static pruning may remove: neurons, heads, layers.",
               parse=TargetList()),
        Option("prune_reconstruct", str, "lsq", "What replaces the units static pruning removes (as `mechkit prune "
                                                "--reconstruct`, whose default this is): none, mean or lsq.",
               choices=("none", "mean", "lsq")),
        Option("protect_top_k", int, 10, "induction guide: top-k induction and previous-token heads whose "
                                         "blocks always run.", min=0),
        Option("batch_size", int, 8, "Prompts per forward pass when scoring.", min=1),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.adapt import AdaptConfig, AdaptStudy
        from mechkit.adapt.config import auto_token_layers
        from mechkit.adapt.figures import frontier, per_task
        from mechkit.adapt.findings import finding, same_latency, summary_lines
        from mechkit.report import draw

        opts = ctx.options
        if "neurons" in opts["prune_targets"]:  # before any work: a mixture of experts has experts, not neurons
            ctx.model.anatomy.refuse_moe("dense MLP neurons to prune", "pass --prune-targets heads,layers")
        same = {name: opts[name] for name in SAME_NAMES}  # signal_layer None: picked for the depth (AdaptConfig)
        signal = same["signal_layer"] if same["signal_layer"] is not None else \
            AdaptConfig(signal_layer=None).check(ctx.model.anatomy.n_layers).signal_layer
        token_layers = opts["token_layers"]  # None: auto
        token_layers = auto_token_layers(ctx.model.anatomy.n_layers, signal) if token_layers is None else token_layers
        config = AdaptConfig(**{**same, "signal_layer": signal}, n_calib=opts["calib"], seed=ctx.seed,
                             token_options=[(k, keep) for k in token_layers for keep in opts["token_keep"]])
        study = AdaptStudy(ctx.model, opts["tasks"], config, step=ctx.step)
        study.check_margin_sample()  # too few residuals for --adherence: say so before any work
        results = study.run(opts["budgets"], opts["prune_budgets"], opts["prune_targets"], opts["prune_reconstruct"])
        scheduler = results.pop("scheduler")
        results["same_latency"] = same_latency(results)
        results["summary"] = summary_lines(results)
        figures = {"frontier": draw(frontier(results)), "accuracy_vs_budget": draw(per_task(results))}
        return Result(results=results, figures=figures,
                      files={"scheduler.json": json.dumps(scheduler, indent=1)}, finding=finding(results))

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        missing = [b for b in parsed["prune_budgets"] if b not in parsed["budgets"]]
        if missing:  # pruning is compared with the scheduler at the same budget: it must run there too
            kept = [b for b in parsed["prune_budgets"] if b in parsed["budgets"]] or parsed["budgets"][-1:]
            raise OptionError(f"--prune-budgets {','.join(f'{b:g}' for b in missing)} not among --budgets "
                              f"{','.join(f'{b:g}' for b in parsed['budgets'])} (--prune-budgets is 0.7 unless given)",
                              f"pass --prune-budgets {','.join(f'{b:g}' for b in kept)} (budgets among --budgets), "
                              "or --prune-budgets '' for none, or add them to --budgets")
        unread.adapt(cls, parsed)
        from mechkit.adapt.config import AdaptConfig

        AdaptConfig(**{k: parsed[k] for k in ("adherence", "margin", "margin_prompts", "margin_plans")}) \
            .check_margin_sample(len(parsed["tasks"]))  # too few margin prompts on any model: said before the load

    @classmethod
    def check_seeded(cls, parsed: dict, seed: int) -> None:
        """A task left no held-out prompt (``--n 1 --shots 0``), refused before the load: the prompts are text."""
        from mechkit.adapt.study import check_heldout

        check_heldout(parsed["tasks"], {**parsed, "n_calib": parsed["calib"]}, seed)

    @classmethod
    def tables(cls, results: dict) -> list:
        from mechkit.adapt.findings import copy_words, feasible, margin_note, num
        from mechkit.report import Table

        tasks, rows = results["tasks"], results["rows"]
        main = []
        for r in rows:
            ada, sta, pru = r["adaptive"], r["static"], r.get("prune") or {}
            main.append([r["budget"], ada["mean_accuracy"], sta["mean_accuracy"], pru.get("mean_accuracy"),
                         ada["latency_ratio"], sta["latency_ratio"], pru.get("latency_ratio"), ada["adherence"],
                         ada.get("adherence_dense_met"), ada["adherence_with_noise"], ada.get("coverage"),
                         feasible(r), ada["tokens_kept"]])
        noise = (results.get("input_noise") or {}).get("p95", results["cost"].get("noise"))
        note = (f"held-out prompts per task: {results['heldout_prompts']}; latency: median over inputs of the "
                f"measured prefill latency / dense on the same input (prune: the pruned copy timed the same way); "
                f"adherence: share of inputs within the budget — strictly by measurement; counting the dense "
                f"plan as within any budget ≥ 1 (it is the reference: its measured ratio is timing noise); and "
                f"within the measured noise {num(noise)} (95th percentile of |1 − dense/dense| per input); "
                f"{margin_note(results)}; coverage: share measured within predicted + margin; dense "
                f"accuracy {num(results['dense']['mean_accuracy'])}")
        per_task = [[r["budget"], t, r["adaptive"]["accuracy"][t], r["static"]["accuracy"][t],
                     (r.get("prune") or {}).get("accuracy", {}).get(t)] for r in rows for t in tasks]
        plans = [[r["budget"], t, "; ".join(f"{label} ×{n}" for label, n in r["adaptive"]["plans"][t].items()),
                  "; ".join(r["static"]["plans"][t])] for r in rows for t in tasks]
        cost, table = results["cost"], results["cost"]["table"]
        checks = [[row["plan"], row["tokens"], row["measured"], row["predicted"]]
                  for part in ("fit", "validation") for row in cost[part]["rows"]]
        same = [[x["budget"], x["adaptive"], x["adaptive_latency"], x["prune"], x["verdict"],
                 "; ".join(f"{c['kind']}: {copy_words(c)}" for c in x["copies"])]
                for x in results.get("same_latency", [])]
        return [
            Table("Mean accuracy and measured latency by budget", ["budget", "adaptive", "best static", "static prune",
                  "adaptive latency", "static latency", "prune latency", "adherence (strict)",
                  "(dense = met)", "(±noise)", "coverage", "feasible", "tokens kept"], main,
                  note=note),
            Table("Static pruning at the adaptive scheduler's measured latency",
                  ["budget", "adaptive", "adaptive latency", "prune (interpolated)", "keeps more", "pruned copies"],
                  same, note="pruned copies: `mechkit prune --budget` at the budget, and searched to the scheduler's "
                             "measured latency (matched); each timed on every held-out input as the plans are; pruning "
                             "at the scheduler's latency is read off the segment between the copies that bracket it"),
            Table("Held-out accuracy per task", ["budget", "task", "adaptive", "best static", "static prune"], per_task),
            Table("Plans chosen (adaptive: plan × inputs; static: the best plan over all tasks)",
                  ["budget", "task", "adaptive", "static"], plans,
                  note="a plan's predicted cost depends a little on the prompt's length (token selection), so the "
                       "static choice can differ between prompts of different lengths"),
            Table("Cost table: measured vs predicted latency (fraction of dense)",
                  ["plan", "tokens", "measured", "predicted"], checks,
                  note=(f"ratio ≈ 1 − {table['beta_attn']:.3f}·(1 − work_attn) − {table['beta_mlp']:.3f}·(1 − "
                        f"work_mlp) + {table['gamma']:.3f}·ranks + {table['eta']:.3f}·masked; one block ≈ {cost['per_layer_ms']:.1f} ms of "
                        f"{cost['dense_ms']:.0f} ms at {cost['typical_tokens']} tokens; validation mean |error| "
                        f"{num(cost['validation']['mean_abs_error'], '.3f')}, max "
                        f"{num(cost['validation']['max_abs_error'], '.3f')}; noise {num(noise, '.3f')}")),
        ]
