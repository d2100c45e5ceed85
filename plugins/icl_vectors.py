"""``mechkit icl-vectors``: can one activation vector stand in for the demonstrations?

Two kinds of vector, both written at the last token of a zero-shot prompt ``input: Q\\noutput:``:
the ICL task vector (Hendel et al. 2023: the residual stream after block L of demonstrations + a
dummy query, averaged, *replaces* the zero-shot one) and the function vector (Todd et al. 2024: the
summed mean outputs of the heads with the largest causal indirect effect on shuffled-label prompts,
*added* at layer L). Layer L is chosen on dev prompts; the report gives the per-layer curve and the
conditions zero-shot, zero-shot + vector, shuffled-label ICL ± vector and real ICL on held-out test
prompts, and saves each vector (``--load-vector FILE`` evaluates a saved one instead).
``--spans 1,2`` also tries writing the vector at K consecutive layers L..L+K-1 (task vector: θ_l
replaced at each; function vector: scale × FV / K added at each), K chosen on dev with the layer.

Prompt sets, all seeded from ``--seed s``: extraction contexts s, CIE prompts s+1, dev s+2, test
s+3 (test queries that also occur in dev are replaced). The study itself is
:class:`mechkit.actvec.VectorStudy`'s; this plugin checks the options, runs it per task and method,
and shapes the accuracy table, the figures, the summary lines and the saved vector files. The dev and
test layer scans go one layer per unit through ``--executor`` (``ray``: workers that each load the
model once), with the same report.
"""

from __future__ import annotations

from mechkit.options import EXECUTION, ExistingPath, IntRanges, NumberList, OptionError, TaskList
from mechkit.plugin import Option, Plugin, Result, RunContext

DEFAULT_TASKS = "capitalize,past-tense,country-capital"
SHORT = {"task-vector": "TV", "function-vector": "FV"}


def check_before_work(tasks: list[str], shots: int, seed: int) -> None:
    """Refuse, before anything is computed, tasks whose prompts have too few demonstrations to shuffle
    (e.g. ioi, which has no input:/output: demonstrations)."""
    from mechkit.tasks.shuffled import shuffled_label_prompts

    for task in tasks:
        shuffled_label_prompts(task, n=1, shots=shots, seed=seed)


def check_spans(spans: tuple[int, ...], text: str, n_layers: int) -> list[int]:
    """The declared ``--spans`` (sorted, each at least 1), refusing one longer than the model is deep."""
    if spans[-1] > n_layers:
        raise OptionError(f"--spans {text!r} is out of range: the model has {n_layers} layers",
                          f"use whole numbers from 1 to {n_layers}, like 1,2")
    return list(spans)


class IclVectorsPlugin(Plugin):
    name = "icl-vectors"
    version = "0.1.0"
    needs = frozenset({"generation"})
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

    def run(self, ctx: RunContext) -> Result:
        from mechkit.actvec import ActivationVector
        from mechkit.tasks import parse_tasks

        p, m = ctx.params, ctx.model
        n_layers = m.anatomy.n_layers
        loaded = ActivationVector.load(p["load_vector"], m) if p["load_vector"] else None
        tasks = ctx.parsed["tasks"] or parse_tasks(loaded.task if loaded else DEFAULT_TASKS)
        layers = ctx.parsed["layers"].resolve(n_layers)  # the declared ranges, against this model's depth
        scales = list(ctx.parsed["fv_scales"])
        spans = check_spans(ctx.parsed["spans"], p["spans"], n_layers)
        methods = [loaded.method] if loaded else (list(SHORT) if p["method"] == "both" else [p["method"]])
        check_before_work(tasks, p["shots"], ctx.seed)
        out: dict = {}
        with ctx.progress() as bar:
            job = bar.add_task("icl-vectors", total=len(tasks) * (len(methods) + 1))
            for task in tasks:
                bar.update(job, description=f"{task}: baselines")
                study = layer_scan_study(m, task, layers, n=p["n"], n_dev=p["n_dev"], n_contexts=p["n_contexts"],
                                         n_cie=p["n_cie"], shots=p["shots"], top_k=p["top_k"], fv_scales=scales,
                                         spans=spans, batch_size=p["batch_size"], seed=ctx.seed, step=ctx.step,
                                         map_units=ctx.map_units)
                out[task] = {"baselines": study.baselines(), "methods": {}}
                bar.advance(job)
                for method in methods:
                    bar.update(job, description=f"{task}: {method}")
                    vec, record = study.run(method, loaded)
                    out[task]["methods"][method] = {**record, "file": f"{task}.{method}.safetensors",
                                                    "bytes": vec.to_bytes()}
                    bar.advance(job)
        return _result(out, tasks, methods, layers, m.anatomy.n_layers)


def layer_scan_study(*args, map_units, **kwargs):
    """A :class:`~mechkit.actvec.VectorStudy` whose dev and test layer scans run one unit per layer
    through ``map_units`` (``ctx.map_units``), each layer kept as its own step."""
    from mechkit.actvec.select import choose
    from mechkit.actvec.study import VectorStudy, conditions

    class LayerScanStudy(VectorStudy):
        def scan(self, vec, prompts: list, configs: list[tuple[float, int]], key: str) -> dict:
            """:func:`mechkit.actvec.study.sweep`'s result, assembled from one unit per layer."""
            rows = map_units(scan_units, (vec, prompts, configs, self.batch_size), self.layers,
                             [f"{self.task}|{key}|L{layer}" for layer in self.layers])
            return {"scales": [x for x, _ in configs], "spans": [k for _, k in configs],
                    **{m: [[row[m][i] for row in rows] for i in range(len(configs))] for m in ("accuracy", "logprob")}}

        def choose(self, method, vec) -> dict:
            scales = self.fv_scales if method == "function-vector" else [1.0]
            key = f"{method}|dev|{scales}" + (f"|spans={self.spans}" if self.spans != [1] else "")
            dev = self.scan(vec, self.dev, [(x, k) for x in scales for k in self.spans], key)
            vec.layer, vec.scale, vec.span = choose(dev, self.layers)
            return dev

        def run(self, method, vector=None):
            vec = vector or self.extract(method)
            dev = None if vector is not None else self.choose(method, vec)
            at = f"x{vec.scale}" + (f"|span={vec.span}" if vec.span != 1 else "")
            test = self.scan(vec, self.test["zero-shot"], [(vec.scale, vec.span)], f"{method}|test|{at}")
            cond = self.step(f"{method}|conditions|L={vec.layer}|{at}",
                             lambda: conditions(self.handle, vec, self.test, self.batch_size))
            test = {k: test[k][0] for k in ("accuracy", "logprob")}
            return vec, {"layer": vec.layer, "scale": vec.scale, "span": vec.span, "dev": dev, "test": test,
                         "conditions": cond, "heads": vec.heads, "aie": vec.info.get("aie")}

    return LayerScanStudy(*args, **kwargs)


def scan_units(handle, shared: tuple, units: list):
    """Each unit a layer -> the vector's accuracy and log-prob there, one per (scale, span) config
    (``None`` where the span runs past the last layer). ``shared``: ``(vector, prompts, configs, batch_size)``."""
    from mechkit.actvec.study import sweep

    vec, prompts, configs, batch_size = shared
    for layer in units:
        row = sweep(handle, vec, prompts, [layer], configs, batch_size)
        yield {m: [cells[0] for cells in row[m]] for m in ("accuracy", "logprob")}


def _result(out: dict, tasks: list[str], methods: list[str], layers: list[int], n_layers: int) -> Result:
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


def _mean_acc(row: dict, tasks: list[str]) -> float | None:
    values = [row.get(t) for t in tasks]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _where(results: dict, method: str, task: str) -> str:
    """Where the vector was written: ``L12``, ``L12-13`` for a span, ``×4`` for a function-vector scale."""
    layer, span = results["chosen_layer"][method][task], results["chosen_span"][method][task]
    scale = results["chosen_scale"][method][task]
    return f"L{layer}" + (f"-{layer + span - 1}" if span != 1 else "") + (f" ×{scale:g}" if scale != 1 else "")


def finding(results: dict) -> str:
    """Zero-shot and ICL accuracy beside zero-shot + each vector (averaged over the tasks when several)."""
    tasks, table = results["tasks"], results["accuracy_table"]

    def acc(condition: str) -> str:
        v = _mean_acc(table[condition], tasks)
        return "—" if v is None else f"{v:.2f}"

    names = {"task-vector": "the task vector", "function-vector": "the function vector"}
    if len(tasks) == 1:
        where = {m: f" at {_where(results, m, tasks[0])}" for m in results["methods"]}
        head = f"On {tasks[0]}, zero-shot accuracy is {acc('zero-shot')} and ICL {acc('ICL')}"
    else:
        where = {m: "" for m in results["methods"]}
        head = (f"Averaged over {len(tasks)} tasks, zero-shot accuracy is {acc('zero-shot')} and ICL "
                f"{acc('ICL')}")
    vectors = [f"{names[m]}{where[m]} gives {acc(f'zero-shot + {SHORT[m]}')}" for m in results["methods"]]
    return f"{head}; added to zero-shot prompts, " + " and ".join(vectors) + " (layer chosen on dev prompts)."


def accuracy_tables(results: dict) -> list:
    """Conditions × tasks (with the mean), and method × task: where each vector was written."""
    from mechkit.report import Table

    tasks, table = results["tasks"], results["accuracy_table"]
    mean = ["mean"] if len(tasks) > 1 else []
    rows = [[name, *(row.get(t) for t in tasks), *([_mean_acc(row, tasks)] if mean else [])]
            for name, row in table.items()]
    chosen = [[m, *(_where(results, m, t) for t in tasks)] for m in results["methods"]]
    return [Table("Exact-match accuracy on test prompts", ["condition", *tasks, *mean], rows,
                  note="TV: ICL task vector (replaces the residual at layer L); FV: function vector (added at L); "
                       "shuffled ICL: demonstrations with shuffled labels"),
            Table("Chosen on dev prompts", ["vector", *tasks], chosen,
                  note="L: layer (L-M: written at each layer of the span); ×s: function-vector scale")]


def _nan(values: list) -> list[float]:
    """Plot-ready: layers a span could not start at (``None``) become gaps."""
    return [float("nan") if v is None else v for v in values]
