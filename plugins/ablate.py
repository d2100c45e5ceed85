"""``mechkit ablate``: do the selected heads matter? Ablate them, and the same number of random heads.

Reproduces the comparison of Song, Xu & Zhong (PNAS 2025): removing the top-k induction heads
hurts in-context learning far more than removing k random heads. Each task is evaluated clean,
with the selected heads ablated, and with random heads ablated (several seeds, never one of the
selected heads); ``--sweep 5,10,20`` repeats over k and plots accuracy against k. Each condition is a
unit of ``--executor`` (``ray``: the draws and ks on workers that each load the model once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mechkit.options import DEFAULT_TASKS, EXECUTION, ExistingPath, HeadSpec, NumberList, TaskList, unread
from mechkit.plugin import Option, Plugin, Result, RunContext

if TYPE_CHECKING:
    from mechkit.model.headspec import HeadSelection


class AblatePlugin(Plugin):
    name = "ablate"
    version = "0.1.0"
    needs = frozenset({"generation"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Ablate heads (e.g. the top induction heads) vs random heads and measure ICL accuracy."
    options = (
        Option("heads", str, "induction", "Head spec: induction, previous-token, random, layer:L or 17.3,18.6.", parse=HeadSpec()),
        Option("top_k", int, None, "k for score-ranked and random head specs (default 10, at most half the "
               "model's heads, so the random baseline has heads to draw from).", min=1),
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
        Option("seg_len", int, 25, "Segment length for head detection (at least 2).", min=2),
        Option("batch_size", int, 16, "Prompts per forward pass.", min=1),
        *EXECUTION,  # the conditions (clean, target, each random draw at each k) can run on Ray workers
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        unread.ablate(cls, parsed)  # the head, sweep and baseline options the run would not read

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.conditions import ablation_conditions, ablation_units
        from mechkit.eval.evaluation import reference_tokens, task_prompts
        from mechkit.eval.lengths import check_run_lengths
        from mechkit.heads.scores import load_scores
        from mechkit.model.headspec import baseline_flags, default_top_k
        from mechkit.report import load_report

        opts, model = ctx.options, ctx.model
        n_layers, n_heads = model.anatomy.n_layers, model.anatomy.head_counts  # per layer: pruned layers differ
        selection, tasks = opts["heads"], opts["tasks"]
        top_k = opts["top_k"] or default_top_k(n_layers, n_heads)
        # k is how many heads a ranked spec takes (each checked now, before scores are computed);
        # an explicit spec (17.3,layer:2) ablates what it names
        ks = selection.ks(n_layers, n_heads, opts["sweep"], top_k, ctx.seed)
        baseline = baseline_flags(self.options, opts)  # a fix names every option it leaves unread (else refused)
        if opts["baseline"] == "random":  # where it fails whatever the scores pick: now; else once they are known
            selection.check_baseline(n_layers, n_heads, ks, ctx.seed, **baseline)
        check_run_lengths(model, opts, ctx.seed, seg_len=selection.needs_scores and not opts["from_report"])  # at once
        prompts = task_prompts(tasks, opts["n"], opts["shots"], ctx.seed, opts["setting"])
        scores = load_scores(model, load_report(opts["from_report"]) if opts["from_report"] else None, opts["n_seqs"],
                             opts["seg_len"], ctx.seed, ctx.step, opts["from_report"]) if selection.needs_scores else None
        if opts["baseline"] == "random":
            selection.check_baseline(n_layers, n_heads, ks, ctx.seed, scores=scores, late=True, **baseline)
        reference = None
        if opts["mode"] != "zero":
            reference = reference_tokens(model, task_prompts(tasks, 8, opts["shots"], ctx.seed + 10_000, opts["setting"]))
        draws = opts["baseline_seeds"] if opts["baseline"] == "random" else 0
        plan = ablation_conditions(selection, n_layers, n_heads, ks, scores, ctx.seed, draws)
        keys = [f"{name}|k={k}|seed={seed}|{','.join(map(str, heads))}" for name, heads, seed, k in plan]
        shared = (prompts, opts["batch_size"], opts["mode"], reference, ctx.seed)
        with ctx.progress() as bar:
            job = bar.add_task("ablate (conditions)", total=len(plan))
            metrics = ctx.map_units(ablation_units, shared, [heads for _, heads, _, _ in plan], keys,
                                    on_result=lambda _i, _v: bar.advance(job))
        conditions = [{"name": name, "k": k, "seed": seed, "heads": [h.to_dict() for h in heads], "metrics": got}
                      for (name, heads, seed, k), got in zip(plan, metrics, strict=True)]
        return self._result(conditions, tasks, ks, opts)

    def _result(self, conditions: list[dict], tasks: list[str], ks: list[int], opts: dict) -> Result:
        from mechkit.eval.conditions import accuracy_table
        from mechkit.report import bar_plot, line_plot

        table = accuracy_table(conditions, tasks, ks)
        spec = opts["heads"].spec
        summary = {}
        for k in ks:
            for task in tasks:
                row = table[f"k={k}"][task]
                line = f"clean {row['clean']:.2f} | {spec} {row['target']:.2f}"
                if row["random_mean"] is not None:
                    line += f" | random {row['random_mean']:.2f} ± {row['random_std']:.2f}"
                summary[f"k={k} {task}"] = line
        results = {"conditions": conditions, "accuracy_table": table, "summary": summary, "tasks": tasks,
                   "ks": ks, "heads_spec": spec, "mode": opts["mode"]}
        figures = {}
        for k in ks:
            row = table[f"k={k}"]
            series = {"clean": [row[t]["clean"] for t in tasks], f"{spec} ablated": [row[t]["target"] for t in tasks]}
            errors = None
            if opts["baseline"] == "random":
                series["random ablated"] = [row[t]["random_mean"] for t in tasks]
                errors = {"random ablated": [row[t]["random_std"] for t in tasks]}
            figures[f"accuracy_k{k}"] = bar_plot(tasks, series, f"Exact-match accuracy, k={k} heads ({opts['mode']})",
                                                 "accuracy", errors=errors)
        if len(ks) > 1:  # accuracy vs k, starting from the clean model at k = 0
            series, errors, groups = {}, {}, {}
            for i, t in enumerate(tasks):
                clean = table[f"k={ks[0]}"][t]["clean"]
                series[f"{t}: {spec}"] = [clean] + [table[f"k={k}"][t]["target"] for k in ks]
                groups[f"{t}: {spec}"] = (i, "-")
                if opts["baseline"] == "random":
                    name = f"{t}: random"
                    series[name] = [clean] + [table[f"k={k}"][t]["random_mean"] for k in ks]
                    errors[name] = [0.0] + [table[f"k={k}"][t]["random_std"] for k in ks]
                    groups[name] = (i, "--")
            figures["accuracy_vs_k"] = line_plot([0, *ks], series, "Accuracy vs number of ablated heads", "k",
                                                 "exact-match accuracy", errors=errors or None, groups=groups)
        headline_first = dict(sorted(figures.items(), key=lambda kv: kv[0] != "accuracy_vs_k"))  # the k curve
        return Result(results=results, figures=headline_first, finding=finding(results, opts["heads"]))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Conditions × tasks: accuracy, then answer log-prob (random draws as mean ± std)."""
        from mechkit.report import Table, pm_of

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
                                 *(pm_of([c["metrics"][t][metric] for c in rand]) for t in tasks)])
            note = (f"{results['mode']} ablation, {n} prompts per task"
                    + (f"; random: mean ± std over {len(draws)} draws of k heads, never the selected ones"
                       if draws else ""))
            out.append(Table(f"{title} by condition", ["condition", "heads", *tasks], rows, note=note,
                             digits=digits))
        return out


def _heads_phrase(selection: HeadSelection, heads: list[dict]) -> str:
    """How the finding names the ablated heads: "the top-5 induction heads", "5 random heads", "heads 0.1, 1.2"."""
    from mechkit.report.values import heads_text

    n = len(heads)
    return selection.phrase(n) or f"head{'s' if n != 1 else ''} {heads_text(heads, limit=6)}"


def finding(results: dict, selection: HeadSelection | None = None) -> str:
    """What the ablation did at the largest k, task by task, beside the random-heads baseline
    (``selection``: the run's parsed ``--heads``; read from the results' spec when not given).

    >>> r = {"tasks": ["capitalize"], "ks": [5], "heads_spec": "induction", "mode": "zero",
    ...      "conditions": [{"name": "target", "k": 5, "heads": [{"layer": 1, "head": 2}] * 5}],
    ...      "accuracy_table": {"k=5": {"capitalize": {"clean": 0.4, "target": 0.15, "random_mean": 0.37,
    ...                                                "random_std": 0.06}}}}
    >>> finding(r)
    'Ablating the top-5 induction heads (zero) cuts capitalize from 0.40 to 0.15; 5 random heads instead: 0.37 ± 0.06.'
    """
    from mechkit.model.headspec import parse_spec
    from mechkit.report.values import and_list

    selection = selection or parse_spec(results["heads_spec"])
    tasks, k = results["tasks"], results["ks"][-1]
    row = results["accuracy_table"][f"k={k}"]
    target = next(c for c in results["conditions"] if c["name"] == "target" and c["k"] == k)
    deltas = [row[t]["target"] - row[t]["clean"] for t in tasks]
    verb = "cuts" if all(d < 0 for d in deltas) else "raises" if all(d > 0 for d in deltas) else "changes"
    if all(d == 0 for d in deltas):
        changes = "leaves " + and_list([f"{t} at {row[t]['clean']:.2f}" for t in tasks])
    else:
        changes = f"{verb} " + and_list([f"{t} from {row[t]['clean']:.2f} to {row[t]['target']:.2f}" for t in tasks])
    text = f"Ablating {_heads_phrase(selection, target['heads'])} ({results['mode']}) {changes}"
    if row[tasks[0]]["random_mean"] is not None:
        text += f"; {len(target['heads'])} random heads instead: " + and_list(
            [f"{row[t]['random_mean']:.2f} ± {row[t]['random_std']:.2f}" for t in tasks])
    if len(results["ks"]) > 1:
        text += f" (k={k}, the largest of k = {', '.join(map(str, results['ks']))})"
    return text + "."
