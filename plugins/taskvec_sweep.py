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
Each row (base, each vector alone, each λ) is a unit of ``--executor`` (``ray``: workers that each load
the base model once; the vectors travel to them in memory).
"""

from __future__ import annotations

from mechkit.options import EXECUTION, NumberList, Paths, TaskList, parse_lambdas
from mechkit.plugin import Option, Plugin, Result, RunContext


class TaskvecSweepPlugin(Plugin):
    name = "taskvec-sweep"
    version = "0.1.0"
    needs = frozenset({"weight_writes", "weight_reads", "generation"})  # Ψ0 + Σ λ·τ from the base weights
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Accuracy of Ψ0 + ΔΨ_A + λ·ΔΨ_B over a λ grid on both tasks, best λ and task correlation α̂."
    options = (
        Option("vectors", str, None, "Two task-vector files A,B (from `mechkit taskvec extract`).", required=True,
               parse=Paths(count=2, what="task-vector files", example="cap.safetensors,low.safetensors")),
        Option("tasks", str, None, "Task ids T1,T2 (default: the tasks recorded in the vectors).",
               parse=TaskList(count=2, unique=False, allow_empty=True)),
        Option("lambdas", str, "-1:1.5:0.1", "λ grid for B: start:stop:step or a comma list.", parse=parse_lambdas),
        Option("scale_a", float, 1.0, "Coefficient of vector A."),
        Option("n", int, 20, "Prompts per task.", min=1),
        Option("shots", str, "0", "Demonstrations per prompt, comma-separated settings (e.g. 0,5).",
               parse=NumberList(int, min=0, example="0,5")),
        Option("batch_size", int, 16, "Prompts per forward pass.", min=1),
        Option("allow_other_base", bool, False, "Apply vectors extracted from another base model (same "
                                                "architecture) to this one.", is_flag=True),
        *EXECUTION,  # the rows of the λ grid can run on Ray workers
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.taskarith import TaskVector, task_correlation
        from mechkit.tasks import build_prompts

        opts, model = ctx.options, ctx.model
        paths = opts["vectors"]
        vec_a, vec_b = (TaskVector.load(x) for x in paths)
        # one id per vector; the same task twice is allowed (aligned vectors of one task)
        tasks = opts["tasks"] or [_task_of(v, x) for v, x in ((vec_a, paths[0]), (vec_b, paths[1]))]
        lambdas = opts["lambdas"]
        shots = opts["shots"]
        prompts = {_col(t, i, tasks, s, shots): build_prompts(t, n=opts["n"], shots=s, seed=ctx.seed)
                   for s in shots for i, t in enumerate(tasks)}
        cols = list(prompts)
        # terms name the vectors by index (0: A, 1: B), so units stay small; the vectors go once per run
        plan = [("base", []), ("A only", [(0, opts["scale_a"])]), ("B only", [(1, 1.0)])]
        plan += [(f"λ={lam:g}", [(0, opts["scale_a"]), (1, lam)]) for lam in lambdas]
        shared = ((vec_a, vec_b), prompts, opts["batch_size"], opts["allow_other_base"])
        with ctx.progress() as bar:
            job = bar.add_task("taskvec sweep", total=len(plan))
            scores = ctx.map_units(grid_units, shared, [terms for _, terms in plan],
                                   [f"{name}|{terms!r}|{paths}|{tasks}" for name, terms in plan],  # λ in full
                                   on_result=lambda _i, _v: bar.advance(job))
        rows = [{"name": name, **got} for (name, _), got in zip(plan, scores, strict=True)]
        texts = [q.text for t in dict.fromkeys(tasks) for q in build_prompts(t, n=opts["n"], shots=0, seed=ctx.seed)]
        alpha = ctx.step("alpha", lambda: task_correlation(model, vec_a, vec_b, texts, opts["scale_a"], 1.0,
                                                            allow_other_base=opts["allow_other_base"]))
        return self._result(rows, lambdas, tasks, cols, shots, alpha, paths)

    def _result(self, rows, lambdas, tasks, cols, shots, alpha, paths) -> Result:
        from mechkit.report import line_plot
        from mechkit.taskarith.lambdas import best_lambdas

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
        return Result(results=results, figures={"accuracy_vs_lambda": fig}, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """λ × task (the reference rows first, the best λ marked), and the task correlation estimates."""
        from mechkit.report import Table, kv_table

        cols, best = results["columns"], results.get("best") or {}
        marks = {row["lambda"]: label for key, label in (("multi_task", "best multi-task"),
                                                         ("unlearning", "best unlearning"))
                 if (row := best.get(key)) is not None}
        refs = [[name, *(r.get(c) for c in cols)] for name, r in results["reference"].items()]
        grid = [[f"λ={r['lambda']:g}" + (f" ({marks[r['lambda']]})" if r["lambda"] in marks else ""),
                 *(r.get(c) for c in cols)] for r in results["table"]]
        t1, t2 = results["tasks"]
        return [Table("Exact-match accuracy by λ", ["model", *cols], refs + grid,
                      note=f"Ψ0 + ΔΨ_A({t1}) + λ·ΔΨ_B({t2}); base: Ψ0, A only: Ψ0 + ΔΨ_A, B only: Ψ0 + ΔΨ_B"),
                kv_table("Task correlation α̂", results.get("alpha") or {}, digits=3)]


def finding(results: dict) -> str:
    """The best λ for keeping both tasks and for unlearning B, and how correlated the two tasks are."""
    t1, t2 = results["tasks"]
    c1, c2 = results["columns"][:2]
    best, refs = results.get("best") or {}, results["reference"]
    parts = []
    multi, unlearn = best.get("multi_task"), best.get("unlearning")
    if multi is not None:
        parts.append(f"the best multi-task λ is {multi['lambda']:g} ({c1} {multi[c1]:.2f}, {c2} {multi[c2]:.2f}; "
                     f"each vector alone {refs['A only'][c1]:.2f} and {refs['B only'][c2]:.2f})")
    if unlearn is not None:
        parts.append(f"unlearning works best at λ={unlearn['lambda']:g} ({c1} {unlearn[c1]:.2f}, "
                     f"{c2} {unlearn[c2]:.2f})")
    text = f"For Ψ0 + ΔΨ({t1}) + λ·ΔΨ({t2}), " + ("; ".join(parts) if parts else "no λ was swept") + "."
    alpha = {k: v for k, v in (results.get("alpha") or {}).items() if v is not None}
    if alpha:
        text += " Task correlation: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in alpha.items()) + "."
    return text


def grid_units(handle, shared: tuple, units: list):
    """Each unit ``[(vector index, λ), ...]`` -> exact-match accuracy per column with the weights at
    Ψ0 + Σ λ·τ. ``set`` rebuilds the weights from Ψ0 every time (never from the previous row), and Ψ0
    is restored when the call ends, so a row's scores never depend on the rows run before it."""
    from mechkit.eval.evaluation import evaluate
    from mechkit.taskarith import arithmetic

    vectors, prompts, batch_size, allow_other_base = shared
    with arithmetic(handle, allow_other_base=allow_other_base) as ta:
        for terms in units:
            ta.set(*((vectors[i], lam) for i, lam in terms))
            scores = {c: r["accuracy"] for c, r in evaluate(handle, prompts, batch_size).items()}
            yield scores


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
