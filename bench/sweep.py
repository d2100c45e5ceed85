"""Ablation sweep: mechkit ``exact_effects`` / ``attribution_effects`` in plain-forward units.

On the embedded model and the same prompts (``capitalize``, 10-shot, seed 0; 16 prompts in one
batch of 16 by default):

- ``plain``: median time of the HF forward on the same padded batch(es) mechkit scores — full
  logits (what a user runs) and, for reference, ``logits_to_keep`` at the answer positions only.
- ``exact``: ``exact_effects`` over all 270 heads (one clean forward, then each head's ablation
  replays only the blocks from its layer up). Compared with 270 plain forwards, **extrapolated**
  as 270 × the median plain-forward time (270 forwards are not run).
- ``attribution``: ``attribution_effects`` (one forward and one backward), in forward-equivalents,
  and its Spearman rank agreement with ``exact`` over the 270 heads.
- ``tl`` (optional, ``--tl-heads 0`` to skip): the naive exact sweep with TransformerLens 4.x —
  a ``TransformerBridge`` built offline around the same model, one full forward per head with a
  zero-ablation hook on ``blocks.L.attn.hook_z``. Timed on ``--tl-heads`` heads spread over the
  layers and **extrapolated** to 270; its effects are checked against mechkit's exact ones. Run
  last: building the bridge switches the HF model to eager attention in place.

    python bench/sweep.py [--quick] [--threads N] [--n 16] [--shots 10] [--batch-size 16]
"""

from __future__ import annotations

import time

import common


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--task", default="capitalize")
    p.add_argument("--n", type=int, default=None, help="prompts (default 16; quick 2)")
    p.add_argument("--shots", type=int, default=None, help="shots per prompt (default 10; quick 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="timed plain/attribution runs (default 5; quick 2)")
    p.add_argument("--exact-repeats", type=int, default=1,
                   help="timed exact sweeps (default 1: one sweep is already hundreds of partial forwards)")
    p.add_argument("--tl-heads", type=int, default=None, help="heads timed with TL hooks (default 6; quick 2; 0 skips)")
    args = p.parse_args()
    quick = args.quick
    n = args.n or (2 if quick else 16)
    shots = args.shots or (1 if quick else 10)
    repeats = args.repeats or (2 if quick else 5)
    tl_heads = args.tl_heads if args.tl_heads is not None else (2 if quick else 6)

    common.go_offline()
    threads = common.set_threads(args.threads)
    import numpy as np
    import torch

    import mechkit as mk
    from mechkit.eval.scoring import batches as make_batches
    from mechkit.eval.scoring import row_metrics
    from mechkit.heads import attribution_effects, exact_effects, spearman

    handle = mk.load_model("llama")
    common.prefault(handle)
    a = handle.anatomy
    n_heads_total = a.n_layers * a.n_heads
    prompts = mk.build_prompts(args.task, n=n, shots=shots, seed=0)
    batches = make_batches(handle, prompts, args.batch_size)  # exactly the batches exact_effects builds
    shape = [list(b.ids.shape) for b in batches]
    print(f"[sweep] {len(prompts)} prompts -> batches {shape}, threads {threads}", flush=True)

    def plain():
        with torch.no_grad():
            for b in batches:
                handle(b.ids, attention_mask=b.mask)

    def plain_keep():
        with torch.no_grad():
            for b in batches:
                handle(b.ids, attention_mask=b.mask, logits_to_keep=b.keep)

    t_plain = common.median_time(plain, repeats)
    t_plain_keep = common.median_time(plain_keep, repeats)
    fwd = t_plain["median_s"]
    print(f"[sweep] plain forward {fwd:.3g}s (logits at answer positions only: {t_plain_keep['median_s']:.3g}s)",
          flush=True)

    exact_times, exact = [], None
    for _ in range(args.exact_repeats):
        dt, exact = common.timed(lambda: exact_effects(handle, prompts, batch_size=args.batch_size))
        exact_times.append(dt)
        print(f"[sweep] exact_effects {dt:.3g}s", flush=True)
    t_exact = float(np.median(exact_times))

    attr = None

    def run_attr():
        nonlocal attr
        attr = attribution_effects(handle, prompts, batch_size=args.batch_size)

    t_attr = common.median_time(run_attr, repeats)
    print(f"[sweep] attribution_effects {t_attr['median_s']:.3g}s", flush=True)
    rho = spearman(attr.logprob, exact.logprob)
    rho_abs = spearman(np.abs(attr.logprob), np.abs(exact.logprob))

    tl = None
    if tl_heads:
        tl = _tl_sweep(handle, batches, exact.logprob, tl_heads, repeats, row_metrics, torch)
        print(f"[sweep] TL: {tl['per_head_median_s']:.3g}s per head, clean forward {tl['clean_forward_s']:.3g}s",
              flush=True)

    n_fwd_total = n_heads_total * fwd
    ratios = {
        "exact_over_270_plain_forwards (extrapolated)": (t_exact / n_fwd_total, 0.6, False),
        "exact_in_forward_equivalents": (t_exact / fwd, None, False),
        "attribution_in_forward_equivalents": (t_attr["median_s"] / fwd, 5.0, False),
        "spearman attribution vs exact (logprob effect)": (rho, None, True),
        "spearman attribution vs exact (|effect|)": (rho_abs, None, True),
    }
    if tl:
        ratios["tl_sweep_over_mechkit_exact (tl extrapolated)"] = (tl["extrapolated_270_s"] / t_exact, None, True)
        ratios["tl_clean_forward_over_plain"] = (tl["clean_forward_s"] / fwd, None, False)

    rows = [
        ("plain forward (full logits)", fwd, 1.0, "median"),
        ("plain forward (logits_to_keep)", t_plain_keep["median_s"], t_plain_keep["median_s"] / fwd, "median"),
        (f"{n_heads_total} plain forwards", n_fwd_total, float(n_heads_total), "extrapolated"),
        ("mechkit exact_effects (270 heads)", t_exact, t_exact / fwd,
         f"median of {len(exact_times)}" if len(exact_times) > 1 else "1 run"),
        ("mechkit attribution_effects", t_attr["median_s"], t_attr["median_s"] / fwd, "median"),
    ]
    if tl:
        rows += [("TL clean forward (bridge)", tl["clean_forward_s"], tl["clean_forward_s"] / fwd, "median"),
                 (f"TL exact sweep, 270 heads (from {tl['heads_timed']})", tl["extrapolated_270_s"],
                  tl["extrapolated_270_s"] / fwd, "extrapolated")]

    top = {
        "exact (largest log-prob drop)": _top(exact.logprob),
        "attribution": _top(attr.logprob),
    }
    total_tokens = sum(int(b.mask.sum()) for b in batches)
    print(f"\nsweep: {args.task}, {len(prompts)} prompts x {shots} shots ({total_tokens} tokens, batches {shape}), "
          f"torch threads {threads}, median of {repeats} after a warm-up{' [QUICK]' if quick else ''}\n")
    print(common.table(rows, ("what", "seconds", "x plain fwd", "how")))
    print()
    print(common.table([(k, v, common.verdict(v, aim, hi) if aim else "") for k, (v, aim, hi) in ratios.items()],
                       ("ratio", "value", "aim")))
    if tl:
        print(f"\nTL vs mechkit exact on the {tl['heads_timed']} timed heads: max |effect diff| "
              f"{tl['max_abs_diff_vs_mechkit']:.2g}")
    for k, v in top.items():
        print(f"top-5 {k}: {', '.join(v)}")
    print(f"clean: logprob {exact.clean_logprob:.3f}, accuracy {exact.clean_accuracy:.3f}")

    path = common.write_json("sweep", {
        "quick": quick,
        "config": {"task": args.task, "n": n, "shots": shots, "batch_size": args.batch_size, "seed": 0,
                   "repeats": repeats, "exact_repeats": args.exact_repeats, "batch_shapes": shape,
                   "tokens": total_tokens, "tl_heads": tl_heads},
        "environment": common.environment(threads),
        "plain_forward": t_plain,
        "plain_forward_logits_to_keep": t_plain_keep,
        "exact": {"times_s": exact_times, "median_s": t_exact, "clean_logprob": exact.clean_logprob,
                  "clean_accuracy": exact.clean_accuracy, "logprob_effects": exact.logprob},
        "attribution": {**t_attr, "logprob_effects": attr.logprob},
        "tl": tl,
        "ratios": {k: {"value": v, "aim": aim, "higher_is_better": hi} for k, (v, aim, hi) in ratios.items()},
        "top5": top,
    }, args.out)
    print(f"\nwrote {path}")


def _top(grid, k: int = 5) -> list[str]:
    """The ``k`` heads whose ablation lowers the answer log-prob most, with their effect."""
    import numpy as np

    g = np.asarray(grid)
    return [f"{i // g.shape[1]}.{i % g.shape[1]} ({g.flat[i]:+.3f})" for i in np.argsort(g, axis=None)[:k]]


def _tl_sweep(handle, batches, exact_lp, k: int, repeats: int, metrics, torch) -> dict:
    """Naive TL sweep on ``k`` heads: one full hooked forward per head, extrapolated to all heads."""
    import numpy as np

    a = handle.anatomy
    t = time.perf_counter()
    bridge = common.tl_bridge(handle)
    setup_s = time.perf_counter() - t
    layers = np.linspace(0, a.n_layers - 1, k).round().astype(int)
    heads = [(int(layer), int(layer) % a.n_heads) for layer in layers]

    def zero_head(h: int):
        def hook(z, hook):  # z: [batch, pos, head, d_head]
            z[:, :, h, :] = 0.0
            return z

        return hook

    def clean():
        with torch.no_grad():
            return [bridge(b.ids, attention_mask=b.mask) for b in batches]

    clean_t = common.median_time(clean, repeats)
    with torch.no_grad():
        base = [metrics(logits[:, b.keep], b)[0] for logits, b in zip(clean(), batches, strict=True)]
    n_rows = sum(len(b.cols) for b in batches)
    per_head, effects = [], {}
    with torch.no_grad():
        for layer, h in heads:
            t = time.perf_counter()
            total = 0.0
            for b, base_lp in zip(batches, base, strict=True):
                out = bridge.run_with_hooks(b.ids, attention_mask=b.mask,
                                            fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head(h))])
                total += float((metrics(out[:, b.keep], b)[0] - base_lp).sum())
            per_head.append(time.perf_counter() - t)
            effects[f"{layer}.{h}"] = total / n_rows
    diff = max(abs(effects[f"{layer}.{h}"] - float(exact_lp[layer, h])) for layer, h in heads)
    med = float(np.median(per_head))
    return {"setup_s": setup_s, "clean_forward_s": clean_t["median_s"], "heads_timed": len(heads),
            "heads": [f"{layer}.{h}" for layer, h in heads], "per_head_s": per_head, "per_head_median_s": med,
            "extrapolated_270_s": med * a.n_layers * a.n_heads, "effects": effects,
            "max_abs_diff_vs_mechkit": diff}


if __name__ == "__main__":
    main()
