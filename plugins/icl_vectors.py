"""``mechkit icl-vectors``: can one activation vector stand in for the demonstrations?

Two kinds of vector, both written at the last token of a zero-shot prompt ``input: Q\\noutput:``:
the ICL task vector (Hendel et al. 2023: the residual stream after block L of demonstrations + a
dummy query, averaged, *replaces* the zero-shot one) and the function vector (Todd et al. 2024: the
summed mean outputs of the heads with the largest causal indirect effect on shuffled-label prompts,
*added* at layer L). Layer L (and with ``--spans 1,2`` a span of K layers) is chosen on dev prompts;
the report gives the per-layer curve and the conditions zero-shot, zero-shot + vector, shuffled-label
ICL ± vector and real ICL on held-out test prompts, and saves each vector (``--load-vector FILE``
evaluates a saved one instead). Prompt sets are seeded from ``--seed s`` (extraction s, CIE s+1, dev
s+2, test s+3). The study is :class:`mechkit.actvec.VectorStudy`'s, its layer scans one unit per layer
through ``--executor`` (:mod:`mechkit.actvec.scan`), what it says :mod:`mechkit.actvec.findings`'.
"""

from __future__ import annotations

from mechkit.options import (
    DEFAULT_TASKS,
    EXECUTION,
    ExistingPath,
    IntRanges,
    NumberList,
    OptionError,
    TaskList,
    unread,
)
from mechkit.options.unused import refuse_ignored
from mechkit.plugin import Option, Plugin, Result, RunContext


def check_spans(spans: tuple[int, ...], n_layers: int) -> list[int]:
    """The declared ``--spans`` (sorted, each at least 1), refusing one longer than the model is deep."""
    if spans[-1] > n_layers:
        raise OptionError(f"--spans {','.join(map(str, spans))!r} is out of range: the model has {n_layers} layers",
                          f"use whole numbers from 1 to {n_layers}, like 1,2")
    return list(spans)


class IclVectorsPlugin(Plugin):
    name = "icl-vectors"
    version = "0.1.0"
    needs = frozenset({"generation"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "ICL task vectors and function vectors: extract, pick a layer on dev, evaluate zero-shot + vector."
    options = (
        Option("tasks", str, None, f"Comma-separated task ids (default {DEFAULT_TASKS}, or the loaded vector's).",
               parse=TaskList()),
        Option("method", str, "both", "Which vectors.", choices=("task-vector", "function-vector", "both")),
        Option("n", int, 40, "Test prompts per task.", min=1),
        Option("n_dev", int, 20, "Dev prompts per task (choose the layer).", min=1),
        Option("n_contexts", int, 24, "ICL contexts averaged for the task vector and the mean head outputs.", min=1),
        Option("n_cie", int, 10, "Shuffled-label prompts for the heads' indirect effects.", min=1),
        Option("shots", int, 10, "Demonstrations per ICL prompt (2 or more: shuffled labels need two).", min=2),
        Option("top_k", int, 10, "Heads summed into the function vector (capped at the model's head count).", min=1),
        Option("fv_scales", str, "1,2,4,8", "Function-vector scales to try; layer and scale are chosen on dev.",
               parse=NumberList(float, min=0, min_exclusive=True, max=1000, example="1,2,4")),
        Option("layers", str, "all", "Layers to sweep: all, 12-24 or 10,20.", parse=IntRanges()),
        Option("spans", str, "1", "Numbers of consecutive layers L..L+K-1 to write the vector at (e.g. 1,2; "
                                  "a function vector adds scale/K at each); chosen on dev with the layer.",
               parse=NumberList(int, min=1, sort=True, example="1,2")),
        Option("load_vector", str, None, "Evaluate this saved vector (.safetensors) instead of extracting.",
               parse=ExistingPath("saved vector (.safetensors)")),
        Option("batch_size", int, 16, "Rows per forward pass.", min=1),
        *EXECUTION,  # the dev and test layer scans' layers can run on Ray workers
    )

    @classmethod
    def tables(cls, results: dict) -> list:
        return accuracy_tables(results)

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        """With --load-vector the vector's own task, method and place are used: a --tasks of another task
        evaluated it there and saved it as that task's vector, and a --method or an extraction option
        (--top-k, --fv-scales, --spans, --n-contexts, --n-cie, --n-dev) was silently ignored."""
        if parsed["load_vector"] is None:
            unread.icl_vectors(cls, parsed)  # the function vector's options under --method task-vector
            return
        from mechkit.actvec import ActivationVector
        from mechkit.errors import MechkitError

        try:  # its metadata, checked, before the model loads
            ActivationVector.load(parsed["load_vector"]).refuse_other_use(parsed["tasks"], parsed["method"])
        except MechkitError as err:
            raise OptionError(err.problem, err.fix) from None
        refuse_ignored(cls, parsed, ("top_k", "fv_scales", "spans", "n_contexts", "n_cie", "n_dev"),
                       "chooses how a vector is extracted and placed, and --load-vector evaluates the saved one as "
                       "it is", "drop it, or drop --load-vector to extract a vector with it")

    def run(self, ctx: RunContext) -> Result:
        from mechkit.actvec import ActivationVector, VectorConfig
        from mechkit.actvec.findings import SHORT
        from mechkit.actvec.scan import check_before_work, layer_scan_study
        from mechkit.eval.scoring import fewest_shots
        from mechkit.tasks import parse_tasks

        opts, model = ctx.options, ctx.model
        n_layers = model.anatomy.n_layers
        loaded = ActivationVector.load(opts["load_vector"], model) if opts["load_vector"] else None
        tasks = opts["tasks"] or parse_tasks(loaded.task if loaded else DEFAULT_TASKS)
        layers = opts["layers"].resolve(n_layers)  # the declared ranges, against this model's depth
        config = VectorConfig(**{name: opts[name] for name in ("n", "n_dev", "n_contexts", "n_cie", "shots", "top_k",
                                                               "batch_size")}, fv_scales=list(opts["fv_scales"]),
                              spans=check_spans(opts["spans"], n_layers), seed=ctx.seed)
        methods = [loaded.method] if loaded else (list(SHORT) if opts["method"] == "both" else [opts["method"]])
        check_before_work(tasks, opts["shots"], ctx.seed)
        out: dict = {}
        with ctx.progress() as bar, fewest_shots(self.options):  # a context refusal's fix: no --shots below 2
            job = bar.add_task("icl-vectors", total=len(tasks) * (len(methods) + 1))
            for task in tasks:
                bar.update(job, description=f"{task}: baselines")
                study = layer_scan_study(model, task, layers, config, step=ctx.step, map_units=ctx.map_units)
                out[task] = {"baselines": study.baselines(), "methods": {}}
                bar.advance(job)
                for method in methods:
                    bar.update(job, description=f"{task}: {method}")
                    vec, record = study.run(method, loaded)
                    out[task]["methods"][method] = {**record, "file": f"{task}.{method}.safetensors",
                                                    "bytes": vec.to_bytes()}
                    bar.advance(job)
        return _result(out, tasks, methods, layers, n_layers)


def _result(out: dict, tasks: list[str], methods: list[str], layers: list[int], n_layers: int) -> Result:
    from mechkit.actvec.findings import SHORT, finding
    from mechkit.report import bar_plot, head_heatmap, line_plot

    table: dict[str, dict] = {"zero-shot": {}}
    for method in methods:
        table[f"zero-shot + {SHORT[method]}"] = {}
    table["shuffled ICL"] = {}
    for method in methods:
        table[f"shuffled ICL + {SHORT[method]}"] = {}
    table["ICL"] = {}
    figures, files, summary, vectors = {}, {}, {}, {}
    for task in tasks:
        res = out[task]
        for name, acc in res["baselines"].items():
            table[name][task] = acc
        series = {"zero-shot": [res["baselines"]["zero-shot"]] * len(layers),
                  "ICL": [res["baselines"]["ICL"]] * len(layers)}
        line = [f"zero-shot {res['baselines']['zero-shot']:.2f}"]
        for method, r in res["methods"].items():
            tag = SHORT[method]
            table[f"zero-shot + {tag}"][task] = r["conditions"]["zero-shot"]
            table[f"shuffled ICL + {tag}"][task] = r["conditions"]["shuffled ICL"]
            series[f"{tag} test"] = _nan(r["test"]["accuracy"])
            if r["dev"] is not None:
                dev = r["dev"]
                spans = dev.get("spans", [1] * len(dev["scales"]))
                i = list(zip(dev["scales"], spans, strict=True)).index((r["scale"], r["span"]))
                series[f"{tag} dev"] = _nan(dev["accuracy"][i])
            at = f"L{r['layer']}" + (f"-{r['layer'] + r['span'] - 1}" if r["span"] != 1 else "") + \
                (f"×{r['scale']:g}" if r["scale"] != 1 else "")
            line.append(f"+{tag}@{at} {r['conditions']['zero-shot']:.2f}")
            files[r["file"]] = r.pop("bytes")
            vectors.setdefault(task, {})[method] = r["file"]
            if r["aie"] is not None:
                hi = [(h["layer"], h["head"]) for h in r["heads"]]
                figures[f"aie_{task}"] = head_heatmap(r["aie"], f"{task}: average indirect effect of each head",
                                                      "ΔP(answer)", highlight=hi)
        line.append(f"ICL {res['baselines']['ICL']:.2f}")
        summary[task] = " | ".join(line)
        figures[f"layers_{task}"] = line_plot(layers, series, f"{task}: zero-shot accuracy with the vector at layer L",
                                              "layer", "exact-match accuracy")
    figures["accuracy"] = bar_plot(tasks, {c: [row.get(t) for t in tasks] for c, row in table.items()},
                                   "Accuracy by condition (test prompts)", "accuracy")
    chosen = {m: {t: out[t]["methods"][m]["layer"] for t in tasks} for m in methods}
    scales = {m: {t: out[t]["methods"][m]["scale"] for t in tasks} for m in methods}
    spans = {m: {t: out[t]["methods"][m]["span"] for t in tasks} for m in methods}
    results = {"tasks": tasks, "methods": methods, "layers": layers, "n_layers": n_layers,
               "accuracy_table": table, "chosen_layer": chosen, "chosen_scale": scales, "chosen_span": spans,
               "summary": summary, "vectors": vectors, "per_task": out}
    headline_first = dict(sorted(figures.items(), key=lambda kv: kv[0] != "accuracy"))  # conditions × tasks bars
    return Result(results=results, figures=headline_first, files=files, finding=finding(results))


def accuracy_tables(results: dict) -> list:
    """Conditions × tasks (with the mean), and method × task: where each vector was written."""
    from mechkit.actvec.findings import mean_accuracy, where_written
    from mechkit.report import Table

    tasks, table = results["tasks"], results["accuracy_table"]
    mean = ["mean"] if len(tasks) > 1 else []
    rows = [[name, *(row.get(t) for t in tasks), *([mean_accuracy(row, tasks)] if mean else [])]
            for name, row in table.items()]
    chosen = [[m, *(where_written(results, m, t) for t in tasks)] for m in results["methods"]]
    return [Table("Exact-match accuracy on test prompts", ["condition", *tasks, *mean], rows,
                  note="TV: ICL task vector (replaces the residual at layer L); FV: function vector (added at L); "
                       "shuffled ICL: demonstrations with shuffled labels"),
            Table("Chosen on dev prompts", ["vector", *tasks], chosen,
                  note="L: layer (L-M: written at each layer of the span); ×s: function-vector scale")]


def _nan(values: list) -> list[float]:
    """Plot-ready: layers a span could not start at (``None``) become gaps."""
    return [float("nan") if v is None else v for v in values]
