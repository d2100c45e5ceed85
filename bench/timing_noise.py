"""How well one input's latency ratio can be measured on this machine, by protocol.

Times ``--forwards`` back-to-back dense forwards of one held-out-style prompt (10-shot past-tense,
last-position logits, this thread's CPU time on one thread, else elapsed time; garbage collector off),
then replays that series as if some forwards were a plan identical to dense, so every ratio should be
1 and its spread is pure measurement noise:

- ``rounds``: ``--runners`` runners round-robin (dense first, as `mechkit adapt` times a held-out input
  under 13 plans), ``R`` rounds, ratio = median of a runner / median of dense;
- ``paired``: ``D t1 D t2 D …``, ratio = median over rounds of a runner over the mean of the two dense
  forwards beside it (what `mechkit adapt` does now, :func:`mechkit.adapt.cost.time_paired`).

Prints the autocorrelation of the series (how slowly the machine's speed drifts) and, per protocol and
number of rounds, the median / 95th / 99th percentile / max of |1 − ratio|.

    python bench/timing_noise.py [--quick] [--model llama] [--threads 1] [--forwards 600] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})

import numpy as np  # noqa: E402


def series(model_spec: str, threads: int, forwards: int) -> np.ndarray:
    import torch

    torch.set_num_threads(threads)
    import mechkit as mk

    m = mk.load_model(model_spec)
    ids = m.tokenizer(mk.build_prompts("past-tense", n=1, shots=10)[0].text, return_tensors="pt")["input_ids"]
    clock = time.thread_time if threads == 1 else time.perf_counter

    def one() -> float:
        start = clock()
        with torch.no_grad():
            m.model(input_ids=ids.to(m.device), use_cache=False, logits_to_keep=1)
        return clock() - start

    for _ in range(3):
        one()
    gc.disable()
    try:
        return np.array([one() for _ in range(forwards)])
    finally:
        gc.enable()


def deviations(ts: np.ndarray, rounds: int, runners: int, paired: bool) -> np.ndarray:
    """|1 − ratio| of every non-dense runner in every disjoint window of the series."""
    width = 2 * (runners - 1) + 1 if paired else runners
    out = []
    for s in range(0, len(ts) - rounds * width + 1, rounds * width):
        block = ts[s:s + rounds * width].reshape(rounds, width)
        for k in range(1, runners):
            if paired:
                ratio = np.median(block[:, 2 * k - 1] / ((block[:, 2 * k - 2] + block[:, 2 * k]) / 2))
            else:
                ratio = np.median(block[:, k]) / np.median(block[:, 0])
            out.append(abs(1 - ratio))
    return np.asarray(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model spec (default llama; quick tiny:llama)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--forwards", type=int, default=None, help="forwards timed (default 600; quick 60)")
    ap.add_argument("--runners", type=int, default=14, help="dense + the runners timed per input (adapt: 14)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = args.model or ("tiny:llama" if args.quick else "llama")
    ts = series(model, args.threads, args.forwards or (60 if args.quick else 600))
    lags = [k for k in (1, 2, 5, 10, 50) if k < len(ts)]
    auto = {k: float(np.corrcoef(ts[:-k], ts[k:])[0, 1]) for k in lags}
    print(f"{len(ts)} forwards, mean {1000 * ts.mean():.1f} ms, cv {ts.std() / ts.mean():.3f}; autocorrelation "
          + ", ".join(f"lag {k}: {v:.2f}" for k, v in auto.items()))
    summary = {"forwards": len(ts), "mean_ms": 1000 * float(ts.mean()), "autocorrelation": auto, "protocols": []}
    print(f"{'protocol':>8} {'rounds':>6} {'n':>4} {'median':>7} {'p95':>7} {'p99':>7} {'max':>7}   |1 - ratio|")
    for rounds in (1, 3, 5):
        for paired in (False, True):
            d = deviations(ts, rounds, args.runners, paired)
            if not d.size:
                continue
            row = {"protocol": "paired" if paired else "rounds", "rounds": rounds, "n": int(d.size),
                   "median": float(np.median(d)), "p95": float(np.percentile(d, 95)),
                   "p99": float(np.percentile(d, 99)), "max": float(d.max())}
            summary["protocols"].append(row)
            print(f"{row['protocol']:>8} {rounds:6d} {row['n']:4d} {row['median']:7.4f} {row['p95']:7.4f} "
                  f"{row['p99']:7.4f} {row['max']:7.4f}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
