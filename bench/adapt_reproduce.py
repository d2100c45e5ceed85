"""Reproduce a `mechkit adapt` run's held-out figures the way a user would: the run's saved
scheduler through the public ``mechkit.adapt.adaptive`` context, and everything measured here with
plain ``transformers`` calls and ``time`` clocks — no mechkit timing or scoring code.

    python bench/adapt_reproduce.py RUN_DIR [--threads 1] [--repeats 3] [--out FILE]
    python bench/adapt_reproduce.py --quick      # a tiny run made here: a smoke test, not a measurement

``RUN_DIR`` holds the run's ``report.json`` and ``scheduler.json``. The held-out prompts are rebuilt
from the report's parameters (the same seeded prompts the run scored; the calibration ones excluded).
For every budget of the run and every held-out prompt this measures:

- **accuracy**: greedy ``generate`` (KV cache on) inside ``adaptive(model, budget=B, scheduler=…)``;
  correct when the decoded text begins with an accepted answer and its terminator;
- **latency / dense**: one forward of the prompt (``logits_to_keep=1``: what answering costs), dense
  and under the scheduler, on the run's clock (one thread: this thread's CPU time, else elapsed), in
  two protocols, so the measurement's own effect is visible:
  ``paired``  each scheduled forward between two dense forwards, the median over ``--repeats`` of its
              time over the mean of its two neighbours (how the run measures);
  ``rounds``  dense and every budget round-robin, ``--repeats`` rounds after one warm-up, median over
              median (a plain interleaved benchmark).

It prints, per budget, the accuracy here and in the report, and the share of inputs within the budget
(strict, and counting the dense plan as met at a budget ≥ 1) under both protocols; a JSON summary goes
to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?", help="a `mechkit adapt` output directory (required)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test, not a measurement: run a tiny `mechkit adapt` here and reproduce that")
    ap.add_argument("--model", default=None, help="model to load (default: the report's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts per task (default: all)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.run, args.repeats = quick_run(), 1
    if args.run is None:
        ap.error("RUN_DIR is required (or --quick)")
    return args


def quick_run() -> Path:
    """A tiny ``mechkit adapt`` run (``tiny:llama``, two budgets, a few prompts) to reproduce for ``--quick``."""
    import tempfile

    import mechkit as mk

    out = Path(tempfile.mkdtemp(prefix="adapt-reproduce-quick-")) / "run"
    mk.run("adapt", model="tiny:llama", tasks="capitalize,past-tense", budgets="0.7,1.0", calib=3, n=2, shots=1,
           token_layers="0", token_keep="0.5", signal_layer=0, repeats=1, prune_budgets="", margin=0.05, out=out)
    return out


def main() -> None:
    args = parse()
    import torch

    torch.set_num_threads(args.threads)
    import mechkit as mk
    from mechkit.adapt import AdaptStudy, Scheduler, adaptive

    report = json.loads((args.run / "report.json").read_text())
    params, results = report["params"], report["results"]
    sched = Scheduler.load(args.run / "scheduler.json")
    model_name = args.model or report["model"]["spec"]
    m = mk.load_model(model_name)
    tasks = results["tasks"]
    study = AdaptStudy(m, tasks, n_calib=params["calib"], n=params["n"], shots=params["shots"], seed=report["seed"],
                       timing_prompts=params["timing_prompts"], margin_prompts=params["margin_prompts"], margin=0.0,
                       signal_layer=params["signal_layer"], token_options=())  # only the prompts are used
    prompts = [(t, p) for t in tasks for p in study.test[t][:args.prompts]]
    budgets = [r["budget"] for r in results["rows"]]
    clock = time.thread_time if args.threads == 1 and m.device.type == "cpu" else time.perf_counter
    tok, model = m.tokenizer, m.model
    print(f"{len(prompts)} held-out prompts, budgets {budgets}, clock {clock.__name__}, repeats {args.repeats}",
          file=sys.stderr)

    def forward(ids) -> float:
        start = clock()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return clock() - start

    def scheduled(ids, budget) -> tuple[float, bool]:
        with adaptive(m, budget=budget, scheduler=sched) as run:
            seconds = forward(ids)
        return seconds, run.decisions[-1].plan.is_dense

    def correct(p, budget) -> bool:
        ids = tok(p.text, return_tensors="pt")["input_ids"].to(m.device)
        targets = [a + p.terminator for a in (p.accepted or [p.answer])]
        n_new = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in targets) + 1
        with adaptive(m, budget=budget, scheduler=sched), torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        text = tok.decode(out[0, ids.shape[1]:])
        return any(text.startswith(t) for t in targets)

    rows = {b: {"paired": [], "rounds": [], "dense_plan": [], "correct": {t: [] for t in tasks}} for b in budgets}
    gc.disable()
    try:
        for k, (task, p) in enumerate(prompts):
            ids = tok(p.text, return_tensors="pt")["input_ids"].to(m.device)
            for b in budgets:
                rows[b]["correct"][task].append(correct(p, b))
            # paired: D A D per budget and round
            ratios: dict[float, list[float]] = {b: [] for b in budgets}
            dense_plan: dict[float, bool] = {}
            forward(ids)
            for _ in range(args.repeats):
                before = forward(ids)
                for b in budgets:
                    s, dense_plan[b] = scheduled(ids, b)
                    after = forward(ids)
                    ratios[b].append(s / ((before + after) / 2))
                    before = after
            # rounds: D A_0.5 … A_1.0, round 0 warms up
            times: dict[object, list[float]] = {"dense": [], **{b: [] for b in budgets}}
            for rnd in range(args.repeats + 1):
                t = forward(ids)
                if rnd:
                    times["dense"].append(t)
                for b in budgets:
                    t, _ = scheduled(ids, b)
                    if rnd:
                        times[b].append(t)
            dense = statistics.median(times["dense"])
            for b in budgets:
                rows[b]["paired"].append(statistics.median(ratios[b]))
                rows[b]["rounds"].append(statistics.median(times[b]) / dense)
                rows[b]["dense_plan"].append(dense_plan[b])
            print(f"  {k + 1}/{len(prompts)} {task}", file=sys.stderr)
    finally:
        gc.enable()

    summary = {"run": str(args.run), "prompts": len(prompts), "repeats": args.repeats, "clock": clock.__name__,
               "budgets": []}
    reported = {r["budget"]: r for r in results["rows"]}
    print(f"{'budget':>6} {'acc here':>8} {'report':>6} | {'paired: median':>14} {'max':>5} {'strict':>6} "
          f"{'dense=met':>9} | {'rounds: median':>14} {'max':>5} {'strict':>6} {'dense=met':>9}")
    for b in budgets:
        r = rows[b]
        acc = statistics.mean(statistics.mean(v) for v in r["correct"].values() if v)
        line = {"budget": b, "accuracy": acc, "report_accuracy": reported[b]["adaptive"]["mean_accuracy"]}
        cells = []
        for proto in ("paired", "rounds"):
            x = r[proto]
            strict = sum(v <= b for v in x) / len(x)
            met = sum(v <= b or (d and b >= 1.0) for v, d in zip(x, r["dense_plan"], strict=True)) / len(x)
            line[proto] = {"median": statistics.median(x), "max": max(x), "strict": strict, "dense_met": met}
            cells.append(f"{statistics.median(x):14.3f} {max(x):5.2f} {strict:6.2f} {met:9.2f}")
        summary["budgets"].append(line)
        print(f"{b:6.2f} {acc:8.2f} {line['report_accuracy']:6.2f} | {cells[0]} | {cells[1]}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
