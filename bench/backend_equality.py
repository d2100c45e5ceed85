"""Do the plugins give the same results on every backend? The embedded model, full plugin runs.

The suite checks every plugin on the tiny model of each family under ``native``, ``nnsight`` and
``--remote local``, and ``detect`` and ``ablate`` on the embedded model; the sweep and icl-vectors take
minutes on the embedded model, so they are checked here: each plugin runs once per backend on the same
options, and the script prints, per plugin and backend, the largest difference of any float in the
results from native's, the values that differ otherwise (exact-match accuracies, head rankings,
chosen layers) and the traces and remote jobs. Seconds are kept in the JSON only: the cost ratios are
``bench/nnsight_backend.py``'s, measured with warm-up and repeats.

    python bench/backend_equality.py [--quick] [--model llama] [--plugins sweep,icl-vectors] [--threads 1]
"""

from __future__ import annotations

import time

import common

RUNS = {"native": ("native", None), "nnsight": ("nnsight", None), "remote-local": ("nnsight", "local")}
OPTIONS = {  # small enough to finish in minutes on one CPU thread, large enough to rank heads and layers
    "detect": {"n_seqs": 4, "seg_len": 8, "batch_size": 4},
    "ablate": {"heads": "induction", "top_k": 3, "mode": "mean", "tasks": "capitalize", "n": 4, "shots": 2,
               "baseline_seeds": 2, "batch_size": 4, "n_seqs": 4, "seg_len": 8},
    "sweep": {"method": "both", "tasks": "capitalize", "n": 2, "shots": 2, "batch_size": 2},
    "icl-vectors": {"tasks": "capitalize", "n": 4, "n_dev": 3, "n_contexts": 3, "n_cie": 2, "shots": 2, "top_k": 3,
                    "fv_scales": "1,2", "batch_size": 8},
}


def differences(a, b, path: str = "results") -> tuple[float, list[str]]:
    """(largest float difference, paths of other mismatches) between two result trees."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return 0.0, [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        parts = [differences(a[k], b[k], f"{path}.{k}") for k in a]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 0.0, [f"{path}: {len(a)} != {len(b)} items"]
        parts = [differences(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    elif isinstance(a, float) and isinstance(b, float):
        return abs(a - b), []
    else:
        return 0.0, ([] if a == b else [f"{path}: {a!r} != {b!r}"])
    return max([0.0, *(d for d, _ in parts)]), [m for _, ms in parts for m in ms]


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec (default llama; quick tiny:llama)")
    parser.add_argument("--plugins", default=None, help="default sweep,icl-vectors; quick detect")
    args = parser.parse_args()
    args.model = args.model or ("tiny:llama" if args.quick else "llama")
    args.plugins = args.plugins or ("detect" if args.quick else "sweep,icl-vectors")
    common.go_offline()
    threads = common.set_threads(args.threads)
    import mechkit as mk

    handles = {name: mk.load_model(args.model, device="cpu", backend=b, remote=r) for name, (b, r) in RUNS.items()}
    rows, out = [], {"environment": common.environment(threads), "model": args.model, "runs": []}
    for plugin in args.plugins.split(","):
        results, seconds = {}, {}
        for name, handle in handles.items():
            start = time.perf_counter()
            run = mk.run(plugin, model=handle, write=False, backend=RUNS[name][0], **OPTIONS[plugin])
            seconds[name] = time.perf_counter() - start
            results[name] = (dict(run.results), run.report["model"].get("backend") or {})
        for name in RUNS:
            got, want = dict(results[name][0]), dict(results["native"][0])
            if plugin == "inspect":
                got.pop("forward", None), want.pop("forward", None)
            largest, mismatches = differences(got, want)
            backend = results[name][1]
            rows.append((plugin, name, f"{largest:.2e}", len(mismatches), backend.get("traces", "—"),
                         (backend.get("server") or {}).get("jobs", "—")))
            out["runs"].append({"plugin": plugin, "backend": name, "largest_difference": largest,
                                "mismatches": mismatches[:20], "seconds": seconds[name], "options": OPTIONS[plugin]})
            for m in mismatches[:5]:
                print(f"  {plugin} {name}: {m}")
    print(common.table(rows, ("plugin", "backend", "largest float diff", "other mismatches", "traces", "jobs")))
    print("written:", common.write_json("backend_equality", out, args.out))


if __name__ == "__main__":
    main()
