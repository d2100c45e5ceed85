"""``mechkit ablate``: do the selected heads matter? Ablate them, and the same number of random heads.

Reproduces the comparison of Song, Xu & Zhong (PNAS 2025): removing the top-k induction heads
hurts in-context learning far more than removing k random heads. Each task is evaluated clean,
with the selected heads ablated, and with random heads ablated (several seeds, never one of the
selected heads); ``--sweep 5,10,20`` repeats over k and plots accuracy against k. Each condition is a
unit of ``--executor`` (``ray``: the draws and ks on workers that each load the model once).
"""

from __future__ import annotations

from mechkit.options import EXECUTION, ExistingPath, HeadSpec, NumberList, TaskList
from mechkit.plugin import Option, Plugin, Result, RunContext

DEFAULT_TASKS = "capitalize,past-tense,country-capital"


class AblatePlugin(Plugin):
    name = "ablate"
    version = "0.1.0"
    needs = frozenset({"generation"})
    summary = "Ablate heads (e.g. the top induction heads) vs random heads and measure ICL accuracy."
    options = (
        Option("heads", str, "induction", "Head spec: induction, previous-token, random, layer:L or 17.3,18.6.", parse=HeadSpec()),
        Option("top_k", int, 10, "k for score-ranked and random head specs.", min=1),
        Option("mode", str, "zero", "Ablation: zero, mean or resample.", choices=("zero", "mean", "resample")),
        Option("tasks", str, DEFAULT_TASKS, "Comma-separated task ids (see `mechkit tasks`).", parse=TaskList()),
        Option("n", int, 30, "Prompts per task.", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("setting", str, None, "For composite tasks (a+b): simple, composite or composite-in-context.",
               choices=("simple", "composite", "composite-in-context")),
        Option("baseline", str, "random", "Baseline condition.", choices=("random", "none")),
        Option("baseline_seeds", int, 5, "Random-head draws for the baseline.", min=0),
        Option("sweep", str, None, "Comma-separated k values, e.g. 5,10,20 (score-ranked or random specs).",
               parse=NumberList(int, min=1, sort=True, allow_empty=True, example="5,10,20")),
        Option("from_report", str, None, "Read head scores from this detect report.", cli_name="from",
               parse=ExistingPath("detect report (a run directory or its report.json)")),
        Option("n_seqs", int, 50, "Random sequences for head detection (when scores are computed).", min=1),
        Option("seg_len", int, 25, "Segment length for head detection.", min=1),
        Option("batch_size", int, 16, "Prompts per forward pass.", min=1),
        *EXECUTION,  # the conditions (clean, target, each random draw at each k) can run on Ray workers
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.evaluation import reference_tokens, task_prompts
        from mechkit.heads.scores import load_scores
        from mechkit.model.headspec import SCORE_KINDS, needs_scores, parse_heads, random_heads
        from mechkit.report import load_report

        p, m = ctx.params, ctx.model
        a = m.anatomy
        tasks = ctx.parsed["tasks"]
        ranked_spec = any(item.strip() in (*SCORE_KINDS, "random") for item in p["heads"].split(","))
        placeholder = {kind: [[0.0] * a.n_heads for _ in range(a.n_layers)] for kind in SCORE_KINDS}
        # k is how many heads a ranked spec takes; an explicit spec (17.3,layer:2) ablates what it names
        ks = (list(ctx.parsed["sweep"] or ()) or [p["top_k"]]) if ranked_spec else \
            [len(parse_heads(p["heads"], a.n_layers, a.n_heads, scores=placeholder, seed=ctx.seed))]
        for k in ks:  # the spec's syntax and ranges, before head scores are computed
            parse_heads(p["heads"], a.n_layers, a.n_heads, scores=placeholder, top_k=k, seed=ctx.seed)
        prompts = task_prompts(tasks, p["n"], p["shots"], ctx.seed, p["setting"])
        by_score = needs_scores(p["heads"])
        scores = load_scores(m, load_report(p["from_report"]) if p["from_report"] else None, p["n_seqs"], p["seg_len"],
                             ctx.seed, ctx.step, p["from_report"]) if by_score else None
        for k in ks:  # validate every spec before any long work
            parse_heads(p["heads"], a.n_layers, a.n_heads, scores=scores, top_k=k, seed=ctx.seed)
        reference = None
        if p["mode"] != "zero":
            reference = reference_tokens(m, task_prompts(tasks, 8, p["shots"], ctx.seed + 10_000, p["setting"]))

        plan = [("clean", [], None, None)]
        for k in ks:
            target = parse_heads(p["heads"], a.n_layers, a.n_heads, scores=scores, top_k=k, seed=ctx.seed)
            plan.append(("target", target, None, k))
            if p["baseline"] == "random":
                for s in range(p["baseline_seeds"]):
                    seed = ctx.seed * 1000 + s
                    plan.append(("random", random_heads(a.n_layers, a.n_heads, len(target), seed, exclude=target),
                                 seed, k))
        keys = [f"{name}|k={k}|seed={seed}|{','.join(map(str, heads))}" for name, heads, seed, k in plan]
        shared = (prompts, p["batch_size"], p["mode"], reference, ctx.seed)
        with ctx.progress() as bar:
            job = bar.add_task("ablate (conditions)", total=len(plan))
            metrics = ctx.map_units(condition_units, shared, [heads for _, heads, _, _ in plan], keys,
                                    on_result=lambda _i, _v: bar.advance(job))
        conditions = [{"name": name, "k": k, "seed": seed, "heads": [h.to_dict() for h in heads], "metrics": got}
                      for (name, heads, seed, k), got in zip(plan, metrics, strict=True)]
        return self._result(conditions, tasks, ks, p)

    def _result(self, conditions: list[dict], tasks: list[str], ks: list[int], p: dict) -> Result:
        from mechkit.eval.evaluation import mean_std
        from mechkit.report import bar_plot, line_plot

        table = {}
        for k in ks:
            row = {}
            for task in tasks:
                clean = conditions[0]["metrics"][task]["accuracy"]
                target = [c["metrics"][task]["accuracy"] for c in conditions if c["name"] == "target" and c["k"] == k]
                rand = [c["metrics"][task]["accuracy"] for c in conditions if c["name"] == "random" and c["k"] == k]
                rm, rs = mean_std(rand) if rand else (None, None)
                row[task] = {"clean": clean, "target": target[0], "random_mean": rm, "random_std": rs}
            table[f"k={k}"] = row
        summary = {}
        for k in ks:
            for task in tasks:
                row = table[f"k={k}"][task]
                line = f"clean {row['clean']:.2f} | {p['heads']} {row['target']:.2f}"
                if row["random_mean"] is not None:
                    line += f" | random {row['random_mean']:.2f} ± {row['random_std']:.2f}"
                summary[f"k={k} {task}"] = line
        results = {"conditions": conditions, "accuracy_table": table, "summary": summary, "tasks": tasks,
                   "ks": ks, "heads_spec": p["heads"], "mode": p["mode"]}
        figures = {}
        for k in ks:
            row = table[f"k={k}"]
            series = {"clean": [row[t]["clean"] for t in tasks], f"{p['heads']} ablated": [row[t]["target"] for t in tasks]}
            errors = None
            if p["baseline"] == "random":
                series["random ablated"] = [row[t]["random_mean"] for t in tasks]
                errors = {"random ablated": [row[t]["random_std"] for t in tasks]}
            figures[f"accuracy_k{k}"] = bar_plot(tasks, series, f"Exact-match accuracy, k={k} heads ({p['mode']})",
                                                 "accuracy", errors=errors)
        if len(ks) > 1:  # accuracy vs k, starting from the clean model at k = 0
            series, errors, groups = {}, {}, {}
            for i, t in enumerate(tasks):
                clean = table[f"k={ks[0]}"][t]["clean"]
                series[f"{t}: {p['heads']}"] = [clean] + [table[f"k={k}"][t]["target"] for k in ks]
                groups[f"{t}: {p['heads']}"] = (i, "-")
                if p["baseline"] == "random":
                    name = f"{t}: random"
                    series[name] = [clean] + [table[f"k={k}"][t]["random_mean"] for k in ks]
                    errors[name] = [0.0] + [table[f"k={k}"][t]["random_std"] for k in ks]
                    groups[name] = (i, "--")
            figures["accuracy_vs_k"] = line_plot([0, *ks], series, "Accuracy vs number of ablated heads", "k",
                                                 "exact-match accuracy", errors=errors or None, groups=groups)
        headline_first = dict(sorted(figures.items(), key=lambda kv: kv[0] != "accuracy_vs_k"))  # the k curve
        return Result(results=results, figures=headline_first, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Conditions × tasks: accuracy, then answer log-prob (random draws as mean ± std)."""
        from mechkit.report import Table

        tasks, spec, conditions = results["tasks"], results["heads_spec"], results["conditions"]
        n = conditions[0]["metrics"][tasks[0]].get("n")
        draws = {c["seed"] for c in conditions if c["name"] == "random"}
        out = []
        for metric, title, digits in (("accuracy", "Exact-match accuracy", 2), ("logprob", "Mean answer log-prob", 3)):
            rows = [["clean", [], *(conditions[0]["metrics"][t][metric] for t in tasks)]]
            for k in results["ks"]:
                target = next(c for c in conditions if c["name"] == "target" and c["k"] == k)
                rows.append([f"{spec}, k={k}", target["heads"], *(target["metrics"][t][metric] for t in tasks)])
                rand = [c for c in conditions if c["name"] == "random" and c["k"] == k]
                if rand:
                    rows.append([f"random, k={k}", f"{len(rand)} draws",
                                 *(_pm([c["metrics"][t][metric] for c in rand]) for t in tasks)])
            note = (f"{results['mode']} ablation, {n} prompts per task"
                    + (f"; random: mean ± std over {len(draws)} draws of k heads, never the selected ones"
                       if draws else ""))
            out.append(Table(f"{title} by condition", ["condition", "heads", *tasks], rows, note=note,
                             digits=digits))
        return out


def condition_units(handle, shared: tuple, units: list):
    """Each unit a list of heads to ablate (empty: the clean model) -> ``evaluate``'s metrics per task.

    ``shared`` is ``(prompts, batch_size, mode, reference, seed)``; the ablation is undone before the
    next unit, so a unit's metrics never depend on the units run before it (any worker, any chunk)."""
    from mechkit.eval.evaluation import evaluate
    from mechkit.interventions import ablate

    prompts, batch_size, mode, reference, seed = shared
    for heads in units:
        if not heads:
            yield evaluate(handle, prompts, batch_size)
            continue
        with ablate(handle, heads, mode=mode, reference=reference, seed=seed):
            metrics = evaluate(handle, prompts, batch_size)
        yield metrics


def _pm(values: list[float]):
    import statistics

    from mechkit.report import pm

    return pm(statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0)


def _heads_phrase(spec: str, heads: list[dict]) -> str:
    """How the finding names the ablated heads: "the top-5 induction heads", "5 random heads", "heads 0.1, 1.2"."""
    from mechkit.report.values import heads_text

    n, items = len(heads), [i.strip() for i in spec.split(",")]
    if len(items) == 1 and items[0] in ("induction", "previous-token"):
        return f"the top-{n} {items[0]} heads"
    if items == ["random"]:
        return f"{n} random heads"
    if len(items) == 1 and items[0].startswith("layer:"):
        return f"the {n} heads of layer {items[0].removeprefix('layer:')}"
    return f"head{'s' if n != 1 else ''} {heads_text(heads, limit=6)}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def finding(results: dict) -> str:
    """What the ablation did at the largest k, task by task, beside the random-heads baseline.

    >>> r = {"tasks": ["capitalize"], "ks": [5], "heads_spec": "induction", "mode": "zero",
    ...      "conditions": [{"name": "target", "k": 5, "heads": [{"layer": 1, "head": 2}] * 5}],
    ...      "accuracy_table": {"k=5": {"capitalize": {"clean": 0.4, "target": 0.15, "random_mean": 0.37,
    ...                                                "random_std": 0.06}}}}
    >>> finding(r)
    'Ablating the top-5 induction heads (zero) cuts capitalize from 0.40 to 0.15; 5 random heads instead: 0.37 ± 0.06.'
    """
    tasks, k = results["tasks"], results["ks"][-1]
    row = results["accuracy_table"][f"k={k}"]
    target = next(c for c in results["conditions"] if c["name"] == "target" and c["k"] == k)
    deltas = [row[t]["target"] - row[t]["clean"] for t in tasks]
    verb = "cuts" if all(d < 0 for d in deltas) else "raises" if all(d > 0 for d in deltas) else "changes"
    if all(d == 0 for d in deltas):
        changes = "leaves " + _join([f"{t} at {row[t]['clean']:.2f}" for t in tasks])
    else:
        changes = f"{verb} " + _join([f"{t} from {row[t]['clean']:.2f} to {row[t]['target']:.2f}" for t in tasks])
    text = f"Ablating {_heads_phrase(results['heads_spec'], target['heads'])} ({results['mode']}) {changes}"
    if row[tasks[0]]["random_mean"] is not None:
        text += f"; {len(target['heads'])} random heads instead: " + _join(
            [f"{row[t]['random_mean']:.2f} ± {row[t]['random_std']:.2f}" for t in tasks])
    if len(results["ks"]) > 1:
        text += f" (k={k}, the largest of k = {', '.join(map(str, results['ks']))})"
    return text + "."
