"""Prune the embedded model for one task family, save it, reload it, and check accuracy and speed.

The workflow a user follows, through the Python API:

1. calibrate on a few prompts of the tasks the smaller model must keep doing;
2. score units with a guide (``attribution``: the answer loss's first-order change when a unit
   is replaced by its mean) and plan the removal at a sparsity;
3. slice a physical copy (the dense model is untouched), save it in safetensors;
4. reload it with ``mk.load_model(DIR)`` and measure held-out accuracy and forward latency.

Run:  python examples/prune_for_task.py [--model llama] [--tasks capitalize,past-tense] [--out pruned] [--force]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mechkit as mk
from mechkit import pruning
from mechkit.eval.evaluation import evaluate, task_prompts
from mechkit.pruning.cost import latency, n_params


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--tasks", default="capitalize,past-tense,country-capital")
    parser.add_argument("--guide", default="attribution")
    parser.add_argument("--sparsity", default="neurons=0.3,heads=0.2")
    parser.add_argument("--n", type=int, default=30, help="held-out prompts per task")
    parser.add_argument("--calib", type=int, default=16, help="calibration prompts per task")
    parser.add_argument("--shots", type=int, default=10)
    parser.add_argument("--out", default="mechkit-runs/pruned-model")
    parser.add_argument("--force", action="store_true", help="replace --out if it holds an earlier model")
    args = parser.parse_args()
    tasks = args.tasks.split(",")

    dense = mk.load_model(args.model)
    calib = pruning.calibrate(dense, tasks, n=args.calib, shots=args.shots)
    scores = pruning.guide_scores(dense, args.guide, calib)
    sparsity = pruning.parse_sparsity(args.sparsity, ["neurons"])
    plan = pruning.make_plan(scores, dense.anatomy, sparsity, allocation="global")
    small = pruning.prune_copy(dense, plan, calib.stats)
    saved = pruning.save_pruned(small, Path(args.out), force=args.force)
    print(f"removed {plan.counts()} -> {saved}")

    reloaded = mk.load_model(str(saved), device=str(dense.device))
    held_out = task_prompts(tasks, args.n, args.shots, seed=0, setting=None)  # never the calibration seed
    before, after = evaluate(dense, held_out), evaluate(reloaded, held_out)
    timing = [p.text for ps in held_out.values() for p in ps][:8]
    t_dense, t_small = latency([dense, reloaded], timing, repeats=5)
    for task in tasks:
        print(f"{task:16s} dense {before[task]['accuracy']:.2f}  pruned {after[task]['accuracy']:.2f}")
    print(f"params {n_params(dense) / 1e6:.1f}M -> {n_params(reloaded) / 1e6:.1f}M; "
          f"forward speedup {t_dense / t_small:.2f}x (median of 5, interleaved)")


if __name__ == "__main__":
    main()
