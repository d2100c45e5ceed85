"""Ray fan-out: wall time of the exact sweep, the ablation-baseline grid and the prune grid with 1 and 2
Ray workers, as ratios to the serial run of the same work.

For each grid (``sweep``: the exact head sweep, units = (batch, layer); ``ablate``: clean, target and
random-head baselines, units = conditions; ``prune``: guide × sparsity rows, each a refit, an evaluation
and its own timed forwards), on the same model, prompts and seed:

- ``serial``: the plugin's run time (``timings.run_s``: the model already loaded) with ``--executor serial``;
- ``ray W warm``: the same with ``--executor ray --workers W``, workers already up holding the model
  (a second run in one Ray session reuses them);
- ``ray W cold``: the first such run, which starts the workers: each imports torch and loads the model.

Every worker runs torch on the run's ``--threads`` (default 1, so two workers fit two cores and the
serial baseline uses the same single thread): results are checked identical to the serial run's (for
``prune``, all but the latencies each row measures, which differ between any two runs).
Startup (``ray.init``, then the workers' spawn + import + load, in parallel) is timed on its own, and
so is how many cores W busy processes get on the machine at the time (``cores free for W``: W on an
idle machine, less where other work holds cores): the most W workers can gain, whatever the executor.
Medians over ``--repeats``; the cost model in ``bench/README.md`` is fitted from these figures.

    python bench/ray_executor.py [--quick] [--model llama] [--threads 1] [--repeats 3] [--workers 1,2]
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import common

GRIDS = {
    # one batch of prompts: 1 clean unit + one unit per layer
    "sweep": lambda q: {"tasks": "capitalize", "n": 2 if q else 4, "shots": 1 if q else 2, "batch_size": 4},
    # clean + target + 9 random draws of 10 heads: 11 units of one evaluation each
    "ablate": lambda q: {"tasks": "capitalize", "n": 2 if q else 8, "shots": 1 if q else 4, "heads": "random",
                         "top_k": 2 if q else 10, "baseline_seeds": 3 if q else 9, "batch_size": 8},
    # 2 guides × 2 levels: 4 rows, each a refit, held-out accuracy and perplexity, and 16 timed forwards
    "prune": lambda q: {"guide": "wanda,magnitude", "sparsity": "0.2,0.4", "tasks": "capitalize",
                        "n": 2 if q else 8, "calib": 2 if q else 4, "shots": 1 if q else 4, "repeats": 1 if q else 3,
                        "timing_batch": 2 if q else 8},
}
TIMING = {"latency_s", "dense_latency_s", "latency_ratio", "speedup", "speedup_other_timing", "reconstruct_s"}


def units_of(grid: str, options: dict, n_layers: int) -> int:
    if grid == "sweep":
        return -(-options["n"] // options["batch_size"]) * (1 + n_layers)
    if grid == "prune":
        return len(options["guide"].split(",")) * len(options["sparsity"].split(","))
    return 2 + options["baseline_seeds"]


def untimed(grid: str, results: dict) -> dict:
    """What must be identical to the serial run's: everything, except the prune rows' own timings (and the
    summary lines quoting them), which no two runs share."""
    if grid != "prune":
        return results
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in results["rows"]]
    dense = {k: v for k, v in results["dense"].items() if k not in TIMING}
    return {**results, "rows": rows, "dense": dense,
            "summary": {k: v.rpartition(" | speedup")[0] for k, v in results["summary"].items()}}


def run_s(plugin: str, model: str, options: dict, **execution) -> tuple[float, dict]:
    import mechkit as mk

    run = mk.run(plugin, model=model, device="cpu", write=False, **options, **execution)
    return run.report["timings"]["run_s"], untimed(plugin, run.results)


def measure(grid: str, model: str, options: dict, workers: list[int], repeats: int) -> dict:
    """Serial median, then per worker count: one cold run (workers start) and the warm median."""
    from mechkit.executors.ray_pool import release_workers

    _, want = run_s(grid, model, options)  # also the warm-up: first-use imports (matplotlib) are not timed
    serial = [run_s(grid, model, options)[0] for _ in range(repeats)]
    out = {"serial_s": statistics.median(serial), "serial_runs_s": serial, "ray": {}}
    for w in workers:
        release_workers()
        cold, got = run_s(grid, model, options, executor="ray", workers=w)
        warm = [run_s(grid, model, options, executor="ray", workers=w) for _ in range(repeats)]
        same = got == want and all(r == want for _, r in warm)
        out["ray"][w] = {"cold_s": cold, "warm_s": statistics.median([t for t, _ in warm]),
                         "warm_runs_s": [t for t, _ in warm], "identical_to_serial": same}
        print(f"[ray] {grid} W={w}: cold {cold:.2f}s, warm {out['ray'][w]['warm_s']:.2f}s, identical {same}",
              flush=True)
    release_workers()
    return out


def _spin(n: int) -> float:
    t = time.perf_counter()
    sum(i * i for i in range(n))
    return time.perf_counter() - t


def parallel_capacity(w: int, n: int = 3_000_000) -> float:
    """How many cores ``w`` busy processes get here right now: ``w`` × (time of one alone) / (time of each
    of ``w`` running together). ``w`` on an idle machine with ``w`` free cores, less where other work
    holds them: the most ``w`` workers can gain over one, whatever the executor."""
    import multiprocessing

    pool = multiprocessing.get_context("fork").Pool(w)
    try:
        alone = statistics.median(pool.map(_spin, [n])[0] for _ in range(3))
        together = statistics.median(pool.map(_spin, [n] * w))
    finally:
        pool.close()  # let them exit (terminate() would SIGTERM them, and Ray's handlers would say so)
        pool.join()
    return w * alone / together if w > 1 else 1.0


def startup(model: str, workers: int) -> float:
    """Seconds from nothing to ``workers`` workers holding the model (spawn, import, load, checksum)."""
    import mechkit as mk
    from mechkit.executors import LoadSpec
    from mechkit.executors.ray_pool import RayExecutor, release_workers

    release_workers()
    executor = RayExecutor(LoadSpec.of(mk.load_model(model, device="cpu")), workers=workers)
    t = time.perf_counter()
    executor._start()
    took = time.perf_counter() - t
    executor._sound = False  # stop them: the next measurement starts cold
    executor.close()
    return took


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec (default llama; quick tiny:llama)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per setting (default 3; quick 2)")
    p.add_argument("--workers", default="1,2", help="worker counts to time, comma-separated")
    p.add_argument("--grids", default="sweep,ablate,prune", help=f"which of {', '.join(GRIDS)}")
    args = p.parse_args()
    model = args.model or ("tiny:llama" if args.quick else "llama")
    repeats = args.repeats or (2 if args.quick else 3)
    workers = [int(w) for w in args.workers.split(",")]
    common.go_offline()
    threads = common.set_threads(args.threads or 1)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import ray

    import mechkit as mk

    t = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    init_s = time.perf_counter() - t
    try:
        n_layers = mk.load_model(model, device="cpu").anatomy.n_layers
        starts = {w: startup(model, w) for w in workers}
        results = {}
        for grid in args.grids.split(","):
            options = GRIDS[grid](args.quick)
            capacity = {w: parallel_capacity(w) for w in workers}  # before and after: the machine may change
            results[grid] = {"options": options, "units": units_of(grid, options, n_layers),
                             **measure(grid, model, options, workers, repeats)}
            results[grid]["cores_available"] = {w: round(min(c, parallel_capacity(w)), 2) for w, c in capacity.items()}
    finally:
        from mechkit.executors.ray_pool import release_workers

        release_workers()
        ray.shutdown()
    report(model, threads, init_s, starts, results, workers, args.out)


def report(model: str, threads: int, init_s: float, starts: dict, results: dict, workers: list[int],
           out: Path | None = None) -> None:
    rows = []
    for grid, r in results.items():
        rows.append((grid, r["units"], "serial", r["serial_s"], 1.0, "-", "-"))
        for w in workers:
            ray_w, cores = r["ray"][w], r["cores_available"][w]
            rows.append((grid, r["units"], f"ray W={w} warm", ray_w["warm_s"], ray_w["warm_s"] / r["serial_s"],
                         ray_w["identical_to_serial"], cores))
            rows.append((grid, r["units"], f"ray W={w} cold", ray_w["cold_s"], ray_w["cold_s"] / r["serial_s"],
                         ray_w["identical_to_serial"], cores))
    print(f"\nmodel {model}, torch threads per process {threads}, ray.init {init_s:.2f}s; worker startup "
          + ", ".join(f"W={w} {s:.2f}s" for w, s in starts.items()))
    print(common.table(rows, ("grid", "units", "executor", "median run s", "ratio to serial", "identical",
                              "cores free for W")))
    path = common.write_json("ray", {"model": model, "ray_init_s": init_s, "startup_s": starts, "grids": results,
                                     "environment": common.environment(threads)}, out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
