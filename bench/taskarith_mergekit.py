"""mechkit's merges against mergekit's ``task_arithmetic``, ``ties`` and ``dare_linear`` on the same checkpoints.

Builds a tiny Llama base and two "fine-tuned" variants (seeded noise), merges them with both tools
and prints, per method, the max |Δ| between the merged weights. mergekit is not a dependency: install
it in a separate venv (``python3 -m venv /tmp/mk-venv && /tmp/mk-venv/bin/pip install --no-deps
mergekit immutables``) and point ``MERGEKIT_SITE`` at its site-packages (default
``/tmp/mk-venv/lib/python3.11/site-packages``); its other dependencies (torch, transformers, pydantic…)
are taken from this environment. Without mergekit the script says so and exits 0.

Where the definitions differ (read from mergekit 0.1.5, ``merge_methods/generalized_task_arithmetic.py``
and ``sparsify.py``):

- TIES trim keeps ``max(1, int(density·n))`` entries in mergekit, ``round(density·n)`` in mechkit
  (same count whenever density·n is an integer, as here).
- TIES normalization: mergekit divides the agreeing mass by the sum of the agreeing *weights*;
  mechkit by their *count* unless ``normalize="weights"`` (identical for unit weights).
- Sign election at an exact zero sum: mergekit elects +, mechkit elects 0 (entry dropped).
- DARE rescale: mergekit (``rescale: true``) rescales the survivors so the tensor's L1 norm is
  unchanged; mechkit rescales by exactly 1/(1−p), as in the DARE paper (unbiased in expectation).
  mergekit's ``density`` is mechkit's 1 − p. Masks come from different random streams, so DARE is
  compared by kept fraction and norm ratio, and exactly at p = 0.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

torch.set_num_threads(1)
SITE = os.environ.get("MERGEKIT_SITE", "/tmp/mk-venv/lib/python3.11/site-packages")


def _import_mergekit():
    try:
        import mergekit  # noqa: F401
    except ImportError:
        if Path(SITE).is_dir():
            sys.path.append(SITE)  # appended: this environment's torch/transformers win
    try:
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge
    except ImportError as err:
        return None, str(err)
    return (MergeConfiguration, MergeOptions, run_merge), None


def _checkpoints(root: Path) -> tuple[Path, list[Path]]:
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    dirs = []
    for i in range(3):
        model, _ = tiny_model("llama")
        if i:
            gen = torch.Generator().manual_seed(i)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * torch.randn(p.shape, generator=gen))
        path = root / ("base" if i == 0 else f"ft{i}")
        model.save_pretrained(path, safe_serialization=True)
        byte_tokenizer().save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1:]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from mechkit.taskarith.extract import stream_tensors

    return dict(stream_tensors(path))


def _mergekit(tools, method: str, base: Path, fts: list[Path], out: Path, params: list[dict], extra: dict) -> Path:
    config_cls, options_cls, run_merge = tools
    config = config_cls.model_validate({
        "merge_method": method, "base_model": str(base), "dtype": "float32", "parameters": extra,
        "models": [{"model": str(f), "parameters": p} for f, p in zip(fts, params, strict=True)],
    })
    run_merge(config, str(out), options_cls(copy_tokenizer=False, write_model_card=False, quiet=True, random_seed=0))
    return out


def _ours(base_handle, vectors, out: Path, **kw) -> Path:
    from mechkit.taskarith import merge, save_merged

    return save_merged(base_handle, merge(vectors, **kw), out)


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def _dare_stats(out: Path, base: Path, deltas_sum: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Kept fraction of the merged delta and ‖merged delta‖₁ / ‖Σ w τ‖₁ (1 for an L1-preserving rescale)."""
    merged, base_w = _weights(out), _weights(base)
    kept = total = l1 = l1_ref = 0.0
    for k, ref in deltas_sum.items():
        d = merged[k] - base_w[k]
        kept += float((d != 0).sum())
        total += d.numel()
        l1 += float(d.abs().sum())
        l1_ref += float(ref.abs().sum())
    return kept / total, l1 / l1_ref


def main() -> None:
    import argparse

    import mechkit as mk
    from mechkit.taskarith import extract

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="accepted for every bench's smoke test: the checkpoints are tiny already")
    parser.parse_args()
    tools, error = _import_mergekit()
    if tools is None:
        print(f"mergekit is not importable ({error}); see this script's docstring to install it. Nothing compared.")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, fts = _checkpoints(root)
        handle = mk.load_model(str(base), device="cpu")
        vectors = [extract(handle, f) for f in fts]
        rows = []
        cases = [
            ("task_arithmetic", "task_arithmetic", [{"weight": 1.0}, {"weight": 0.5}], {},
             dict(method="task_arithmetic", weights=[1.0, 0.5])),
            ("task_arithmetic λ=0.7", "task_arithmetic", [{"weight": 1.0}, {"weight": 1.0}], {"lambda": 0.7},
             dict(method="task_arithmetic", scale=0.7)),
            ("ties d=0.5 w=1,1", "ties", [{"weight": 1.0, "density": 0.5}] * 2, {},
             dict(method="ties", density=0.5)),
            ("ties d=0.25 w=.7,.3 (weights norm)", "ties",
             [{"weight": 0.7, "density": 0.25}, {"weight": 0.3, "density": 0.25}], {},
             dict(method="ties", density=0.25, weights=[0.7, 0.3], normalize="weights")),
            ("ties d=0.25 w=.7,.3 (count norm)", "ties",
             [{"weight": 0.7, "density": 0.25}, {"weight": 0.3, "density": 0.25}], {},
             dict(method="ties", density=0.25, weights=[0.7, 0.3])),
            ("dare_linear p=0", "dare_linear", [{"weight": 1.0, "density": 1.0}] * 2, {},
             dict(method="dare", p=0.0)),
        ]
        for label, mk_method, params, extra, ours_kw in cases:
            theirs = _mergekit(tools, mk_method, base, fts, root / f"mk-{len(rows)}", params, extra)
            ours = _ours(handle, vectors, root / f"ours-{len(rows)}", **ours_kw)
            rows.append((label, _max_diff(theirs, ours)))
        print(f"{'method':40s} {'max |mechkit - mergekit|':>26s}")
        for label, diff in rows:
            print(f"{label:40s} {diff:26.3e}")
        ref = vectors[0].deltas  # DARE on one vector: the rescale conventions show directly
        theirs = _mergekit(tools, "dare_linear", base, fts[:1], root / "mk-dare", [{"weight": 1.0, "density": 0.5}], {})
        ours = _ours(handle, vectors[:1], root / "ours-dare", method="dare", p=0.5, seed=0)
        print(f"\n{'dare_linear, one vector, p=0.5':40s} {'kept fraction':>14s} {'L1 / L1(τ)':>14s}")
        for label, out in (("mergekit (L1 rescale)", theirs), ("mechkit (1/(1-p) rescale)", ours)):
            kept, ratio = _dare_stats(out, base, ref)
            print(f"{label:40s} {kept:14.4f} {ratio:14.4f}")

if __name__ == "__main__":
    main()
