"""``mechkit taskvec sweep``: the seeds' λ tables for Ψ = Ψ0 + ΔΨ_1 + λ·ΔΨ_2 (Figure 23).

For a base model (``--model``) and two task vectors A = ΔΨ_1, B = ΔΨ_2 (``--vectors A,B``), each λ on
the grid (``--lambdas -1:1.5:0.1``) is applied reversibly and both tasks are scored (exact match,
zero-shot by default; ``--shots 0,5`` adds few-shot prompts, where unlearning also shows as lost
in-context ability). Reported: the table, the base model and each vector alone as reference rows,
the best λ for multi-task learning (λ > 0 maximising the worse of the two tasks' accuracy relative
to its own vector alone) and for unlearning (λ < 0 maximising acc(T1) − acc(T2)), ties going to the
smaller |λ|, and the task correlation
estimates of :mod:`mechkit.taskarith.similarity` — weight cosine, the seeds'
E[Sim(f(X;Ψ1), f(X;Ψ2))] with Sim the cosine of next-token distributions, and its signed variant,
the cosine of the two vectors' shifts of next-token log-probabilities — over both tasks' prompts.
"""

from __future__ import annotations

from mechkit.plugin import Option, Plugin, Result, RunContext


def parse_lambdas(text: str) -> list[float]:
    """``"-1:1.5:0.1"`` (start:stop:step, stop included) or ``"-1,0,0.5,1"``."""
    from mechkit.errors import MechkitError

    fix = "use start:stop:step like -1:1.5:0.1 or a list like -1,0,1"
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            n = int(round((stop - start) / step)) + 1
            values = [round(start + i * step, 10) for i in range(n) if start + i * step <= stop + 1e-9]
        else:
            values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MechkitError(f"malformed --lambdas {text!r}", fix) from None
    if not values:
        raise MechkitError(f"no λ values in {text!r}", fix)
    return sorted(dict.fromkeys(values))


def best_lambdas(rows: list[dict], t1: str, t2: str, own: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Best λ for multi-task learning and for unlearning; ties go to the smaller |λ|.

    Multi-task (λ > 0): the largest worse-of-two retention, min(acc1 / own1, acc2 / own2), where
    ``own`` holds each task's accuracy under its own vector alone (so "keeps both" is what counts,
    not one task's gain bought with the other), then the larger mean. Unlearning (λ < 0): the
    largest acc1 − acc2.
    """
    def pick(cands, score):
        return max(cands, key=lambda r: (*(round(x, 9) for x in score(r)), -abs(r["lambda"])), default=None)

    o1, o2 = (max(o, 1e-9) for o in own)
    multi = pick([r for r in rows if r["lambda"] > 0],
                 lambda r: (min(r[t1] / o1, r[t2] / o2), (r[t1] + r[t2]) / 2))
    unlearn = pick([r for r in rows if r["lambda"] < 0], lambda r: (r[t1] - r[t2],))
    return {"multi_task": multi, "unlearning": unlearn}


class TaskvecSweepPlugin(Plugin):
    name = "taskvec-sweep"
    version = "0.1.0"
    summary = "Accuracy of Ψ0 + ΔΨ_A + λ·ΔΨ_B over a λ grid on both tasks, best λ and task correlation α̂."
    options = (
        Option("vectors", str, None, "Two task-vector files A,B (from `mechkit taskvec extract`)."),
        Option("tasks", str, None, "Task ids T1,T2 (default: the tasks recorded in the vectors)."),
        Option("lambdas", str, "-1:1.5:0.1", "λ grid for B: start:stop:step or a comma list."),
        Option("scale_a", float, 1.0, "Coefficient of vector A."),
        Option("n", int, 20, "Prompts per task."),
        Option("shots", str, "0", "Demonstrations per prompt, comma-separated settings (e.g. 0,5)."),
        Option("batch_size", int, 16, "Prompts per forward pass."),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.errors import MechkitError
        from mechkit.eval.evaluation import evaluate
        from mechkit.taskarith import TaskVector, arithmetic, task_correlation
        from mechkit.taskarith.finetune import parse_shots
        from mechkit.tasks import build_prompts, parse_tasks

        p, m = ctx.params, ctx.model
        paths = [x.strip() for x in (p["vectors"] or "").split(",") if x.strip()]
        if len(paths) != 2:
            raise MechkitError("--vectors needs two task-vector files A,B", "pass --vectors cap.safetensors,low.safetensors")
        a, b = (TaskVector.load(x) for x in paths)
        if p["tasks"]:  # one id per vector; the same task twice is allowed (aligned vectors of one task)
            tasks = [parse_tasks(t)[0] for t in p["tasks"].split(",") if t.strip()]
        else:
            tasks = [_task_of(v, x) for v, x in ((a, paths[0]), (b, paths[1]))]
        if len(tasks) != 2:
            raise MechkitError(f"--tasks needs two task ids, got {tasks}", "pass --tasks capitalize,past-tense")
        lambdas = parse_lambdas(p["lambdas"])
        shots = parse_shots(p["shots"])
        prompts = {_col(t, i, tasks, s, shots): build_prompts(t, n=p["n"], shots=s, seed=ctx.seed)
                   for s in shots for i, t in enumerate(tasks)}
        cols = list(prompts)
        plan = [("base", []), ("A only", [(a, p["scale_a"])]), ("B only", [(b, 1.0)])]
        plan += [(f"λ={lam:g}", [(a, p["scale_a"]), (b, lam)]) for lam in lambdas]
        rows = []
        with arithmetic(m) as ta, ctx.progress() as bar:
            job = bar.add_task("taskvec sweep", total=len(plan))
            for name, terms in plan:
                def compute(terms=terms):
                    ta.set(*terms)
                    return {c: r["accuracy"] for c, r in evaluate(m, prompts, p["batch_size"]).items()}

                rows.append({"name": name, **ctx.step(f"{name}|{paths}|{tasks}", compute)})
                bar.advance(job)
        texts = [q.text for t in dict.fromkeys(tasks) for q in build_prompts(t, n=p["n"], shots=0, seed=ctx.seed)]
        alpha = ctx.step("alpha", lambda: task_correlation(m, a, b, texts, p["scale_a"], 1.0))
        return self._result(rows, lambdas, tasks, cols, shots, alpha, paths)

    def _result(self, rows, lambdas, tasks, cols, shots, alpha, paths) -> Result:
        from mechkit.report import line_plot

        refs = {r["name"]: r for r in rows[:3]}
        grid = [{"lambda": lam, **{c: r[c] for c in cols}} for lam, r in zip(lambdas, rows[3:], strict=True)]
        t1, t2 = cols[0], cols[1]  # zero-shot (first --shots setting) columns drive the best-λ choice
        best = best_lambdas(grid, t1, t2, own=(refs["A only"][t1], refs["B only"][t2]))
        summary = {f"λ={r['lambda']:g}": " | ".join(f"{c} {r[c]:.2f}" for c in cols) for r in grid}
        for key, row in best.items():
            if row is not None:
                summary[f"best {key}"] = f"λ={row['lambda']:g}: {t1} {row[t1]:.2f}, {t2} {row[t2]:.2f}"
        summary["alpha"] = ", ".join(f"{k} {v:.3f}" for k, v in alpha.items())
        results = {"tasks": tasks, "vectors": paths, "columns": cols, "shots": list(shots), "table": grid,
                   "reference": refs, "best": best, "alpha": alpha, "summary": summary}
        series = {c: [r[c] for r in grid] for c in cols}
        fig = line_plot(lambdas, series, f"Ψ0 + ΔΨ({tasks[0]}) + λ·ΔΨ({tasks[1]})", "λ", "exact-match accuracy")
        return Result(results=results, figures={"accuracy_vs_lambda": fig})


def _col(task: str, index: int, tasks: list[str], shots: int, all_shots: tuple[int, ...]) -> str:
    """Column name: the task id, ``#2`` for B's when both vectors are for one task, ``@shots`` if several."""
    name = f"{task}#2" if index == 1 and tasks[0] == tasks[1] else task
    return name if len(all_shots) == 1 else f"{name}@{shots}"


def _task_of(vector, path: str) -> str:
    from mechkit.errors import MechkitError

    tasks = vector.meta.get("tasks") or []
    if len(tasks) != 1:
        raise MechkitError(f"cannot tell which task {path} is for (metadata tasks: {tasks})",
                           "pass --tasks T1,T2")
    return tasks[0]
