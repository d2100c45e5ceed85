"""Activation-space task vectors on the embedded model: does one vector replace the demonstrations?

Runs the ``icl-vectors`` plugin (task vectors and function vectors; layer chosen on dev prompts,
accuracy on held-out test prompts) and prints the accuracy table (conditions × tasks), the chosen
layers, the lift of zero-shot + vector over zero-shot, and the median time (3 rounds) of extraction
and of application as ratios to loading the model. The report lands in ``bench/results/icl_vectors/`` and the table in
``bench/results/icl_vectors.json``. Finished steps are cached, so an interrupted run resumes.

    python bench/icl_vectors.py [--quick] [--threads 1] [--tasks capitalize,past-tense,...]
        [--method task-vector] [--spans 1,2] [--n 30] [--n-dev 20] [--n-contexts 24] [--tag NAME]

``--spans 1,2`` also tries the vector at two consecutive layers (task vector: θ_L, θ_L+1 replaced;
function vector: half the scaled FV added at each), chosen on dev with the layer and scale.
"""

from __future__ import annotations

import json
import time

from common import RESULTS, base_parser, go_offline, set_threads

TASKS = "capitalize,past-tense,country-capital,opposite,plus-one"


def timing(task: str, repeats: int = 3) -> dict:
    """Median seconds (over ``repeats`` interleaved rounds) to load the model, extract a task vector
    (24 contexts) and apply it to 20 prompts, and the two ratios to loading."""
    import statistics

    import mechkit as mk
    from mechkit.actvec import ResidEdit, icl_task_vectors, score_edited
    from mechkit.tasks import build_prompts

    prompts = build_prompts(task, n=20, shots=0, seed=2)
    rounds: dict[str, list[float]] = {"load_s": [], "extract_s": [], "apply_20_prompts_s": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        handle = mk.load_model("llama")
        rounds["load_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theta = icl_task_vectors(handle, task, n_contexts=24, shots=10, seed=0)
        rounds["extract_s"].append(time.perf_counter() - t0)
        layer = handle.anatomy.n_layers * 2 // 3
        t0 = time.perf_counter()
        score_edited(handle, prompts, [ResidEdit(layer, theta[layer])])
        rounds["apply_20_prompts_s"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {**med, "repeats": repeats, "extract_over_load": med["extract_s"] / med["load_s"],
            "apply_over_load": med["apply_20_prompts_s"] / med["load_s"]}


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--method", default="both", choices=("task-vector", "function-vector", "both"))
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--fv-scales", default="1,2,4,8")
    parser.add_argument("--n-contexts", type=int, default=24)
    parser.add_argument("--n-cie", type=int, default=10)
    parser.add_argument("--n", type=int, default=40, help="test prompts per task")
    parser.add_argument("--n-dev", type=int, default=20, help="dev prompts per task (choose layer, scale, span)")
    parser.add_argument("--spans", default="1", help="consecutive layers to try, e.g. 1,2")
    parser.add_argument("--tag", default="", help="suffix for the result names (several runs side by side)")
    parser.add_argument("--timing-only", action="store_true", help="only the timing rounds (no accuracy table)")
    args = parser.parse_args()
    go_offline()
    threads = set_threads(args.threads or 1)
    import mechkit as mk

    if args.timing_only:
        print("timing:", {k: round(v, 3) for k, v in timing(args.tasks.split(",")[0]).items()})
        return
    sizes = dict(n=4, n_dev=3, n_contexts=3, n_cie=2, layers="18-22") if args.quick else \
        dict(n=args.n, n_dev=args.n_dev, n_contexts=args.n_contexts, n_cie=args.n_cie)
    name = ("icl_vectors_quick" if args.quick else "icl_vectors") + (f"_{args.tag}" if args.tag else "")
    out = RESULTS / name
    t0 = time.perf_counter()
    run = mk.run("icl-vectors", model="llama", out=out, force=True, tasks=args.tasks, method=args.method,
                 shots=10, top_k=args.top_k, fv_scales=args.fv_scales, spans=args.spans, **sizes)
    wall = time.perf_counter() - t0
    res = run.results
    table, tasks = res["accuracy_table"], res["tasks"]
    print(f"{'condition':24s}" + "".join(f"{t:>17s}" for t in tasks))
    for cond, row in table.items():
        print(f"{cond:24s}" + "".join(f"{row[t]:17.2f}" for t in tasks))
    print("chosen layers:", res["chosen_layer"], "scales:", res["chosen_scale"], "spans:", res["chosen_span"])
    tags = [tag for tag in ("TV", "FV") if f"zero-shot + {tag}" in table]
    lift = {tag: {t: table[f"zero-shot + {tag}"][t] - table["zero-shot"][t] for t in tasks} for tag in tags}
    best = {t: max(lift[tag][t] for tag in tags) for t in tasks}
    print("lift over zero-shot:", lift)
    print(f"tasks lifted by >= 0.30: {sum(v >= 0.30 - 1e-9 for v in best.values())} of {len(tasks)}")
    times = timing(tasks[0])
    print("timing:", {k: round(v, 3) for k, v in times.items()})
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"threads": threads, "wall_s": wall, "accuracy_table": table,
                                "chosen_layer": res["chosen_layer"], "chosen_scale": res["chosen_scale"],
                                "chosen_span": res["chosen_span"], "lift": lift, "timing": times,
                                "params": run.report["params"]}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
