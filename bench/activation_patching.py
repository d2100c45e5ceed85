"""Activation patching of the residual stream: mechkit vs TransformerLens, in plain-forward units.

One IOI prompt pair (``mechkit.patching.pairs.ioi_pairs``, pair 0 of seed 0; the name swapped) on the
embedded model (``--quick``: ``tiny:llama`` and a short hand-made pair, a smoke test, not a measurement).
Denoising: every clean ``blocks.L.hook_resid_pre`` at every position patched into the corrupted run, the
logit difference of the two names at the last position. Both sides get the clean run's cache ready-made
(recording it is not timed).

- ``plain``: the median HF forward of the corrupted prompt.
- ``mechkit``: ``mechkit.patching.scan`` (layers × positions; each patch replays only the blocks from its
  layer up, ``--batch-size`` patches per forward, only the last position unembedded).
- ``attribution``: ``mechkit.patching.attribution.attribute`` (one forward and one backward), with its
  Spearman rank agreement with the exact grid.
- ``tl``: ``transformer_lens.patching.get_act_patch_resid_pre`` on a ``TransformerBridge`` around the same
  model (``mk.to_transformer_lens``; one full forward per cell). Its grid is checked against mechkit's. Run last: building the bridge
  switches the HF model to eager attention in place.

    python bench/activation_patching.py [--quick] [--threads N] [--batch-size 32] [--repeats 3]
"""

from __future__ import annotations

import common


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=None, help="timed runs of each sweep (default 3; quick 1)")
    args = p.parse_args()
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)

    common.go_offline()
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens' patching prints a progress bar per cell
    threads = common.set_threads(args.threads)
    import numpy as np
    import torch

    import mechkit as mk
    from mechkit.patching import logit_diff, scan
    from mechkit.patching.attribution import agreement, attribute
    from mechkit.patching.pairs import PromptPair, ioi_pairs, tokens

    handle = mk.load_model("tiny:llama" if quick else "llama")
    common.prefault(handle)
    pair = PromptPair("abcab xy", "abdab xy", "c", "d") if quick else ioi_pairs(1, 0)[0]
    clean, corrupted, c, w = tokens(handle, pair)
    n_cells = handle.anatomy.n_layers * clean.shape[-1]
    print(f"[patching] {clean.shape[-1]} tokens x {handle.anatomy.n_layers} layers = {n_cells} patches, "
          f"threads {threads}", flush=True)
    metric = lambda logits: logit_diff(logits, c, w)  # noqa: E731
    _, cache = mk.run_with_cache(handle, clean, ["blocks.*.hook_resid_pre"])

    def plain():
        with torch.no_grad():
            handle(corrupted)

    t_plain = common.median_time(plain, 5 if quick else 10)["median_s"]
    ours = None

    def run_ours():
        nonlocal ours
        ours = scan(handle, corrupted, cache, "hook_resid_pre", metric, batch_size=args.batch_size)

    t_ours = common.median_time(run_ours, repeats)["median_s"]
    print(f"[patching] plain forward {t_plain:.3g}s, mechkit scan {t_ours:.3g}s", flush=True)
    est = None

    def run_attr():
        nonlocal est
        est = attribute(handle, corrupted, cache, "hook_resid_pre", metric)[0]

    t_attr = common.median_time(run_attr, repeats)["median_s"]
    agree = agreement(ours, est)

    from transformer_lens import patching

    bridge = mk.to_transformer_lens(handle)
    _, tl_cache = bridge.run_with_cache(clean)
    tl_metric = lambda logits: logit_diff(logits[:, -1], c, w).mean()  # noqa: E731
    theirs = None

    def run_tl():
        nonlocal theirs
        theirs = patching.get_act_patch_resid_pre(bridge, corrupted, tl_cache, tl_metric)

    t_tl = common.median_time(run_tl, repeats)["median_s"]
    diff = float((theirs.float().cpu() - ours).abs().max())
    rows = [
        ("plain forward (corrupted prompt)", t_plain, 1.0, "median"),
        (f"mechkit scan ({n_cells} patches)", t_ours, t_ours / t_plain, f"median of {repeats}"),
        ("mechkit attribution (1 fwd + 1 bwd)", t_attr, t_attr / t_plain, f"median of {repeats}"),
        (f"TL get_act_patch_resid_pre ({n_cells} forwards)", t_tl, t_tl / t_plain, f"median of {repeats}"),
    ]
    ratios = {
        "tl_over_mechkit (aim >= 2)": (t_tl / t_ours, 2.0, True),
        "mechkit_over_one_forward_per_cell": (t_ours / (n_cells * t_plain), None, False),
        "spearman attribution vs exact": (agree["spearman"], None, True),
        "max |mechkit - TL| logit difference": (diff, None, False),
    }
    print(f"\nactivation patching: {pair.clean!r} -> {pair.corrupted!r}, torch threads {threads}"
          f"{' [QUICK]' if quick else ''}\n")
    print(common.table(rows, ("what", "seconds", "x plain fwd", "how")))
    print()
    print(common.table([(k, v, common.verdict(v, aim, hi) if aim else "") for k, (v, aim, hi) in ratios.items()],
                       ("ratio", "value", "aim")))
    path = common.write_json("activation_patching", {
        "quick": quick, "config": {"pair": vars(pair), "batch_size": args.batch_size, "repeats": repeats,
                                   "tokens": clean.shape[-1], "cells": n_cells},
        "seconds": {"plain": t_plain, "mechkit": t_ours, "attribution": t_attr, "tl": t_tl},
        "ratios": {k: v for k, (v, _, _) in ratios.items()}, "agreement": agree,
        "grid_max_abs_diff_vs_tl": diff, "grid": np.asarray(ours).tolist(),
        "environment": common.environment(threads)}, args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
