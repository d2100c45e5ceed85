"""Pruning: held-out accuracy vs measured forward speedup for every guide and baseline.

Runs the ``prune`` plugin on the embedded model (CPU): for each guide and sparsity a physical
sliced copy is measured against the dense model on the same inputs — exact-match accuracy on
held-out prompts of each task (calibration prompts use another seed), perplexity on held-out
text, parameters, FLOPs/token, and forward latency as the median of interleaved runs
(``speedup`` = dense median / pruned median on the same padded batch). Then budget mode.

    python bench/prune.py [--quick] [--threads N] [--guides attribution,wanda,magnitude,random]
                          [--sparsity 0.2,0.3] [--target neurons] [--budget 0.75]

Pin ``--threads`` on a shared machine; the quoted ratios are only as quiet as the machine.
"""

from __future__ import annotations

import common


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--guides", default="attribution,combined,wanda,flap,magnitude,random")
    p.add_argument("--target", default="neurons")
    p.add_argument("--sparsity", default="0.2,0.3,0.4")
    p.add_argument("--tasks", default="capitalize,past-tense,country-capital")
    p.add_argument("--n", type=int, default=None, help="held-out prompts per task (default 30; quick 3)")
    p.add_argument("--calib", type=int, default=None, help="calibration prompts per task (default 16; quick 3)")
    p.add_argument("--allocation", default="global")
    p.add_argument("--budget", type=float, default=None, help="also run budget mode at this latency fraction")
    p.add_argument("--budget-target", default="neurons,heads,layers")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timing-batch", type=int, default=8, help="prompts in the timed batch")
    p.add_argument("--timing", default="last", choices=("last", "all"),
                   help="timed forward: last-position logits (answer / prefill) or all positions")
    args = p.parse_args()
    n = args.n or (3 if args.quick else 30)
    calib = args.calib or (3 if args.quick else 16)
    shots = 2 if args.quick else 10
    model = "tiny:llama" if args.quick else args.model

    common.go_offline()
    threads = common.set_threads(args.threads)
    import time

    import mechkit as mk

    handle = mk.load_model(model)
    common.prefault(handle)
    out = common.RESULTS / "prune-runs"
    from mechkit import pruning

    tasks = args.tasks.split(",")
    first = args.guides.split(",")[0]
    name, _, alloc = first.partition("@")
    level = pruning.parse_levels(args.sparsity, args.target.split(","))[-1]
    start = time.perf_counter()  # pruning itself: calibration stats, scores, plan, physical slicing
    calibration = pruning.calibrate(handle, tasks, n=calib, shots=shots)
    t_calib = time.perf_counter() - start
    scores = pruning.guide_scores(handle, name, calibration)
    t_scores = time.perf_counter() - start - t_calib
    sens = None
    if (alloc or args.allocation) == "sensitivity":
        from mechkit.pruning.sensitivity import layer_sensitivity

        sens = layer_sensitivity(handle, scores.mlp, calibration)
    plan = pruning.make_plan(scores, handle.anatomy, level, alloc or args.allocation, sensitivity=sens)
    pruning.prune_copy(handle, plan, calibration.stats)
    prune_s = time.perf_counter() - start
    print(f"pruning itself ({first}, {level}): {prune_s:.1f} s "
          f"(calibration stats {t_calib:.1f} s, scores {t_scores:.1f} s, rest {prune_s - t_calib - t_scores:.1f} s)")
    start = time.perf_counter()
    run = mk.run("prune", model=handle, out=out / "sweep", force=True, guide=args.guides, target=args.target,
                 sparsity=args.sparsity, tasks=args.tasks, n=n, calib=calib, shots=shots,
                 allocation=args.allocation, repeats=args.repeats, timing=args.timing,
                 timing_batch=args.timing_batch)
    sweep_s = time.perf_counter() - start
    res = run.results
    dense = res["dense"]
    rows = [("dense", "-", *[f"{dense['accuracy'][t]:.2f}" for t in res["tasks"]], f"{dense['mean_accuracy']:.3f}",
             "1.000", f"{dense['perplexity']:.1f}", f"{dense['params'] / 1e6:.1f}", "1.00", "1.00")]
    for r in res["rows"]:
        rows.append((r["guide"], ",".join(f"{k}={v:.2f}" for k, v in r["sparsity"].items()),
                     *[f"{r['accuracy'][t]:.2f}" for t in res["tasks"]], f"{r['mean_accuracy']:.3f}",
                     f"{r['mean_accuracy'] / max(dense['mean_accuracy'], 1e-9):.3f}", f"{r['perplexity']:.1f}",
                     f"{r['params'] / 1e6:.1f}", f"{r['speedup']:.2f}", f"{r['speedup_other_timing']:.2f}"))
    other = "all" if args.timing == "last" else "last"
    print(common.table(rows, ("guide", "sparsity", *res["tasks"], "mean acc", "acc/dense", "ppl", "params M",
                              f"speedup× ({args.timing})", f"speedup× ({other})")))
    print(f"sweep wall time {sweep_s:.0f} s ({len(res['rows'])} pruned models, scoring + slicing + evaluation)")
    data = {"environment": common.environment(threads), "sweep": res, "sweep_s": sweep_s, "prune_s": prune_s}
    if args.budget:
        start = time.perf_counter()
        b = mk.run("prune", model=handle, out=out / "budget", force=True, guide=args.guides.split(",")[0],
                   target=args.budget_target, budget=args.budget, tasks=args.tasks, n=n, calib=calib, shots=shots,
                   allocation=args.allocation, repeats=args.repeats, timing=args.timing,
                 timing_batch=args.timing_batch).results
        data["budget"], data["budget_s"] = b, time.perf_counter() - start
        print(b["summary"]["budget"])
        for c in b["budget"]["candidates"]:
            print(f"  {c['mix']:15s} {c['sparsity']}  cost {c['cost_ratio']:.2f}  calib acc {c['calib_accuracy']}")
        row = b["rows"][0]
        print(f"  chosen: held-out acc {row['mean_accuracy']:.3f} (dense {b['dense']['mean_accuracy']:.3f}), "
              f"speedup {row['speedup']:.2f}×, {data['budget_s']:.0f} s")
    print("wrote", common.write_json("prune", data, args.out))


if __name__ == "__main__":
    main()
