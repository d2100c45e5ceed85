"""The select-tasks study (Algorithm 1 + --validate fine-tunes) timed serially and with Ray workers.

The whole study for one target runs with ``--executor serial`` and then ``--executor ray --workers W``
(workers that each load the model once and take whole fine-tunes as units), on the same model, options
and seed. Reported: each run's ``timings.run_s`` (the model already loaded in the driver), its ratio to
the serial run, and whether the Table 3.1 cells are identical to the serial run's (they must be: a unit's
result depends only on the unit). The first Ray run per worker count is cold (workers start and load
the model); warm runs reuse them. Medians over ``--repeats``.

    python bench/taskselect.py [--quick] [--study full|embedded] [--model llama] [--threads 1] [--repeats 2]
                               [--workers 2]

The default study on the embedded model is ``embedded`` (a 3-task pool, 4-step fine-tunes); ``--study full``
is the 6-task pool of 10-step fine-tunes (about an hour on 2 shared cores).
"""

from __future__ import annotations

import os
import statistics

import common

STUDY = {  # one target, a 6-task pool: 10 condition fine-tunes + 6 single-task ones at one seed
    "full": {"target": "past-tense", "pool": "opposite,lowercase,capitalize,swap,country-capital,negation",
             "n": 16, "validate": True, "seeds": "0", "steps": 10, "budget": 48, "batch_size": 8, "eval_n": 20,
             "eval_shots": "0,3", "draws": 3, "transfer_seeds": 1},
    # the embedded model on 2 shared cores: one study is minutes, so a 3-task pool and short fine-tunes
    # (about 7 fine-tunes: Selected, All, Random and No Con. draws, No Div., and one per candidate)
    "embedded": {"target": "past-tense", "pool": "opposite,lowercase,capitalize", "n": 16, "validate": True,
                 "seeds": "0", "steps": 4, "budget": 32, "batch_size": 8, "eval_n": 10, "eval_shots": "0",
                 "draws": 2, "transfer_seeds": 1},
    "quick": {"target": "past-tense", "pool": "opposite,capitalize,swap", "n": 4, "validate": True, "seeds": "0",
              "steps": 1, "budget": 6, "batch_size": 2, "eval_n": 2, "eval_shots": "0", "draws": 3,
              "transfer_seeds": 0},
}


def run_s(model: str, options: dict, **execution) -> tuple[float, dict]:
    import mechkit as mk

    run = mk.run("select-tasks", model=model, device="cpu", write=False, **options, **execution)
    return run.report["timings"]["run_s"], run.results.get("table")


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model spec (default llama; quick tiny:llama)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per setting (default 2; quick 1)")
    p.add_argument("--study", choices=("full", "embedded"), default="embedded", help="the study timed (not --quick)")
    p.add_argument("--workers", default="2", help="worker counts to time, comma-separated")
    args = p.parse_args()
    model = args.model or ("tiny:llama" if args.quick else "llama")
    repeats = args.repeats or (1 if args.quick else 2)
    options = STUDY["quick" if args.quick else args.study]
    common.go_offline()
    threads = common.set_threads(args.threads or 1)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import ray

    from mechkit.executors.ray_pool import release_workers

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        _, want = run_s(model, options)  # warm-up: first-use imports are not timed
        serial = [run_s(model, options)[0] for _ in range(repeats)]
        rows = [("serial", statistics.median(serial), 1.0, "-")]
        out = {"serial_s": serial, "ray": {}}
        for w in (int(x) for x in args.workers.split(",")):
            release_workers()
            cold, got = run_s(model, options, executor="ray", workers=w)
            warm = [run_s(model, options, executor="ray", workers=w) for _ in range(repeats)]
            same = got == want and all(t == want for _, t in warm)
            med = statistics.median(t for t, _ in warm)
            rows += [(f"ray W={w} warm", med, med / rows[0][1], same), (f"ray W={w} cold", cold, cold / rows[0][1], same)]
            out["ray"][w] = {"cold_s": cold, "warm_s": [t for t, _ in warm], "identical_to_serial": same}
    finally:
        release_workers()
        ray.shutdown()
    print(f"\nmodel {model}, torch threads per process {threads}, options {options}")
    print(common.table(rows, ("executor", "median run s", "ratio to serial", "identical table")))
    path = common.write_json("taskselect", {"model": model, "options": options, **out,
                                            "environment": common.environment(threads)}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
