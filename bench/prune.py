"""Pruning: held-out accuracy vs measured speedup for every guide, with and without reconstruction.

One :class:`mechkit.pruning.PruneStudy` on the embedded model (CPU), exactly what ``mechkit prune``
measures: for each guide × sparsity × reconstruction a physical sliced copy is measured against
the dense model on the same inputs — exact-match accuracy on held-out prompts of each task
(calibration prompts use another seed), perplexity on held-out text (CPython reference topics that
no calibration read), parameters, FLOPs per token, and forward latency as the median of
interleaved runs (``speedup`` = dense median / pruned median on the same padded batch; last-position
logits and all logits). Reconstruction is ``none``, ``mean`` (calibration-mean bias), ``lsq-seq``
(ridge least squares, layer by layer on the pruned model's own inputs) or ``lsq-once`` (least
squares on dense activations); calibration mixes task prompts with generic text at
``--calib-text-weight``. Then it saves the model that comes closest to the first aim (with the
held-out prompts, ``heldout.json``) to ``--save-dir``, reloads it with :func:`mechkit.load_model`
(teacher-forced accuracy must equal the row's), and runs ``prune_reproduce.py`` in a fresh process:
a transformers-only rebuild of the saved tensors (its logits must equal mechkit's), greedy
decoding and its own timing — what a user measures. Writes the table, the aims, the
accuracy-vs-speedup plot and ``bench/results/prune.json``.

    python bench/prune.py [--quick] [--threads N] [--guides attribution,wanda,magnitude,random]
                          [--sparsity 0.2,0.45] [--target neurons] [--reconstruct mean,lsq-once,lsq-seq]
                          [--calib-text-weight 0.5] [--guide-text-weight 0.5] [--ridge 1e-2] [--plot PNG]

Finished steps (dense measures, scores, rows) are kept per configuration under
``bench/results/prune-steps/``, so adding a guide or a level measures only the new rows
(``--fresh`` measures all again). Pin ``--threads`` on a shared machine; the quoted ratios are only
as quiet as the machine.
"""

from __future__ import annotations

from pathlib import Path

import common

AIM_SPEEDUP, AIM_ACCURACY, AIM_PPL = 1.3, 0.90, 1.3


def _recon(r: dict) -> str:
    """``none``, ``mean``, ``lsq-seq`` or ``lsq-once`` (the study's label without the ridge)."""
    method = r["reconstruct"].split(" ")[0]
    return "lsq-once" if method == "lsq" else method


def _label(r: dict) -> str:
    return f"{r['guide']} +{_recon(r)}"


def _level_speedup(rows: list[dict]) -> dict[str, float]:
    """Per sparsity level, the median last-position speedup of its rows. Every row of a level has the
    same widths in total (same parameters and FLOPs; only the layers they come from differ), so the
    median over its rows is the level's speed with less timing noise than any one row's."""
    import statistics

    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(_level(r["sparsity"]), []).append(r["speedup"])
    return {lv: statistics.median(v) for lv, v in by.items()}


def _closest(rows: list[dict]) -> dict:
    """The row closest to aim 1: the most accurate at a level whose median speedup reaches the aim
    (else at the fastest level)."""
    speed = _level_speedup(rows)
    fast = [r for r in rows if speed[_level(r["sparsity"])] >= AIM_SPEEDUP]
    fastest = max(speed.values())
    pool = fast or [r for r in rows if speed[_level(r["sparsity"])] == fastest]
    return max(pool, key=lambda r: (r["mean_accuracy"], r["speedup"]))


def _aims(rows: list[dict], dense: dict, guides: list[str], baselines: tuple[str, ...]) -> list[str]:
    """The issue's three aims, each met or not, with the closest row."""
    acc0, ppl0 = max(dense["mean_accuracy"], 1e-9), dense["perplexity"]
    speed = _level_speedup(rows)
    best = _closest(rows)
    level = _level(best["sparsity"])
    met = speed[level] >= AIM_SPEEDUP and best["mean_accuracy"] >= AIM_ACCURACY * acc0
    out = [f"aim 1 (≥{AIM_SPEEDUP}× last-position at ≥{AIM_ACCURACY:.2f} of dense accuracy): "
           f"{'MET' if met else 'not met'}; closest: {_label(best)} {level}: {best['mean_accuracy'] / acc0:.3f} of "
           f"dense at {best['speedup']:.2f}× (median of the {level} rows {speed[level]:.2f}×)"]
    at20 = [r for r in rows if r["sparsity"].get("neurons") == 0.2 and len(r["sparsity"]) == 1]
    if at20 and ppl0:
        best = min(at20, key=lambda r: r["perplexity"] or float("inf"))
        ratio = (best["perplexity"] or float("inf")) / ppl0
        out.append(f"aim 2 (20% of MLP channels, held-out perplexity ≤{AIM_PPL}× dense): "
                   f"{'MET' if ratio <= AIM_PPL else 'not met'}; lowest: {_label(best)} ppl {ratio:.2f}× dense")
    guided = [g for g in guides if g.split("@")[0] not in baselines]
    for method in sorted({_recon(r) for r in rows}):
        for level in sorted({_level(r["sparsity"]) for r in rows}):
            at = {r["guide"]: r["mean_accuracy"] for r in rows if _recon(r) == method
                  and _level(r["sparsity"]) == level}
            base = {g: a for g, a in at.items() if g.split("@")[0] in baselines}
            ours = {g: a for g, a in at.items() if g in guided}
            if base and ours:
                g, a = max(ours.items(), key=lambda kv: kv[1])
                b, ab = max(base.items(), key=lambda kv: kv[1])
                out.append(f"aim 3 at {level}, {method}: {g} {a:.3f} vs best baseline {b} {ab:.3f} "
                           f"({'beats' if a > ab else 'ties' if a == ab else 'LOSES'})")
    return out


def _ppl(value: float | None) -> str:
    return "overflow" if value is None else f"{value:.1f}"


def _level(sparsity: dict) -> str:
    return ",".join(f"{k}={v:.2f}" for k, v in sparsity.items())


def _levels(text: str, targets: list[str]) -> list[dict[str, float]]:
    """``--sparsity``: levels separated by ``;``, each as ``mechkit prune --sparsity`` reads it
    (``0.2,0.45`` is two levels; ``neurons=0.4,heads=0.33`` one)."""
    from mechkit import pruning

    return [lv for part in text.split(";") if part.strip() for lv in pruning.parse_levels(part, targets)]


class StepCache:
    """Finished steps of the study (dense measures, scores, rows) kept in one JSON file per
    configuration, so a rerun with more guides or levels measures only what is new. Every value in
    it was measured by an earlier run of the same configuration; ``--fresh`` measures everything."""

    def __init__(self, path, fresh: bool, mix: str):
        import json

        self.path, self.mix = path, mix
        self.data = {} if fresh or not path.exists() else json.loads(path.read_text())

    def __call__(self, key: str, compute):
        import json

        if key.startswith(("row|", "scores|", "sensitivity|")):  # these depend on the calibration mix
            key = f"{key}|{self.mix}"
        if key not in self.data:
            self.data[key] = json.loads(json.dumps(compute(), default=common._jsonable))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)
        return self.data[key]


def _cache_path(args, model: str, calib: int, n: int, shots: int):
    import hashlib

    config = [model, args.tasks, calib, n, shots, args.allocation, args.repeats, args.timing_batch, args.threads]
    return common.RESULTS / "prune-steps" / (hashlib.sha256(repr(config).encode()).hexdigest()[:16] + ".json")


def _reproduce(study, handle, chosen: dict, save_dir, args) -> dict:
    """Save ``chosen``'s model and the held-out prompts, reload it through mechkit, then run
    ``prune_reproduce.py`` (transformers and torch only) on it in a fresh process."""
    import json
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path

    import torch

    import mechkit as mk
    from mechkit.eval.evaluation import evaluate

    if save_dir.exists():
        shutil.rmtree(save_dir)
    study.sequential = "-seq" in chosen["reconstruct"]  # rebuilt as the row was measured
    start = time.perf_counter()
    study.save(chosen, save_dir)
    save_s = time.perf_counter() - start
    held = {"prompts": {t: [{"text": q.text, "answer": q.answer, "terminator": getattr(q, "terminator", "\n")}
                            for q in ps] for t, ps in study.test.items()},
            "timing_texts": study.timing_texts}
    (save_dir / "heldout.json").write_text(json.dumps(held, indent=1))
    again = mk.load_model(str(save_dir))
    teacher = {t: m["accuracy"] for t, m in evaluate(again, study.test).items()}
    sys.path.insert(0, str(Path(__file__).parent))
    from prune_reproduce import rebuild

    ids = again.to_tokens(study.timing_texts)
    with torch.no_grad():  # the transformers-only rebuild is the model mk.load_model gives
        diff = float((rebuild(save_dir)(input_ids=ids).logits - again(ids)).abs().max())
    del again
    script = Path(__file__).with_name("prune_reproduce.py")
    dense_dir = handle.source
    if dense_dir is None:  # a model built in memory (--quick): give the script a plain HF directory
        dense_dir = save_dir.with_name(save_dir.name + "-dense")
        handle.model.save_pretrained(dense_dir)
    cmd = [sys.executable, str(script), str(save_dir), "--dense", str(dense_dir), "--repeats", str(args.repeats * 2)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    independent = json.loads(run.stdout)
    return {"row": f"{_label(chosen)} {_level(chosen['sparsity'])}", "saved_to": str(save_dir),
            "rebuild_and_save_s": save_s, "command": " ".join(cmd[1:]),
            "mechkit_reloaded_teacher_forced": teacher, "rebuild_vs_mechkit_max_logit_diff": diff, "row_accuracy": chosen["accuracy"],
            "row_accuracy_ratio": chosen["mean_accuracy"] / max(study.dense()["mean_accuracy"], 1e-9),
            "row_speedup_last": chosen["speedup"], "row_speedup_all": chosen["speedup_other_timing"],
            "independent": independent}


def _plot(rows: list[dict], dense: dict, tasks: list[str], model: str, path: Path) -> None:
    """Accuracy (relative to dense) against last-position speedup: one colour per guide, solid with
    least squares, dashed without; the aim's corner shaded."""
    from mechkit.report import xy_plot

    acc0 = max(dense["mean_accuracy"], 1e-9)
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        xs, ys = series.setdefault(_label(r), ([], []))
        xs.append(r["speedup"])
        ys.append(r["mean_accuracy"] / acc0)
    name = {"llama": "SmolLM2-135M"}.get(model, model)
    fig = xy_plot(series, f"Pruning {name}: held-out accuracy vs speedup", "forward speedup over dense, "
                  "last position (×)", f"mean accuracy / dense ({len(tasks)} tasks)", reference=(1.0, 1.0))
    ax = fig.axes[0]
    guides = list(dict.fromkeys(r["guide"] for r in rows))
    colours = {g: f"C{i}" for i, g in enumerate(guides)}
    for line in ax.get_lines():
        guide, _, method = line.get_label().partition(" +")
        if guide in colours:
            line.set_color(colours[guide])
            line.set_linestyle("-" if method.startswith("lsq") else "--")
    right = max(ax.get_xlim()[1], AIM_SPEEDUP + 0.05)
    ax.fill_between([AIM_SPEEDUP, right], AIM_ACCURACY, max(ax.get_ylim()[1], 1.02), color="green", alpha=0.08,
                    label=f"aim: ≥{AIM_SPEEDUP}× at ≥{AIM_ACCURACY:.2f}")
    ax.set_xlim(right=right)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--guides", default="attribution,wanda,magnitude,random")
    p.add_argument("--target", default="neurons")
    p.add_argument("--sparsity", default="0.2,0.45", help="levels; ';' separates mixed ones "
                                                           "(0.2,0.45;neurons=0.4,heads=0.33)")
    p.add_argument("--tasks", default="capitalize,past-tense,country-capital")
    p.add_argument("--n", type=int, default=None, help="held-out prompts per task (default 30; quick 3)")
    p.add_argument("--calib", type=int, default=None, help="calibration prompts per task (default 16; quick 3)")
    p.add_argument("--allocation", default="global")
    p.add_argument("--reconstruct", default="mean,lsq-once", help="comma list of none, mean, lsq (one-shot unless "
                                                                  "--sequential), lsq-seq, lsq-once")
    p.add_argument("--sequential", action="store_true", help="lsq: sequential fits (default: one-shot)")
    p.add_argument("--ridge", type=float, default=1e-2)
    p.add_argument("--calib-text-weight", type=float, default=0.5, help="generic text in statistics and fits")
    p.add_argument("--guide-text-weight", type=float, default=0.5, help="generic text in the gradient guides' scores")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timing-batch", type=int, default=8, help="prompts in the timed batch")
    p.add_argument("--plot", type=Path, default=None, help="the figure (default: beside the JSON, .png)")
    p.add_argument("--save-dir", type=Path, default=common.RESULTS / "prune-model",
                   help="where the model closest to the aim is saved, with its held-out prompts")
    p.add_argument("--fresh", action="store_true", help="measure every step again (default: reuse this "
                                                        "configuration's finished steps)")
    p.add_argument("--no-save", action="store_true", help="skip saving, reloading and re-measuring a model")
    p.add_argument("--replot", type=Path, default=None, help="only draw --plot from this earlier JSON output")
    args = p.parse_args()
    if args.replot:
        import json

        done = json.loads(args.replot.read_text())
        _plot(done["rows"], done["dense"], done["args"]["tasks"].split(","), done["args"]["model"],
              args.plot or args.replot.with_suffix(".png"))
        return
    n = args.n or (3 if args.quick else 30)
    calib = args.calib or (3 if args.quick else 16)
    shots = 2 if args.quick else 10
    model = "tiny:llama" if args.quick else args.model

    common.go_offline()
    threads = common.set_threads(args.threads)
    import resource
    import time

    import mechkit as mk
    from mechkit import pruning

    handle = mk.load_model(model)
    common.prefault(handle)
    tasks = args.tasks.split(",")
    guides = pruning.parse_guides(args.guides)
    targets = pruning.parse_targets(args.target)
    levels = _levels(args.sparsity, targets)
    methods = args.reconstruct.split(",")
    cache = StepCache(_cache_path(args, model, calib, n, shots), args.fresh,
                      f"calib_text={args.calib_text_weight}|guide_text={args.guide_text_weight}")
    wall = time.perf_counter()
    start = time.perf_counter()
    study = pruning.PruneStudy(handle, tasks, targets=targets, n_calib=calib, n=n, shots=shots,
                               allocation=args.allocation, reconstruct=methods[-1].split("-")[0], sequential=args.sequential,
                               ridge=args.ridge, text_weight=args.calib_text_weight,
                               guide_text_weight=args.guide_text_weight, repeats=args.repeats,
                               timing_batch=args.timing_batch, step=cache)
    t_calib = time.perf_counter() - start
    print(f"calibration: {len(study.calib.prompts)} task prompts + {len(study.calib.generic)} generic text chunks "
          f"(weight {args.calib_text_weight}), {study.calib.stats.n_tokens} tokens, {t_calib:.0f} s; "
          f"steps cached in {cache.path}", flush=True)
    dense = dict(study.dense())
    dense.update(latency_s=cache("dense_latency", study.dense_latency))
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
            for method in methods:  # lsq-once: one-shot fits on dense activations; lsq-seq: sequential
                if method.startswith("lsq"):
                    study.sequential = method == "lsq-seq" or (method == "lsq" and args.sequential)
                r = study.row(g, level, method.split("-")[0])
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
        table.append((r["guide"], _recon(r), _level(r["sparsity"]),
                      *[f"{r['accuracy'][t]:.2f}" for t in tasks], f"{r['mean_accuracy']:.3f}",
                      f"{r['mean_accuracy'] / max(acc0, 1e-9):.3f}", f"{_ppl(r['perplexity'])}",
                      f"{(r['perplexity'] or float('inf')) / ppl0:.2f}", f"{r['params'] / 1e6:.1f}",
                      f"{r['flops_per_token'] / 1e6:.0f}", f"{r['speedup']:.2f}", f"{r['speedup_other_timing']:.2f}",
                      f"{r['reconstruct_s']:.0f}"))
    print(common.table(table, ("guide", "recon", "sparsity", *tasks, "mean acc", "acc/dense", "ppl", "ppl/dense",
                               "params M", "MFLOPs/tok", "speedup× (last)", "speedup× (all)", "recon s")))
    print(f"sweep wall time {sweep_s:.0f} s ({len(rows)} pruned models: calibration, scores, reconstruction, "
          f"slicing, evaluation, timing; steps finished by an earlier run of this configuration are reused)")
    aims = _aims(rows, dense, guides, ("random", "magnitude", "wanda", "flap"))
    print("\n".join(aims))

    plot = args.plot or (args.out or common.RESULTS / "prune.json").with_suffix(".png")
    _plot(rows, dense, tasks, model, plot)

    data = {"environment": common.environment(threads), "args": vars(args), "dense": dense, "rows": rows,
            "aims": aims, "sweep_s": sweep_s, "calibration_s": t_calib, "scores_s": t_scores,
            "heldout_text": study.text_source, "plot": plot, "step_cache": cache.path}
    if not args.no_save:  # what a user gets: the saved model, reloaded, measured their way
        chosen = _closest(rows)
        check = _reproduce(study, handle, chosen, args.save_dir, args)
        data["reloaded"] = check
        ind = check["independent"]
        same = all(abs(check["mechkit_reloaded_teacher_forced"][t] - chosen["accuracy"][t]) < 1e-9 for t in tasks)
        greedy_same = all(abs(ind["greedy_accuracy"]["pruned"][t] - chosen["accuracy"][t]) < 1e-9 for t in tasks)
        print(f"saved {check['row']} to {check['saved_to']} (rebuilt and saved in {check['rebuild_and_save_s']:.0f} s); "
              f"mk.load_model: accuracy {'identical to the row' if same else 'DIFFERS from the row'}, "
              f"logits within {check['rebuild_vs_mechkit_max_logit_diff']:.1e} of the transformers-only rebuild; "
              f"transformers-only rebuild, greedy decoding: {ind['greedy_accuracy']['pruned']} "
              f"({'identical to the row' if greedy_same else 'DIFFERS from the row'}), "
              f"{ind['accuracy_ratio']:.3f} of dense (row {check['row_accuracy_ratio']:.3f}); own timing: "
              f"speedup {ind['speedup_last']:.2f}× last / {ind['speedup_all']:.2f}× all "
              f"(row {check['row_speedup_last']:.2f}× / {check['row_speedup_all']:.2f}×)")
    data["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("wrote", common.write_json("prune", data, args.out), "and", plot)


if __name__ == "__main__":
    main()
