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
s+3 (test queries that also occur in dev are replaced).
"""

from __future__ import annotations

from mechkit.plugin import Option, Plugin, Result, RunContext

DEFAULT_TASKS = "capitalize,past-tense,country-capital"
SHORT = {"task-vector": "TV", "function-vector": "FV"}


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``all``, ``12-24`` or ``10,20,25`` -> sorted layer indices, validated."""
    from mechkit.errors import MechkitError

    fix = f"use all, a range like 12-24 or a list like 10,20 (layers 0..{n_layers - 1})"
    try:
        if text.strip() == "all":
            return list(range(n_layers))
        layers: set[int] = set()
        for item in (x.strip() for x in text.split(",") if x.strip()):
            lo, _, hi = item.partition("-")
            layers.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise MechkitError(f"malformed --layers {text!r}", fix) from None
    if not layers or min(layers) < 0 or max(layers) >= n_layers:
        raise MechkitError(f"--layers {text!r} is out of range", fix)
    return sorted(layers)


def held_out_prompts(task: str, n: int, shots: int, seed: int, avoid: set[str]) -> dict[str, list]:
    """Zero-shot, ICL and shuffled-label prompts asking the same ``n`` queries, none of them in ``avoid``."""
    from mechkit.tasks import build_prompts
    from mechkit.tasks.shuffled import shuffled_label_prompts

    pool = 3 * n + len(avoid)
    sets = {"zero-shot": build_prompts(task, n=pool, shots=0, seed=seed),
            "icl": build_prompts(task, n=pool, shots=shots, seed=seed),
            "shuffled": shuffled_label_prompts(task, n=pool, shots=shots, seed=seed)}
    keep = [i for i, p in enumerate(sets["zero-shot"]) if p.query not in avoid][:n]
    return {name: [ps[i] for i in keep] for name, ps in sets.items()}


def parse_scales(text: str) -> list[float]:
    from mechkit.errors import MechkitError

    try:
        scales = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        scales = []
    if not scales or min(scales) <= 0:
        raise MechkitError(f"malformed --fv-scales {text!r}", "use positive numbers like 1,2,4")
    return scales


def parse_spans(text: str, n_layers: int) -> list[int]:
    """``1,2`` -> numbers of consecutive layers to try, each at least 1 and at most ``n_layers``."""
    from mechkit.errors import MechkitError

    try:
        spans = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        spans = []
    if not spans or spans[0] < 1 or spans[-1] > n_layers:
        raise MechkitError(f"malformed --spans {text!r}", f"use whole numbers from 1 to {n_layers}, like 1,2")
    return spans


def choose(dev: dict, layers: list[int]) -> tuple[int, float, int]:
    """The dev sweep's best (layer, scale, span): highest accuracy, then log-prob, then earliest layer,
    smallest scale, shortest span. Layers whose span would run past the model (``None``) are skipped."""
    spans = dev.get("spans", [1] * len(dev["scales"]))
    best = max(((a, lp, -L, -x, -k), L, x, k)
               for x, k, accs, lps in zip(dev["scales"], spans, dev["accuracy"], dev["logprob"], strict=True)
               for L, a, lp in zip(layers, accs, lps, strict=True) if a is not None)
    return best[1], best[2], best[3]


def check_before_work(tasks: list[str], methods: list[str], loaded, p: dict, seed: int, n_heads: int) -> None:
    """Refuse, before anything is computed, options that would fail (or silently mislead) later:
    a ``--top-k`` below 1 (above the head count it means all heads), and tasks whose prompts have too few demonstrations to shuffle."""
    from mechkit.errors import MechkitError
    from mechkit.tasks.shuffled import shuffled_label_prompts

    if loaded is None and "function-vector" in methods and p["top_k"] < 1:  # more than n_heads: all heads
        raise MechkitError(f"--top-k {p['top_k']} is below 1", f"use a number of heads from 1 to {n_heads}")
    for task in tasks:
        shuffled_label_prompts(task, n=1, shots=p["shots"], seed=seed)


class IclVectorsPlugin(Plugin):
    name = "icl-vectors"
    version = "0.1.0"
    summary = "ICL task vectors and function vectors: extract, pick a layer on dev, evaluate zero-shot + vector."
    options = (
        Option("tasks", str, None, f"Comma-separated task ids (default {DEFAULT_TASKS}, or the loaded vector's)."),
        Option("method", str, "both", "Which vectors.", choices=("task-vector", "function-vector", "both")),
        Option("n", int, 40, "Test prompts per task."),
        Option("n_dev", int, 20, "Dev prompts per task (choose the layer)."),
        Option("n_contexts", int, 24, "ICL contexts averaged for the task vector and the mean head outputs."),
        Option("n_cie", int, 10, "Shuffled-label prompts for the heads' indirect effects."),
        Option("shots", int, 10, "Demonstrations per ICL prompt."),
        Option("top_k", int, 10, "Heads summed into the function vector (capped at the model's head count)."),
        Option("fv_scales", str, "1,2,4,8", "Function-vector scales to try; layer and scale are chosen on dev."),
        Option("layers", str, "all", "Layers to sweep: all, 12-24 or 10,20."),
        Option("spans", str, "1", "Numbers of consecutive layers L..L+K-1 to write the vector at (e.g. 1,2; "
                                  "a function vector adds scale/K at each); chosen on dev with the layer."),
        Option("load_vector", str, None, "Evaluate this saved vector (.safetensors) instead of extracting."),
        Option("batch_size", int, 16, "Rows per forward pass."),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.actvec.vector import ActivationVector
        from mechkit.tasks import parse_tasks

        p, m = ctx.params, ctx.model
        loaded = ActivationVector.load(p["load_vector"], m) if p["load_vector"] else None
        tasks = parse_tasks(p["tasks"] or (loaded.task if loaded else DEFAULT_TASKS))
        layers = parse_layers(p["layers"], m.anatomy.n_layers)
        parse_scales(p["fv_scales"])
        parse_spans(p["spans"], m.anatomy.n_layers)
        methods = [loaded.method] if loaded else (list(SHORT) if p["method"] == "both" else [p["method"]])
        check_before_work(tasks, methods, loaded, p, ctx.seed, m.anatomy.n_layers * m.anatomy.n_heads)
        out: dict = {}
        with ctx.progress() as bar:
            job = bar.add_task("icl-vectors", total=len(tasks) * (len(methods) + 1))
            for task in tasks:
                bar.update(job, description=f"{task}: baselines")
                out[task] = _Task(ctx, task, layers).run(methods, loaded, bar, job)
        return _result(out, tasks, methods, layers, m.anatomy.n_layers)


class _Task:
    """One task's prompt sets and resumable steps."""

    def __init__(self, ctx: RunContext, task: str, layers: list[int]) -> None:
        from mechkit.tasks import build_prompts

        self.ctx, self.task, self.layers, self.p, self.m = ctx, task, layers, ctx.params, ctx.model
        s = ctx.seed
        self.dev = build_prompts(task, n=self.p["n_dev"], shots=0, seed=s + 2)
        self.test = held_out_prompts(task, self.p["n"], self.p["shots"], s + 3, {q.query for q in self.dev})

    def step(self, name: str, compute):
        return self.ctx.step(f"{self.task}|{name}", compute)

    def run(self, methods: list[str], loaded, bar, job) -> dict:
        from mechkit.actvec.edits import score_edited

        bs = self.p["batch_size"]
        base = self.step("baselines", lambda: {
            name: score_edited(self.m, self.test[key], [None], bs)[0].accuracy
            for name, key in (("zero-shot", "zero-shot"), ("shuffled ICL", "shuffled"), ("ICL", "icl"))})
        bar.advance(job)
        res = {"baselines": base, "methods": {}}
        for method in methods:
            bar.update(job, description=f"{self.task}: {method}")
            res["methods"][method] = self.method(method, loaded)
            bar.advance(job)
        return res

    def method(self, method: str, loaded) -> dict:
        vec = loaded or self.extract(method)
        dev = None
        if loaded is None:
            scales = parse_scales(self.p["fv_scales"]) if method == "function-vector" else [1.0]
            spans = parse_spans(self.p["spans"], self.m.anatomy.n_layers)
            configs = [(x, k) for x in scales for k in spans]
            key = f"{method}|dev|{scales}" + (f"|spans={spans}" if spans != [1] else "")
            dev = self.step(key, lambda: self.sweep(vec, self.dev, configs))
            vec.layer, vec.scale, vec.span = choose(dev, self.layers)
        at = f"x{vec.scale}" + (f"|span={vec.span}" if vec.span != 1 else "")
        test = self.step(f"{method}|test|{at}", lambda: self.sweep(vec, self.test["zero-shot"], [(vec.scale, vec.span)]))
        cond = self.step(f"{method}|conditions|L={vec.layer}|{at}", lambda: self.conditions(vec))
        test = {k: test[k][0] for k in ("accuracy", "logprob")}
        return {"layer": vec.layer, "scale": vec.scale, "span": vec.span, "dev": dev, "test": test, "conditions": cond,
                "heads": vec.heads, "aie": vec.info.get("aie"), "file": f"{self.task}.{method}.safetensors",
                "bytes": vec.to_bytes()}

    def extract(self, method: str):
        import torch

        from mechkit.actvec.vector import ActivationVector

        stored = self.step(f"{method}|extract", lambda: self._extract(method))
        return ActivationVector(vector=torch.tensor(stored["vector"]), method=method, task=self.task, layer=-1,
                                mode="replace" if method == "task-vector" else "add",
                                model_sha256=self.m.weights_sha256(), heads=stored["heads"],
                                info={k: v for k, v in stored.items() if k not in ("vector", "heads")})

    def _extract(self, method: str) -> dict:
        from mechkit.actvec.function_vectors import function_vector, indirect_effects, mean_head_outputs
        from mechkit.actvec.task_vectors import icl_task_vectors
        from mechkit.model.heads import top_heads
        from mechkit.tasks import build_prompts
        from mechkit.tasks.shuffled import shuffled_label_prompts

        p, s = self.p, self.ctx.seed
        contexts = build_prompts(self.task, n=p["n_contexts"], shots=p["shots"], seed=s)
        common = {"n_contexts": p["n_contexts"], "shots": p["shots"], "seed": s}
        if method == "task-vector":
            return {"vector": icl_task_vectors(self.m, self.task, prompts=contexts).tolist(), "heads": [], **common}
        means = mean_head_outputs(self.m, contexts)
        corrupted = shuffled_label_prompts(self.task, n=p["n_cie"], shots=p["shots"], seed=s + 1)
        aie = indirect_effects(self.m, corrupted, means).mean(0)
        heads = top_heads(aie, p["top_k"])
        fv = function_vector(self.m, means, heads)
        return {"vector": fv.tolist(), "heads": [h.to_dict() for h in heads], "aie": aie.tolist(), "n_cie": p["n_cie"],
                "top_k": p["top_k"], **common}

    def sweep(self, vec, prompts, configs: list[tuple[float, int]]) -> dict:
        """Accuracy and log-prob per (scale, span) and layer, all (config, layer, prompt) rows batched
        together; ``None`` where the span would run past the last layer."""
        from mechkit.actvec.edits import score_edited

        n_layers = self.m.anatomy.n_layers
        cells = [(i, j) for i, (_, k) in enumerate(configs) for j, L in enumerate(self.layers) if L + k <= n_layers]
        edits = [vec.edits(self.layers[j], *configs[i]) for i, j in cells]
        scores = score_edited(self.m, prompts, edits, self.p["batch_size"])
        acc = [[None] * len(self.layers) for _ in configs]
        lps = [[None] * len(self.layers) for _ in configs]
        for (i, j), s in zip(cells, scores, strict=True):
            acc[i][j], lps[i][j] = s.accuracy, s.logprob
        return {"scales": [x for x, _ in configs], "spans": [k for _, k in configs], "accuracy": acc, "logprob": lps}

    def conditions(self, vec) -> dict:
        from mechkit.actvec.edits import score_edited

        bs = self.p["batch_size"]
        return {"zero-shot": score_edited(self.m, self.test["zero-shot"], [vec.edits()], bs)[0].accuracy,
                "shuffled ICL": score_edited(self.m, self.test["shuffled"], [vec.edits()], bs)[0].accuracy}


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
    return Result(results=results, figures=figures, files=files)


def _nan(values: list) -> list[float]:
    """Plot-ready: layers a span could not start at (``None``) become gaps."""
    return [float("nan") if v is None else v for v in values]
