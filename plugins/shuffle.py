"""``mechkit shuffle``: permute heads' QK (or whole QKOV) weights among the selected heads.

Song, Xu & Zhong permute weights among induction heads ("inside") and compare with giving the
same heads the weights of random other heads ("outside"): if induction heads share a common
"bridge" subspace, inside shuffles hurt copying much less than outside replacements. This plugin
measures the loss per position on held-out repeated random tokens (the copying signature) and
the accuracy on ICL tasks under four conditions: ``clean``; ``target`` — the selected heads
permuted among themselves; ``outside`` — each selected head given a random other head's weights;
``random`` — the same number of random heads permuted among themselves.
"""

from __future__ import annotations

from mechkit.options import DEFAULT_TASKS, ExistingPath, HeadSpec, OptionError, TaskList, unread
from mechkit.plugin import Option, Plugin, Result, RunContext

NAMES = ("clean", "target", "outside", "random")
LABELS = {"clean": "clean", "target": "selected heads permuted", "outside": "selected heads ← random heads",
          "random": "random heads permuted"}


class ShufflePlugin(Plugin):
    name = "shuffle"
    version = "0.1.0"
    needs = frozenset({"weight_writes", "weight_reads", "generation"})  # it permutes the heads' weights
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Permute QK or QKOV weights among selected heads (e.g. induction) vs among random heads."
    options = (
        Option("heads", str, "induction", "Head spec (see `mechkit ablate --help`).", parse=HeadSpec()),
        Option("top_k", int, None, "k for score-ranked and random head specs (default 10, at most half the "
               "model's heads, so the random baseline has heads to draw from).", min=1),
        Option("component", str, "qk", "What moves: qk (attention pattern) or qkov (whole head).",
               choices=("qk", "qkov")),
        Option("gqa", str, "query", "Under grouped-query attention: move query rows only, or also the KV group.",
               choices=("query", "group")),
        Option("seeds", int, 3, "Permutations of the selected heads (and random-head draws).", min=1),
        Option("tasks", str, DEFAULT_TASKS, "Tasks to score ('' for none).",
               parse=TaskList(allow_empty=True)),
        Option("n", int, 20, "Prompts per task.", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("setting", str, None, "For composite tasks (a+b): simple, composite or composite-in-context.",
               choices=("simple", "composite", "composite-in-context")),
        Option("n_seqs", int, 50, "Repeated random sequences for detection and for the loss.", min=1),
        Option("seg_len", int, 25, "Length of the repeated segment (at least 2).", min=2),
        Option("from_report", str, None, "Read head scores from this detect report.", cli_name="from",
               parse=ExistingPath("detect report (a run directory or its report.json)")),
        Option("batch_size", int, 16, "Sequences per forward pass.", min=1),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        unread.shuffle(cls, parsed)  # the head and prompt options the run would not read
        from mechkit.eval.conditions import shuffle_spec_problem

        problem = shuffle_spec_problem(parsed["heads"], parsed["top_k"])  # one head whatever the model: said now
        if problem:
            raise OptionError(*problem)

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.conditions import check_shuffle_heads, shuffle_conditions
        from mechkit.eval.evaluation import task_prompts
        from mechkit.eval.lengths import check_run_lengths
        from mechkit.heads.scores import load_scores, repeated_tokens
        from mechkit.heads.shuffled import shuffle_metrics
        from mechkit.model.headspec import baseline_flags, default_top_k, per_layer
        from mechkit.report import load_report

        opts, model = ctx.options, ctx.model
        if opts["gqa"] == "group":  # before any work: without KV groups it is the default's transplant
            unread.refuse_no_kv_groups(model.anatomy, "--gqa group", "drop --gqa group: with one KV head per "
                                       "query head the default --gqa query is the same full transplant")
        n_layers, n_heads = model.anatomy.n_layers, model.anatomy.head_counts  # per layer: pruned layers differ
        selection, tasks = opts["heads"], opts["tasks"]
        top_k = opts["top_k"] or default_top_k(n_layers, n_heads)
        named = selection.count(n_layers, n_heads, top_k, ctx.seed)  # before head scores are computed
        total = sum(per_layer(n_layers, n_heads))
        check_shuffle_heads(total, named, selection.spec)
        baseline = baseline_flags(self.options, opts, ("from_report",))  # --n-seqs, --seg-len: also the loss
        selection.check_baseline(n_layers, n_heads, [top_k], ctx.seed, **baseline)  # the random-heads comparison
        check_run_lengths(model, opts, ctx.seed, seg_len=True)  # held-out segments, scores and tasks: said at once
        prompts = task_prompts(tasks, opts["n"], opts["shots"], ctx.seed, opts["setting"]) if tasks else {}
        scores = load_scores(model, load_report(opts["from_report"]) if opts["from_report"] else None, opts["n_seqs"],
                             opts["seg_len"], ctx.seed, ctx.step, opts["from_report"]) if selection.needs_scores else None
        target = selection.resolve(n_layers, n_heads, scores=scores, top_k=top_k, seed=ctx.seed)
        selection.check_baseline(n_layers, n_heads, [top_k], ctx.seed, scores=scores, late=True, **baseline)
        # Held-out sequences: never the ones the heads were selected on.
        tokens = repeated_tokens(model, n_seqs=opts["n_seqs"], seg_len=opts["seg_len"], seed=ctx.seed + 1)
        plan = shuffle_conditions(target, n_layers, n_heads, opts["seeds"], ctx.seed)
        measure = {name: opts[name] for name in ("component", "gqa", "seg_len", "batch_size")}
        conditions = []
        with ctx.progress() as bar:
            job = bar.add_task("shuffle", total=len(plan))
            for name, mapping, seed in plan:
                key = (f"{name}|{seed}|{opts['component']}|{opts['gqa']}|"
                       + ",".join(f"{d}<{s}" for d, s in mapping.items()))
                conditions.append({"name": name, "seed": seed, "heads": [h.to_dict() for h in mapping],
                                   "mapping": {str(d): str(s) for d, s in mapping.items()},
                                   "metrics": ctx.step(key, lambda m=mapping: shuffle_metrics(model, m, tokens, prompts, **measure))})
                bar.advance(job)
        return self._result(conditions, tasks, opts)

    def _result(self, conditions: list[dict], tasks: list[str], opts: dict) -> Result:
        from mechkit.eval.evaluation import mean_std
        from mechkit.report import bar_plot, line_plot

        def agg(name: str, key) -> tuple[float, float]:
            return mean_std([key(c["metrics"]) for c in conditions if c["name"] == name])

        summary = {}
        for name in NAMES:
            mean, std = agg(name, lambda x: x["loss_second_copy"])
            summary[f"{name}: loss on repeated copy"] = f"{mean:.3f} ± {std:.3f}"
            for t in tasks:
                mean, std = agg(name, lambda x, t=t: x["tasks"][t]["accuracy"])
                summary[f"{name}: {t} accuracy"] = f"{mean:.2f} ± {std:.2f}"
        for c in conditions:  # condition table readers (report show) expect metrics per task
            c["metrics"] = {**c["metrics"], **c["metrics"].get("tasks", {})}
        results = {"conditions": conditions, "summary": summary, "component": opts["component"], "gqa": opts["gqa"]}
        curves = {}
        for name in NAMES:
            rows = [c["metrics"]["loss_per_position"] for c in conditions if c["name"] == name]
            curves[LABELS[name]] = [sum(v) / len(v) for v in zip(*rows, strict=True)]
        figures = {"loss_per_position": line_plot(list(range(1, len(curves["clean"]) + 1)), curves,
                                                  f"Loss per position, {opts['component']} weights moved",
                                                  "position", "cross-entropy (nats)")}
        if tasks:
            series, errors = {}, {}
            for name in NAMES:
                stats = [agg(name, lambda x, t=t: x["tasks"][t]["accuracy"]) for t in tasks]
                series[LABELS[name]] = [s[0] for s in stats]
                errors[LABELS[name]] = [s[1] for s in stats]
            figures["accuracy"] = bar_plot(tasks, series, f"Accuracy with {opts['component']} shuffled", "accuracy",
                                           errors=errors)
        return Result(results=results, figures=figures, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Conditions × loss on the two copies, and conditions × tasks (mean ± std over the seeds)."""
        from mechkit.report import Table

        conditions = results["conditions"]
        tasks = list(conditions[0]["metrics"].get("tasks", {}))
        seeds = len({c["seed"] for c in conditions if c["name"] == "target"})
        note = f"{results['component']} weights moved ({results['gqa']} under GQA); mean ± std over {seeds} seeds"
        loss = Table("Loss on held-out repeated random tokens (nats)", ["condition", "first copy", "repeat"],
                     [[LABELS[n], _stat(conditions, n, "loss_first_copy"), _stat(conditions, n, "loss_second_copy")]
                      for n in NAMES], note=note, digits=3)
        if not tasks:
            return [loss]
        acc = Table("Exact-match accuracy", ["condition", *tasks],
                    [[LABELS[n], *(_stat(conditions, n, "tasks", t) for t in tasks)] for n in NAMES], note=note)
        return [loss, acc]


def _stat(conditions: list[dict], name: str, key: str, task: str | None = None):
    """One condition's metric over its seeds: a number for the single clean run, else mean ± std."""
    from mechkit.report import pm_of

    values = [c["metrics"][key][task]["accuracy"] if task else c["metrics"][key]
              for c in conditions if c["name"] == name]
    if any(v is None for v in values):
        return None
    if name == "clean":
        return values[0]
    return pm_of(values)


def finding(results: dict) -> str:
    """The loss on the repeated copy (the copying signature) per condition, and the mean task accuracy."""
    conditions = results["conditions"]
    component = results["component"].upper()
    n = len(next(c for c in conditions if c["name"] == "target")["heads"])

    def show(name: str, key: str, digits: int, task: str | None = None) -> str:
        v = _stat(conditions, name, key, task)
        if v is None:
            return "—"
        return f"{v:.{digits}f}" if name == "clean" else f"{v['mean']:.{digits}f} ± {v['std']:.{digits}f}"

    text = (f"Permuting the {component} weights among the {n} selected heads takes the loss on the repeated copy "
            f"from {show('clean', 'loss_second_copy', 2)} to {show('target', 'loss_second_copy', 2)} nats; giving "
            f"them random heads' weights instead: {show('outside', 'loss_second_copy', 2)}, permuting {n} random "
            f"heads: {show('random', 'loss_second_copy', 2)}.")
    tasks = list(conditions[0]["metrics"].get("tasks", {}))
    if tasks:
        import statistics

        def accuracy(name: str) -> str:  # per seed the mean over tasks, then mean ± std over seeds
            runs = [statistics.fmean(c["metrics"]["tasks"][t]["accuracy"] for t in tasks)
                    for c in conditions if c["name"] == name]
            return f"{runs[0]:.2f}" if name == "clean" else \
                f"{statistics.fmean(runs):.2f} ± {statistics.pstdev(runs) if len(runs) > 1 else 0.0:.2f}"

        where = tasks[0] if len(tasks) == 1 else f"the {len(tasks)} tasks"
        text += (f" Mean accuracy on {where}: clean {accuracy('clean')}, permuted {accuracy('target')}, "
                 f"outside {accuracy('outside')}, random heads {accuracy('random')}.")
    return text
