"""``mechkit select-tasks``: choose auxiliary tasks for multitask fine-tuning (seed 000 Ch. 3, Algorithm 1).

For each ``--target``, every candidate of ``--pool`` (default: every other text task that is not a
composite of the target) is embedded with the model (``--representation``), ranked by cosine similarity
of its vector to the target's, and added in that order while the coverage of the target
(``1 / (μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0)``, Ledoit–Wolf covariance) grows by the factor ``1 + p``.
The report holds the ranking, the coverage curve, the selected set and why it stopped, and the task
similarity heatmap. ``--validate`` fine-tunes a LoRA copy on Selected, All, Random (``--draws``),
No Con., No Div. and nothing, all with the same steps and training examples, at each of ``--seeds``;
plus each candidate alone (``--transfer-seeds``) for the Spearman ρ of its gain with similarity and
coverage under every representation. The fine-tunes are units of ``--executor``.
"""

from __future__ import annotations

from mechkit.options import EXECUTION, NumberList, Option, OptionError, TaskList, unread
from mechkit.plugin import Plugin, Result, RunContext

SEEDS = NumberList(int, min=0, example="0,1,2")


class SelectTasksPlugin(Plugin):
    name = "select-tasks"
    version = "0.1.0"
    needs = frozenset({"weight_writes", "weight_reads", "gradients"})  # --validate fine-tunes copies
    summary = "Choose fine-tuning tasks for a target by consistency and diversity (Algorithm 1), optionally validate."
    # hidden states, activation vectors, LoRA gradients and fine-tunes of a copy: any shape of model
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    options = (
        Option("target", str, None, "Target task id(s), comma-separated (one study each).", required=True,
               parse=TaskList()),
        Option("pool", str, None, "Candidate task ids (default: every other text task not a composite of the target).",
               parse=TaskList(allow_empty=True)),
        Option("representation", str, "hidden", "How a task is embedded: hidden states, their first principal "
               "component, the activation task vector, or per-example LoRA gradients (the weight-space task "
               "vector of one SGD step).", choices=("hidden", "pc1", "actvec", "lora-grad")),
        Option("p", float, 0.1, "Threshold: add a task while coverage grows by at least the factor 1+p.", min=0,
               min_exclusive=True),
        Option("n", int, 32, "Examples embedded per task.", min=1),
        Option("layer", int, -1, "Block whose residual stream is read (-1: the last)."),
        Option("position", str, "last", "Token read: the last (answer filled in) or the mean over tokens.",
               choices=("last", "mean")),
        Option("estimator", str, "ledoit-wolf", "Shrinkage covariance for coverage.", choices=("ledoit-wolf", "oas")),
        Option("grad_blocks", int, 0, "lora-grad: the last K blocks whose LoRA B gradients count (0: every block).",
               min=0),
        Option("raw", bool, False, "Cosine of raw means (the seeds') instead of means centred on the study's mean.",
               is_flag=True),
        Option("validate", bool, False, "Fine-tune on each selection method and score the target.", is_flag=True),
        Option("seeds", str, "0,1", "Fine-tuning seeds (--validate).", parse=SEEDS),
        Option("steps", int, 30, "Optimizer steps per fine-tune (--validate).", min=1),
        Option("budget", int, 240, "Training examples per fine-tune, split over its tasks (--validate).", min=1),
        Option("batch_size", int, 8, "Prompts per step (--validate).", min=1),
        Option("lr", float, 1e-3, "LoRA learning rate (--validate).", min=0, min_exclusive=True),
        Option("rank", int, 8, "LoRA rank (--validate, and lora-grad's adapters).", min=1),
        Option("eval_n", int, 40, "Held-out target prompts per setting (--validate).", min=1),
        Option("eval_shots", str, "0,3", "Demonstrations in the target's evaluation prompts (--validate).",
               parse=NumberList(int, min=0, example="0,3")),
        Option("draws", int, 3, "Random draws for Random and No Con. (--validate).", min=1),
        Option("no_div_size", int, 0, "Size of the No Div. set (0: twice the selected size).", min=0),
        Option("transfer_seeds", int, 1, "Seeds of the single-candidate fine-tunes for ρ (--validate; 0: none).",
               min=0),
        *EXECUTION,  # the fine-tunes are independent units
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        from mechkit.errors import MechkitError
        from mechkit.taskselect.pool import resolve_pool
        from mechkit.taskselect.representations import check_examples

        try:
            check_examples(parsed["representation"], parsed["n"])
            pools = [resolve_pool(t, parsed["pool"]) for t in parsed["target"]]
        except MechkitError as err:
            raise OptionError(err.problem, err.fix) from None
        every = parsed["validate"] and parsed["transfer_seeds"]  # the ρ table embeds every representation
        if parsed["representation"] != "lora-grad" and ((parsed["grad_blocks"] and not every) or (
                parsed["rank"] != 8 and not parsed["validate"])):  # an option that would be ignored
            name = "--grad-blocks" if parsed["grad_blocks"] else "--rank"
            also = " or --validate's ρ table (--transfer-seeds above 0)" if name == "--grad-blocks" else " or --validate"
            raise OptionError(f"{name} counts only under --representation lora-grad{also}",
                              f"pass --representation lora-grad, or leave {name} out")
        unread.select_tasks(cls, parsed)  # the fine-tunes' options, silently ignored without --validate
        if parsed["validate"] and parsed["budget"] < max(len(p) for p in pools):
            raise OptionError(f"--budget {parsed['budget']} gives some candidate no training example in All "
                              f"({max(len(p) for p in pools)} candidates)", "raise --budget")

    def run(self, ctx: RunContext) -> Result:
        from mechkit.taskselect.pool import resolve_pool
        from mechkit.taskselect.study import FeatureConfig, features, selection_study

        opts = ctx.options
        cfg = FeatureConfig(representation=opts["representation"], n=opts["n"], layer=opts["layer"],
                            position=opts["position"], seed=ctx.seed, estimator=opts["estimator"],
                            center=not opts["raw"], rank=opts["rank"], grad_blocks=opts["grad_blocks"])
        pools = {target: resolve_pool(target, opts["pool"]) for target in opts["target"]}
        every = list(dict.fromkeys(t for target, pool in pools.items() for t in (target, *pool)))
        have = features(ctx.model, every, cfg)  # each task embedded once, centred on the whole study's mean
        targets, feats = {}, {}
        for target, pool in pools.items():
            targets[target], feats[target] = selection_study(ctx.model, target, pool, opts["p"], cfg, have)
        results = {"features": {**cfg.__dict__, "layer": cfg.layer % ctx.model.anatomy.n_layers},
                   "targets": targets}
        if opts["validate"]:
            self._validate(ctx, results, feats, cfg, have)
        return self._result(results)

    def _validate(self, ctx: RunContext, results: dict, feats: dict, cfg, have: dict) -> None:
        from mechkit.taskselect.select import Selection
        from mechkit.taskselect.study import (
            features_by_representation,
            measures_by_representation,
            method_table,
            reselector,
            run_units,
            transfer,
            validation_units,
        )
        from mechkit.taskselect.validate import TrainConfig

        opts = ctx.options
        columns = [f"{s}-shot" for s in opts["eval_shots"]]
        results["columns"], results["table"] = columns, {}
        scratch = ctx.scratch("finetunes")
        # every representation's features of every task, once, and before any fine-tune: a refusal (lora-grad's
        # memory cap) then costs nothing
        by_rep = features_by_representation(ctx.model, list(have), cfg, have) if opts["transfer_seeds"] else None
        for target, r in results["targets"].items():
            config = TrainConfig(target=target, steps=opts["steps"], budget=opts["budget"],
                                 batch_size=opts["batch_size"], lr=opts["lr"], rank=opts["rank"],
                                 eval_n=opts["eval_n"], eval_shots=tuple(opts["eval_shots"]), eval_seed=ctx.seed)
            sel = Selection(**r["selection"])
            units = validation_units(sel, reselector(feats[target], target, opts["p"], cfg.estimator), config,
                                     opts["seeds"], opts["draws"], opts["transfer_seeds"], opts["no_div_size"] or None)
            with ctx.progress() as bar:
                job = bar.add_task(f"fine-tunes for {target}", total=len({repr((u["tasks"], u["seed"]))
                                                                            for u in units}))
                done = run_units(ctx.map_units, config, units, str(scratch) if scratch else None,
                                 on_result=lambda _i, _v, job=job: bar.advance(job))
            pool = sel.order
            measures = (measures_by_representation(target, pool, opts["p"], cfg.estimator, by_rep)
                        if opts["transfer_seeds"] else {})
            r["config"], r["units"] = config.as_dict(), done
            r["transfer"] = transfer(done, columns, measures)
            results["table"][target] = method_table(done, columns)

    def _result(self, results: dict) -> Result:
        from mechkit.taskselect.findings import coverage_figure, finding, heatmap_figure

        figures = {"coverage_curve": coverage_figure(results)}
        for target, r in results["targets"].items():
            heat = r["heatmap"]
            figures[f"similarity_{target}"] = heatmap_figure(
                heat["tasks"], heat["cosine"], f"Task similarity ({results['features']['representation']}), "
                                               f"target {target}")
        results["summary"] = {t: f"{', '.join(r['selection']['selected'])} ({r['selection']['stop']})"
                              for t, r in results["targets"].items()}
        return Result(results=results, figures=figures, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        return tables(results)


def tables(results: dict) -> list:
    """Per target: candidates by similarity with the coverage curve; with --validate the Table 3.1 shape
    (targets × methods, mean ± std) and the Spearman ρ of single-candidate gain."""
    from mechkit.report import Table, pm
    from mechkit.taskselect.conditions import METHODS

    out = []
    for target, r in results["targets"].items():
        s = r["selection"]
        rows = [[i + 1, t, s["similarity"][t], s["curve"][i], s["single"][t], "yes" if t in s["selected"] else ""]
                for i, t in enumerate(s["order"])]
        out.append(Table(f"{target}: candidates by similarity", ["rank", "task", "cosine similarity",
                                                                  "coverage of the first k", "coverage alone",
                                                                  "selected"],
                         rows, note=s["stop"], digits=4))
    table, cols = results.get("table") or {}, results.get("columns") or []
    for col in cols:
        rows = [[t, *(pm(row[m][col]["mean"], row[m][col]["std"]) if m in row else None for m in METHODS)]
                for t, row in table.items()]
        out.append(Table(f"Target exact match, {col} (Table 3.1 shape)", ["target", *METHODS], rows,
                         note="mean ± std over seeds (Random and No Con.: over seeds and draws); every fine-tune "
                              "has the same steps and the same number of training examples", digits=3))
    rho_rows = [[t, key, v["similarity"], v["coverage"]] for t, r in results["targets"].items()
                for key, v in ((r.get("transfer") or {}).get("rho") or {}).items()]
    if rho_rows:
        out.append(Table("Does the metric predict transfer? Spearman ρ with single-candidate gain",
                         ["target", "representation | eval", "ρ(gain, similarity)", "ρ(gain, log coverage alone)"],
                         rho_rows, digits=2))
    return out
