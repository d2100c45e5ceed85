"""Pruning: held-out accuracy vs measured speedup for every guide, with and without reconstruction.

One :class:`mechkit.pruning.PruneStudy` on the embedded model (CPU), exactly what ``mechkit prune``
measures: for each guide × reconstruction × sparsity a physical sliced copy is measured against
the dense model on the same inputs — exact-match accuracy on held-out prompts of each task
(calibration prompts use another seed), perplexity on held-out text (CPython reference topics that
no calibration read), parameters, FLOPs per token, and forward latency as the median of
interleaved runs (``speedup`` = dense median / pruned median on the same padded batch; last-position
logits and all logits). Reconstruction is ``mean`` (calibration-mean bias) or ``lsq`` (ridge least
squares, sequential by default), calibration mixes task prompts with generic text at
``--calib-text-weight``. Then it saves the pruned model that comes closest to the aim, reloads it
with :func:`mechkit.load_model`, and checks a user's measurement of it — held-out accuracy by greedy
decoding, their own timing — gives the row's figures. Writes the table, the aims and the
accuracy-vs-speedup plot (``bench/results/prune.png``) as well as ``bench/results/prune.json``.

    python bench/prune.py [--quick] [--threads N] [--guides combined,attribution,wanda,magnitude,random]
                          [--sparsity 0.2,0.3,0.45] [--target neurons] [--reconstruct mean,lsq]
                          [--calib-text-weight 0.5] [--guide-text-weight 0.5] [--ridge 1e-2] [--one-shot]

Pin ``--threads`` on a shared machine; the quoted ratios are only as quiet as the machine.
"""

from __future__ import annotations

import common

AIM_SPEEDUP, AIM_ACCURACY, AIM_PPL = 1.3, 0.90, 1.3


def _label(r: dict) -> str:
    return f"{r['guide']} +{r['reconstruct'].split(' ')[0]}"


def _aims(rows: list[dict], dense: dict, guides: list[str], baselines: tuple[str, ...]) -> list[str]:
    """The issue's three aims, each met or not, with the closest row."""
    acc0, ppl0 = max(dense["mean_accuracy"], 1e-9), dense["perplexity"]
    out = []
    fast = [r for r in rows if r["speedup"] >= AIM_SPEEDUP]
    good = [r for r in fast if r["mean_accuracy"] >= AIM_ACCURACY * acc0]
    best = max(fast or rows, key=lambda r: (r["mean_accuracy"], r["speedup"]))
    out.append(f"aim 1 (≥{AIM_SPEEDUP}× last-position at ≥{AIM_ACCURACY:.2f} of dense accuracy): "
               f"{'MET' if good else 'not met'}; best at ≥{AIM_SPEEDUP}×: " if fast else
               f"aim 1: not met, no row reaches {AIM_SPEEDUP}×; most accurate: ")
    out[-1] += (f"{_label(best)} {_level(best['sparsity'])}: {best['mean_accuracy'] / acc0:.3f} of dense at "
                f"{best['speedup']:.2f}×")
    at20 = [r for r in rows if r["sparsity"].get("neurons") == 0.2 and len(r["sparsity"]) == 1]
    if at20 and ppl0:
        best = min(at20, key=lambda r: r["perplexity"] or float("inf"))
        ratio = (best["perplexity"] or float("inf")) / ppl0
        out.append(f"aim 2 (20% of MLP channels, held-out perplexity ≤{AIM_PPL}× dense): "
                   f"{'MET' if ratio <= AIM_PPL else 'not met'}; lowest: {_label(best)} ppl {ratio:.2f}× dense")
    guided = [g for g in guides if g.split("@")[0] not in baselines]
    for method in sorted({r["reconstruct"] for r in rows}):
        for level in sorted({_level(r["sparsity"]) for r in rows}):
            at = {r["guide"]: r["mean_accuracy"] for r in rows if r["reconstruct"] == method
                  and _level(r["sparsity"]) == level}
            base = {g: a for g, a in at.items() if g.split("@")[0] in baselines}
            ours = {g: a for g, a in at.items() if g in guided}
            if base and ours:
                g, a = max(ours.items(), key=lambda kv: kv[1])
                b, ab = max(base.items(), key=lambda kv: kv[1])
                out.append(f"aim 3 at {level}, {method.split(' ')[0]}: {g} {a:.3f} vs best baseline {b} {ab:.3f} "
                           f"({'beats' if a > ab else 'ties' if a == ab else 'LOSES'})")
    return out


def _ppl(value: float | None) -> str:
    return "overflow" if value is None else f"{value:.1f}"


def _level(sparsity: dict) -> str:
    return ",".join(f"{k}={v:.2f}" for k, v in sparsity.items())


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--guides", default="combined,attribution,wanda,magnitude,random")
    p.add_argument("--target", default="neurons")
    p.add_argument("--sparsity", default="0.2,0.3,0.45")
    p.add_argument("--tasks", default="capitalize,past-tense,country-capital")
    p.add_argument("--n", type=int, default=None, help="held-out prompts per task (default 30; quick 3)")
    p.add_argument("--calib", type=int, default=None, help="calibration prompts per task (default 16; quick 3)")
    p.add_argument("--allocation", default="global")
    p.add_argument("--reconstruct", default="mean,lsq", help="comma list of none, mean, lsq")
    p.add_argument("--one-shot", action="store_true", help="lsq fits on dense activations (default: sequential)")
    p.add_argument("--ridge", type=float, default=1e-2)
    p.add_argument("--calib-text-weight", type=float, default=0.5, help="generic text in statistics and fits")
    p.add_argument("--guide-text-weight", type=float, default=0.5, help="generic text in the gradient guides' scores")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timing-batch", type=int, default=8, help="prompts in the timed batch")
    p.add_argument("--no-save", action="store_true", help="skip saving, reloading and re-measuring a model")
    args = p.parse_args()
    n = args.n or (3 if args.quick else 30)
    calib = args.calib or (3 if args.quick else 16)
    shots = 2 if args.quick else 10
    model = "tiny:llama" if args.quick else args.model

    common.go_offline()
    threads = common.set_threads(args.threads)
    import tempfile
    import time
    from pathlib import Path

    import mechkit as mk
    from mechkit import pruning
    from mechkit.eval.evaluation import evaluate
    from mechkit.eval.scoring import greedy_exact_match
    from mechkit.pruning.cost import latency

    handle = mk.load_model(model)
    common.prefault(handle)
    tasks = args.tasks.split(",")
    guides = pruning.parse_guides(args.guides)
    targets = pruning.parse_targets(args.target)
    levels = pruning.parse_levels(args.sparsity, targets)
    methods = args.reconstruct.split(",")
    wall = time.perf_counter()
    start = time.perf_counter()
    study = pruning.PruneStudy(handle, tasks, targets=targets, n_calib=calib, n=n, shots=shots,
                               allocation=args.allocation, reconstruct=methods[-1], sequential=not args.one_shot,
                               ridge=args.ridge, text_weight=args.calib_text_weight,
                               guide_text_weight=args.guide_text_weight, repeats=args.repeats,
                               timing_batch=args.timing_batch)
    t_calib = time.perf_counter() - start
    print(f"calibration: {len(study.calib.prompts)} task prompts + {len(study.calib.generic)} generic text chunks "
          f"(weight {args.calib_text_weight}), {study.calib.stats.n_tokens} tokens, {t_calib:.0f} s", flush=True)
    dense = study.dense()
    dense.update(latency_s=study.dense_latency())
    print(f"dense: acc {dense['mean_accuracy']:.3f} {dense['accuracy']} ppl {_ppl(dense['perplexity'])}", flush=True)
    t_scores: dict[str, float] = {}
    for g in guides:
        start = time.perf_counter()
        study.scores(g.split("@")[0])
        t_scores[g] = time.perf_counter() - start
    print("scores: " + ", ".join(f"{g} {t:.0f} s" for g, t in t_scores.items()), flush=True)
    rows = []
    for g in guides:
        for level in levels:
            for method in methods:
                r = study.row(g, level, method)
                rows.append(r)
                print(f"  {_label(r):24s} {_level(level):22s} acc {r['mean_accuracy']:.3f} ppl {_ppl(r['perplexity'])} "
                      f"speedup {r['speedup']:.2f}/{r['speedup_other_timing']:.2f} recon {r['reconstruct_s']:.0f} s",
                      flush=True)
    sweep_s = time.perf_counter() - wall
    acc0, ppl0 = dense["mean_accuracy"], dense["perplexity"] or float("nan")
    table = [("dense", "-", "-", *[f"{dense['accuracy'][t]:.2f}" for t in tasks], f"{acc0:.3f}", "1.000",
              f"{ppl0:.1f}", "1.00", f"{dense['params'] / 1e6:.1f}", f"{dense['flops_per_token'] / 1e6:.0f}",
              "1.00", "1.00", "-")]
    for r in rows:
        table.append((r["guide"], r["reconstruct"].split(" ")[0], _level(r["sparsity"]),
                      *[f"{r['accuracy'][t]:.2f}" for t in tasks], f"{r['mean_accuracy']:.3f}",
                      f"{r['mean_accuracy'] / max(acc0, 1e-9):.3f}", f"{_ppl(r['perplexity'])}",
                      f"{(r['perplexity'] or float('inf')) / ppl0:.2f}", f"{r['params'] / 1e6:.1f}",
                      f"{r['flops_per_token'] / 1e6:.0f}", f"{r['speedup']:.2f}", f"{r['speedup_other_timing']:.2f}",
                      f"{r['reconstruct_s']:.0f}"))
    print(common.table(table, ("guide", "recon", "sparsity", *tasks, "mean acc", "acc/dense", "ppl", "ppl/dense",
                               "params M", "MFLOPs/tok", "speedup× (last)", "speedup× (all)", "recon s")))
    print(f"sweep wall time {sweep_s:.0f} s ({len(rows)} pruned models: calibration, scores, reconstruction, "
          f"slicing, evaluation, timing)")
    aims = _aims(rows, dense, guides, ("random", "magnitude", "wanda", "flap"))
    print("\n".join(aims))

    from mechkit.report import xy_plot

    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        xs, ys = series.setdefault(_label(r), ([], []))
        xs.append(r["speedup"])
        ys.append(r["mean_accuracy"])
    fig = xy_plot(series, f"Held-out accuracy vs measured speedup ({', '.join(tasks)})",
                  "forward speedup over dense, last position (×)", "mean exact-match accuracy",
                  reference=(1.0, acc0))
    plot = (args.out or common.RESULTS / "prune.json").with_suffix(".png")
    plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot, dpi=110)

    data = {"environment": common.environment(threads), "args": vars(args), "dense": dense, "rows": rows,
            "aims": aims, "sweep_s": sweep_s, "calibration_s": t_calib, "scores_s": t_scores,
            "heldout_text": study.text_source, "plot": plot}
    if not args.no_save:  # what a user gets: the saved model, reloaded, measured their way
        fast = [r for r in rows if r["speedup"] >= AIM_SPEEDUP] or rows
        chosen = max(fast, key=lambda r: (r["mean_accuracy"], r["speedup"]))
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            saved = study.save(chosen, Path(tmp) / "model")
            save_s = time.perf_counter() - start
            again = mk.load_model(str(saved))
            acc = evaluate(again, study.test)
            greedy = {t: sum(greedy_exact_match(again, ps)) / len(ps) for t, ps in study.test.items()}
            dense_t, again_t = latency([handle, again], study.timing_texts, repeats=args.repeats, last=True)
        check = {"row": f"{_label(chosen)} {_level(chosen['sparsity'])}", "rebuild_and_save_s": save_s,
                 "teacher_forced": {t: acc[t]["accuracy"] for t in tasks}, "greedy": greedy,
                 "row_accuracy": chosen["accuracy"], "speedup_reloaded": dense_t / again_t,
                 "speedup_row": chosen["speedup"]}
        data["reloaded"] = check
        same = all(abs(check["teacher_forced"][t] - chosen["accuracy"][t]) < 1e-9 for t in tasks)
        print(f"saved + reloaded {check['row']} (rebuilt and saved in {save_s:.0f} s): accuracy "
              f"{'identical to the row' if same else 'DIFFERS from the row'} (greedy decoding {greedy}); "
              f"speedup measured again {check['speedup_reloaded']:.2f}× (row {chosen['speedup']:.2f}×)")
    print("wrote", common.write_json("prune", data, args.out), "and", plot)


if __name__ == "__main__":
    main()
