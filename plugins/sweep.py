"""``mechkit sweep``: an importance map over all heads — the effect of ablating each one on a task.

``--method exact`` ablates every head for real, replaying only the layers at and above it;
``--method attribution`` estimates every effect from one forward and one backward pass;
``--method both`` runs both and reports their rank agreement (Spearman) on the same prompts.

Both resume: the exact sweep keeps each (batch, layer) of ablations as a step, the attribution
estimate is one step, so an interrupted run started again with the same command goes on from there.
The exact sweep's (batch, layer) units run where ``--executor`` says (``ray``: on workers that each
load the model once), with the same report.
"""

from __future__ import annotations

from mechkit.options import EXECUTION, TaskList, unread
from mechkit.plugin import Option, Plugin, Result, RunContext


def _top(grid, k: int) -> list[dict]:
    """The k heads whose ablation lowers the metric most."""
    import numpy as np

    values = np.ravel(grid)
    flat = [i for i in np.argsort(values) if np.isfinite(values[i])][:k]  # NaN: a head a pruned layer lacks
    n_heads = grid.shape[1]
    return [{"layer": int(i // n_heads), "head": int(i % n_heads), "effect": float(values[i])} for i in flat]


class SweepPlugin(Plugin):
    name = "sweep"
    version = "0.1.0"
    needs = frozenset({"gradients"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Importance of every head for a task: the effect of ablating each one (exact or attribution)."
    options = (
        Option("tasks", str, "capitalize", "Comma-separated task ids; prompts of all tasks are pooled.",
               parse=TaskList()),
        Option("n", int, 16, "Prompts per task.", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("setting", str, None, "For composite tasks (a+b): simple, composite or composite-in-context.",
               choices=("simple", "composite", "composite-in-context")),
        Option("method", str, "exact", "exact, attribution, or both (adds their rank agreement).",
               choices=("exact", "attribution", "both")),
        Option("top_k", int, 10, "How many most important heads to list.", min=1),
        Option("batch_size", int, 16, "Prompts per forward pass.", min=1),
        *EXECUTION,  # the exact sweep's (batch, layer) units can run on Ray workers
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        unread.sweep(cls, parsed)  # --executor under --method attribution: no unit is mapped

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.evaluation import task_prompts
        from mechkit.heads.effects import attribution_effects, exact_effects, spearman
        from mechkit.heads.scores import grid_list
        from mechkit.report import head_heatmap

        opts, model = ctx.options, ctx.model
        tasks = opts["tasks"]
        prompts = [q for ps in task_prompts(tasks, opts["n"], opts["shots"], ctx.seed, opts["setting"]).values() for q in ps]
        results: dict = {"tasks": tasks, "n_prompts": len(prompts), "metric": "mean answer log-prob"}
        figures = {}
        if opts["method"] in ("exact", "both"):
            n_batches = -(-len(prompts) // opts["batch_size"])
            with ctx.progress() as bar:
                job = bar.add_task("exact sweep (layers)", total=model.anatomy.n_layers * n_batches)
                exact = exact_effects(model, prompts, opts["batch_size"], on_layer=lambda: bar.advance(job),
                                      map_units=ctx.map_units)
            results["exact"] = {"logprob_effect": grid_list(exact.logprob, model.anatomy),
                                "accuracy_effect": grid_list(exact.accuracy, model.anatomy),
                                "clean_logprob": exact.clean_logprob, "clean_accuracy": exact.clean_accuracy,
                                "top": _top(exact.logprob, opts["top_k"])}
            figures["exact_logprob_effect"] = head_heatmap(exact.logprob, "Δ answer log-prob when the head is ablated",
                                                           "Δ log-prob")
            figures["exact_accuracy_effect"] = head_heatmap(exact.accuracy, "Δ accuracy when the head is ablated",
                                                            "Δ accuracy")
        if opts["method"] in ("attribution", "both"):
            attr = attribution_effects(model, prompts, opts["batch_size"], step=ctx.step)  # each batch resumable
            results["attribution"] = {"logprob_effect": grid_list(attr.logprob, model.anatomy),
                                      "clean_logprob": attr.clean_logprob,
                                      "top": _top(attr.logprob, opts["top_k"])}
            figures["attribution_logprob_effect"] = head_heatmap(attr.logprob, "Attribution estimate of Δ log-prob",
                                                                 "Δ log-prob (estimated)")
        if opts["method"] == "both":
            exact_top = {(h["layer"], h["head"]) for h in results["exact"]["top"]}
            attr_top = {(h["layer"], h["head"]) for h in results["attribution"]["top"]}
            results["agreement"] = {"spearman": spearman(exact.logprob, attr.logprob),
                                    f"top{opts['top_k']}_overlap": len(exact_top & attr_top) / max(len(exact_top), 1)}
        best = results.get("exact", results.get("attribution"))["top"][:5]
        results["summary"] = {"most important heads": ", ".join(f"{h['layer']}.{h['head']} ({h['effect']:+.3f})"
                                                                for h in best)}
        if "agreement" in results:
            rho = results["agreement"]["spearman"]
            results["summary"]["spearman(exact, attribution)"] = "undefined (a constant grid)" if rho is None \
                else f"{rho:.3f}"
        return Result(results=results, figures=figures, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Rank × effects for the most important heads; the clean model and the methods' agreement."""
        from mechkit.report import Table, kv_table

        method = "exact" if "exact" in results else "attribution"
        top = results[method]["top"]

        def at(grid_of: str, key: str, h: dict):
            grid = (results.get(grid_of) or {}).get(key)
            return grid[h["layer"]][h["head"]] if grid else None

        columns = ["rank", "head", "Δ log-prob"]
        if method == "exact":
            columns.append("Δ accuracy")
        if "attribution" in results and method == "exact":
            columns.append("attribution Δ log-prob")
        rows = []
        for i, h in enumerate(top):
            row = [i + 1, {"layer": h["layer"], "head": h["head"]}, h["effect"]]
            if method == "exact":
                row.append(at("exact", "accuracy_effect", h))
            if "attribution" in results and method == "exact":
                row.append(at("attribution", "logprob_effect", h))
            rows.append(row)
        title = "Most important heads (" + ("exact ablation" if method == "exact" else "attribution estimate") + ")"
        facts = {"tasks": ", ".join(results["tasks"]), "prompts": results["n_prompts"],
                 "clean answer log-prob": results[method]["clean_logprob"]}
        if method == "exact":
            facts["clean accuracy"] = results["exact"]["clean_accuracy"]
        facts.update({f"agreement: {k}": v for k, v in (results.get("agreement") or {}).items()})
        return [Table(title, columns, rows, digits=3,
                      note="Δ: the metric with the head zero-ablated minus the clean metric (negative: the head helps)"),
                kv_table("Clean model and agreement", facts, digits=3)]


def finding(results: dict) -> str:
    """Which head matters most for the tasks, by how much, and (with both methods) how well the
    one-pass attribution estimate agrees with exact ablation."""
    method = "exact" if "exact" in results else "attribution"
    top, tasks = results[method]["top"], ", ".join(results["tasks"])
    best = top[0]
    name = f"{best['layer']}.{best['head']}"
    how = "ablating" if method == "exact" else "by the attribution estimate, ablating"
    if best["effect"] is not None and best["effect"] < 0:
        nxt = ", ".join(f"{h['layer']}.{h['head']} ({h['effect']:+.3f})" for h in top[1:3] if h["effect"] is not None)
        text = (f"On {tasks}, {how} head {name} lowers the mean answer log-prob most, by {-best['effect']:.3f} "
                f"(clean {results[method]['clean_logprob']:.3f})" + (f"; next {nxt}" if nxt else "") + ".")
    else:
        text = f"On {tasks}, {how} no single head lowers the mean answer log-prob (head {name} changes it least)."
    agreement = results.get("agreement")
    if agreement:
        rho = agreement.get("spearman")
        overlap = next((v for k, v in agreement.items() if k.endswith("_overlap")), None)
        k = next((k.removeprefix("top").removesuffix("_overlap") for k in agreement if k.endswith("_overlap")), "")
        text += (" The attribution estimate ranks the heads " + ("with an undefined Spearman correlation "
                 "(a constant grid)" if rho is None else f"with Spearman {rho:.2f}") + " against exact ablation"
                 + (f", sharing {overlap:.0%} of the top {k}" if overlap is not None else "") + ".")
    return text
