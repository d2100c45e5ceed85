"""Head detection: mechkit ``head_scores`` vs a plain forward, TransformerLens and nnsight.

Same tokens for every method: ``repeated_tokens(handle, n_seqs, seg_len, seed=0)`` (random
tokens, a segment repeated twice), run in batches of ``--batch-size`` (16 by default: all 50
sequences at once would make TransformerLens' full cache several GB). Each method runs in a fresh
subprocess, so methods do not share memory, warm caches or attention settings:

- ``plain``: the HF model's forward over the batches (default attention kernel, full logits).
- ``mechkit``: ``head_scores`` (induction, previous-token, duplicate-token, per-position loss).
- ``tl``: TransformerLens 4.x ``TransformerBridge`` built offline around the same HF model;
  ``run_with_cache`` on each batch (everything cached, as ``detect_head`` does), then TL's own head
  detector (``transformer_lens.head_detector`` detection patterns and
  ``compute_head_attention_similarity_score``, per sequence and head, like ``detect_head``) plus
  the same stripe scores as mechkit computed from the cached patterns. ``detect_head`` itself takes
  strings and re-tokenizes them (random token ids do not survive a decode/encode round trip) and
  runs one sequence per forward, so its functions are called on the batched cache instead —
  which favours TL.
- ``tl-patterns``: the same, caching only ``hook_pattern`` (``names_filter``): TL used frugally.
- ``nnsight``: ``NNsight(model).trace`` reading each layer's attention weights
  (``self_attn.output[1]``, eager attention) and reducing them to the stripe scores inside the trace.

Time: the first run measures peak memory and doubles as the warm-up; then the median of
``--repeats`` runs. Peak memory: the peak RSS increase of the worker during that first run,
above its RSS after the model (and TL bridge / nnsight wrapper) is set up; the kernel's high-water
mark is reset first (Linux ``/proc/self/clear_refs``) so model loading does not hide it.

    python bench/detect.py [--quick] [--threads N] [--methods plain,mechkit,tl,tl-patterns,nnsight]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

METHODS = ("plain", "mechkit", "tl", "tl-patterns", "nnsight")
KINDS = ("induction", "previous-token", "duplicate-token")


# ---------------------------------------------------------------------------------------------
# Worker: one method, in a process of its own.


def _stripes(total: int, seg_len: int):
    """Query/key indices of the scores (the definition in mechkit.heads.scores' docstring)."""
    import torch

    offset = total - 2 * seg_len
    i = torch.arange(seg_len)
    queries = offset + seg_len + i  # positions in the second copy
    rows = torch.arange(1, total)
    return {"induction": (queries, offset + i + 1), "duplicate-token": (queries, offset + i),
            "previous-token": (rows, rows - 1)}


def _stripe_sums(pattern, stripes) -> dict:
    """Per kind, ``[n_heads]`` sums over the batch of the mean stripe attention per sequence."""
    p = pattern.float()
    return {k: p[:, :, q, kk].mean(dim=2).sum(dim=0).double().cpu() for k, (q, kk) in stripes.items()}


def _method(name: str, handle, tokens, seg_len: int, bs: int):
    """Setup for one method; returns ``run() -> (scores or None, phase times)``."""
    import numpy as np
    import torch

    n_layers, n_heads = handle.anatomy.n_layers, handle.anatomy.n_heads
    batches = [tokens[s:s + bs].to(handle.device) for s in range(0, len(tokens), bs)]  # bench/gpu.py: on CUDA
    stripes = _stripes(tokens.shape[1], seg_len)

    def finish(sums: dict) -> dict:
        return {k: (v / len(tokens)).numpy() for k, v in sums.items()}

    if name == "plain":
        def run():
            with torch.no_grad():
                for b in batches:
                    handle.model(input_ids=b, use_cache=False)
            return None, {}

        return run

    if name == "mechkit":
        from mechkit.heads.scores import head_scores

        def run():
            return head_scores(handle, tokens, seg_len, batch_size=bs).scores, {}

        return run

    if name in ("tl", "tl-patterns"):
        from transformer_lens.head_detector import (
            compute_head_attention_similarity_score,
            get_induction_head_detection_pattern,
            get_previous_token_head_detection_pattern,
        )

        bridge = common.tl_bridge(handle)
        only_patterns = name == "tl-patterns"

        def run():
            sums = {k: torch.zeros(n_layers, n_heads, dtype=torch.float64) for k in KINDS}
            det = {k: np.zeros((n_layers, n_heads)) for k in ("induction", "previous-token")}
            phase = {"run_with_cache_s": 0.0, "stripe_scores_s": 0.0, "head_detector_s": 0.0}
            with torch.no_grad():
                for b in batches:
                    t = time.perf_counter()
                    if only_patterns:
                        _, cache = bridge.run_with_cache(b, names_filter=lambda n: n.endswith("hook_pattern"))
                    else:
                        _, cache = bridge.run_with_cache(b)
                    phase["run_with_cache_s"] += time.perf_counter() - t
                    t = time.perf_counter()
                    for layer in range(n_layers):
                        for k, v in _stripe_sums(cache["pattern", layer], stripes).items():
                            sums[k][layer] += v
                    phase["stripe_scores_s"] += time.perf_counter() - t
                    if not only_patterns:  # TL's head detector, one sequence and head at a time
                        t = time.perf_counter()
                        for i in range(len(b)):
                            dets = {"induction": get_induction_head_detection_pattern(b[i]),
                                    "previous-token": get_previous_token_head_detection_pattern(b[i])}
                            for layer in range(n_layers):
                                pats = cache["pattern", layer][i]
                                for h in range(n_heads):
                                    for k, d in dets.items():
                                        det[k][layer, h] += compute_head_attention_similarity_score(
                                            pats[h], d, exclude_bos=False, exclude_current_token=False,
                                            error_measure="mul")
                        phase["head_detector_s"] += time.perf_counter() - t
                    del cache, _
            scores = finish(sums)
            if not only_patterns:
                scores.update({f"tl-detector {k}": v / len(tokens) for k, v in det.items()})
            return scores, phase

        return run

    if name == "nnsight":
        import warnings

        warnings.filterwarnings("ignore", module="nnsight")
        from nnsight import NNsight

        handle.model.set_attn_implementation("eager")  # SDPA returns no attention weights
        wrapped = NNsight(handle.model)

        def run():
            sums = {k: torch.zeros(n_layers, n_heads, dtype=torch.float64) for k in KINDS}
            with torch.no_grad():
                for b in batches:
                    saved = []
                    with wrapped.trace(input_ids=b, use_cache=False):
                        for layer in range(n_layers):
                            w = wrapped.model.layers[layer].self_attn.output[1]
                            p = w.float()
                            saved.append(torch.stack(
                                [p[:, :, q, kk].mean(dim=2).sum(dim=0) for q, kk in stripes.values()]).save())
                    for layer, s in enumerate(saved):
                        for j, k in enumerate(stripes):
                            sums[k][layer] += s[j].double().cpu()
            return finish(sums), {}

        return run

    raise SystemExit(f"unknown method {name!r}")


def worker(args) -> None:
    common.go_offline()
    t0 = time.perf_counter()
    threads = common.set_threads(args.threads)
    import mechkit as mk
    from mechkit.heads.scores import repeated_tokens

    handle = mk.load_model("llama")
    tokens = repeated_tokens(handle, n_seqs=args.n_seqs, seg_len=args.seg_len, seed=0)
    common.prefault(handle)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    run = _method(args.worker, handle, tokens, args.seg_len, args.batch_size)
    setup_s = time.perf_counter() - t1

    mem, (scores, _) = common.peak_rss_increase(run)  # first run: memory, and the warm-up
    times, phases = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        _, phase = run()
        times.append(time.perf_counter() - t)
        phases.append(phase)
    out = {
        "method": args.worker, "threads": threads, "tokens_shape": list(tokens.shape),
        "load_s": load_s, "setup_s": setup_s, "memory": mem,
        "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
        "phases_median_s": {k: statistics.median(p[k] for p in phases) for k in (phases[0] if phases else {})},
        "scores": {k: v.tolist() for k, v in (scores or {}).items()},
    }
    Path(args.worker_out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# Parent: one subprocess per method, then ratios and agreement.


def _run_worker(method: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", method, "--worker-out", str(out),
               "--n-seqs", str(args.n_seqs), "--seg-len", str(args.seg_len),
               "--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = {**os.environ, **common.OFFLINE_ENV}
        print(f"[detect] {method} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            print(f"[detect] {method} FAILED (rc {proc.returncode}):\n{tail}", file=sys.stderr)
            return {"method": method, "error": tail, "returncode": proc.returncode}
        data = json.loads(out.read_text())
        data["process_wall_s"] = wall
        print(f"[detect] {method}: median {data['median_s']:.3g}s, peak +{data['memory']['peak_increase_mib']:.0f} MiB",
              file=sys.stderr, flush=True)
        return data


def _ratio(a, b):
    return a / b if a is not None and b else None


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--n-seqs", type=int, default=None)
    p.add_argument("--seg-len", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None, help="timed runs after the warm-up (default 3)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    quick = args.quick
    args.n_seqs = args.n_seqs or (4 if quick else 50)
    args.seg_len = args.seg_len or (8 if quick else 25)
    args.batch_size = args.batch_size or (2 if quick else 16)
    args.repeats = args.repeats or (1 if quick else 3)
    if args.worker:
        worker(args)
        return

    import numpy as np

    from mechkit.heads.effects import spearman

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    res = {m: _run_worker(m, args) for m in methods}
    ok = {m: r for m, r in res.items() if "error" not in r}

    def t(m, key="median_s"):
        return ok[m][key] if m in ok else None

    def mem(m):
        return ok[m]["memory"]["peak_increase_mib"] if m in ok else None

    rows = []
    for m in methods:
        r = res[m]
        if "error" in r:
            rows.append((m, None, None, None, None, "failed"))
            continue
        note = ", ".join(f"{k.removesuffix('_s')} {v:.3g}s" for k, v in r["phases_median_s"].items() if v)
        rows.append((m, r["median_s"], _ratio(r["median_s"], t("plain")), r["memory"]["peak_increase_mib"],
                     r["setup_s"], note))

    tl_cache = ok["tl"]["phases_median_s"]["run_with_cache_s"] if "tl" in ok else None
    ratios = {
        "mechkit_time_over_plain": (_ratio(t("mechkit"), t("plain")), 1.5, False),
        "tl_time_over_mechkit": (_ratio(t("tl"), t("mechkit")), 2.0, True),
        "tl_run_with_cache_only_over_mechkit": (_ratio(tl_cache, t("mechkit")), None, True),
        "tl_patterns_only_time_over_mechkit": (_ratio(t("tl-patterns"), t("mechkit")), None, True),
        "nnsight_time_over_mechkit": (_ratio(t("nnsight"), t("mechkit")), None, True),
        "tl_peak_mem_over_mechkit": (_ratio(mem("tl"), mem("mechkit")), 5.0, True),
        "tl_patterns_only_peak_mem_over_mechkit": (_ratio(mem("tl-patterns"), mem("mechkit")), None, True),
        "nnsight_peak_mem_over_mechkit": (_ratio(mem("nnsight"), mem("mechkit")), None, True),
        "mechkit_peak_mem_over_plain": (_ratio(mem("mechkit"), mem("plain")), None, False),
    }

    agreement, tops = {}, {}
    if "mechkit" in ok:
        mk_scores = {k: np.asarray(v) for k, v in ok["mechkit"]["scores"].items()}
        tops["mechkit induction"] = common.top_heads(mk_scores["induction"])
        for other in ("tl", "tl-patterns", "nnsight"):
            if other not in ok:
                continue
            sc = {k: np.asarray(v) for k, v in ok[other]["scores"].items()}
            for kind in ("induction", "previous-token"):
                agreement[f"mechkit vs {other} {kind}"] = {
                    "spearman": spearman(mk_scores[kind], sc[kind]),
                    "max_abs_diff": float(np.abs(mk_scores[kind] - sc[kind]).max())}
                det = sc.get(f"tl-detector {kind}")
                if det is not None:
                    agreement[f"mechkit vs tl head_detector {kind}"] = {
                        "spearman": spearman(mk_scores[kind], det), "max_abs_diff": None}
            if other == "tl":
                tops["tl head_detector induction"] = common.top_heads(sc["tl-detector induction"])
                tops["tl stripe induction"] = common.top_heads(sc["induction"])
            elif other == "nnsight":
                tops["nnsight induction"] = common.top_heads(sc["induction"])

    threads = next((r["threads"] for r in ok.values()), args.threads)
    n, total = args.n_seqs, 2 * args.seg_len
    print(f"\ndetect: {n} sequences x {total} tokens (segment {args.seg_len}), batch {args.batch_size}, "
          f"torch threads {threads}, median of {args.repeats} after a warm-up{' [QUICK]' if quick else ''}\n")
    print(common.table(rows, ("method", "median s", "x plain", "peak +MiB", "setup s", "phases")))
    print()
    print(common.table([(k, v, common.verdict(v, aim, hi) if aim else "") for k, (v, aim, hi) in ratios.items()],
                       ("ratio", "value", "aim")))
    if agreement:
        print()
        print(common.table([(k, v["spearman"], v["max_abs_diff"]) for k, v in agreement.items()],
                           ("agreement (270 heads)" if not quick else "agreement", "spearman", "max |diff|")))
    for k, v in tops.items():
        print(f"top-5 {k}: {', '.join(v)}")

    path = common.write_json("detect", {
        "quick": quick,
        "config": {"n_seqs": n, "seg_len": args.seg_len, "batch_size": args.batch_size, "repeats": args.repeats,
                   "tokens": "mechkit.heads.scores.repeated_tokens(seed=0)"},
        "environment": common.environment(threads),
        "methods": res,
        "ratios": {k: {"value": v, "aim": aim, "higher_is_better": hi} for k, (v, aim, hi) in ratios.items()},
        "agreement": agreement,
        "top5": tops,
    }, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
