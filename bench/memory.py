"""Peak memory of every built-in plugin, in units of one plain forward's working set.

Each plugin runs in a **fresh process** (so no earlier run's memory is counted): the worker loads
the model, faults its weights in, notes its RSS, then runs the plugin through ``mk.run`` on the
loaded model. The runner resets the kernel's RSS high-water mark when the run starts and writes
the run's peak into ``report.json`` (``timings.peak_rss_mb``); the plugin's **working set** is that
peak minus the RSS after loading (the weights themselves are not counted).

The unit is a **plain forward's working set**: the same measurement around one HF forward (full
logits, no grad) on one batch of the shape the plugins use — ``--batch`` prompts of a task at
``--shots`` shots (16 × 10 shots by default, mechkit's default batch). "Not more than a small
constant multiple of one batch's activations" reads as a small ratio here; where a plugin keeps
more, the table says why (a copy of the weights, gradients, optimizer state).

    python bench/memory.py [--model llama|1b|tiny] [--plugins detect,ablate,...] [--threads 1]

``--model 1b`` is a random-initialised ~1B Llama (16 layers, d_model 2048, MLP 8192, 32/8 heads,
the embedded model's tokenizer and vocabulary), saved once under ``bench/results/llama-1b-random``;
each plugin then runs with fewer prompts (see ``SMALL``) because a 1B forward on 2 CPU cores takes
tens of seconds. ``--model tiny`` is a smoke test, not a measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import common

# Options per plugin: the defaults a user would type, with fewer prompts so the run stays short;
# batch sizes (which set the working set) are the plugins' defaults.
OPTIONS = {
    "inspect": {},
    "detect": {},
    "ablate": dict(tasks="capitalize,past-tense", n=16, sweep="5", baseline_seeds=1),
    "shuffle": dict(heads="induction", tasks="capitalize", n=16, seeds=1),
    "sweep": dict(tasks="capitalize", n=16, method="attribution"),
    "icl-vectors": dict(tasks="capitalize", n=16, n_dev=4, n_contexts=4, n_cie=2),
    "prune": dict(guide="attribution", target="neurons", sparsity="0.2", tasks="capitalize", n=8, calib=8,
                  repeats=1),
    "compose": dict(parts="study", pairs="capitalize+swap", n=8, seeds=1, shots="0,10"),
    "adapt": dict(tasks="capitalize,past-tense", budgets="0.7", calib=4, n=4, repeats=1, prune_budgets=""),
    "finetune": dict(task="capitalize", steps=2, batch_size=8, eval_n=8),
}
# On the 1B model: fewer and shorter prompts (the ratio is to a forward of the same shape).
SMALL = dict(n=4, shots=4)
# The 2-layer tiny model (a smoke test) has too few heads and layers for the defaults.
TINY = {"ablate": dict(sweep="1"), "shuffle": dict(heads="0.0,0.1"),
        "adapt": dict(signal_layer=0, token_layers="0")}
WHY = {
    "sweep": "attribution: the backward pass keeps every layer's activations of a batch (and the full-vocabulary "
             "logits' gradient); the exact method stays near a forward",
    "prune": "the attribution guide's backward (as sweep) — the pruned copy itself adds one model's weights",
    "finetune": "a trained copy with gradients and AdamW's two moments (4 weight-sized buffers) and a backward",
    "adapt": "the pruned copy of static pruning at the same latency, besides the loaded model",
}


def build_1b(path: Path) -> Path:
    """A random ~1B Llama with the embedded model's tokenizer, saved once (safetensors)."""
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import mechkit as mk

    tok = mk.load_model("llama").tokenizer
    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=len(tok), max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _rss_mb() -> float:
    kb = common._status_kb("VmRSS")
    return kb / 1024 if kb else float("nan")


def worker(spec: str, plugin: str, options: dict, threads: int | None) -> dict:
    """One measurement in this (fresh) process: the plain forward (``plugin == "plain"``) or a plugin run."""
    import torch

    import mechkit as mk

    common.set_threads(threads)
    import matplotlib.pyplot  # noqa: F401  (imports are a fixed cost, not working set: load them first)

    from mechkit import registry

    if plugin != "plain":
        registry.get(plugin)
    handle = mk.load_model(spec, device="cpu")
    common.prefault(handle)
    after_load = _rss_mb()
    if plugin == "plain":
        prompts = mk.build_prompts("capitalize", n=options["batch"], shots=options["shots"], seed=0)
        enc = handle.tokenizer([p.text + p.answer for p in prompts], return_tensors="pt", padding=True)
        common.reset_peak()
        with torch.no_grad():
            handle.model(**enc)
        peak = common._status_kb("VmHWM") / 1024
        return {"after_load_mb": after_load, "peak_mb": peak, "working_mb": peak - after_load,
                "tokens": int(enc["input_ids"].numel()), "shape": list(enc["input_ids"].shape)}
    with tempfile.TemporaryDirectory() as tmp:
        run = mk.run(plugin, model=handle, out=Path(tmp) / "run", **options)
    peak = run.report["timings"]["peak_rss_mb"]
    return {"after_load_mb": after_load, "peak_mb": peak, "working_mb": peak - after_load,
            "run_s": run.report["timings"]["run_s"]}


def _spawn(spec: str, plugin: str, options: dict, threads: int | None) -> dict:
    cmd = [sys.executable, __file__, "--worker", plugin, "--model-spec", spec, "--options", json.dumps(options)]
    if threads:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="llama", help="llama (embedded), 1b (random ~1B Llama) or tiny")
    p.add_argument("--plugins", default=",".join(OPTIONS), help="comma-separated plugin names")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--shots", type=int, default=10)
    p.add_argument("--worker", default=None, help=argparse_hidden())
    p.add_argument("--model-spec", default=None, help=argparse_hidden())
    p.add_argument("--options", default="{}", help=argparse_hidden())
    args = p.parse_args()
    common.go_offline()
    if args.worker:
        print(json.dumps(worker(args.model_spec, args.worker, json.loads(args.options), args.threads)))
        return
    small = args.model in ("1b", "tiny")
    spec = {"llama": "llama", "tiny": "tiny:llama"}.get(args.model) or str(
        build_1b(common.RESULTS / "llama-1b-random"))
    shots = SMALL["shots"] if small else args.shots
    batch = min(args.batch, SMALL["n"] * 4) if small else args.batch
    plain = _spawn(spec, "plain", {"batch": batch, "shots": shots}, args.threads)
    print(f"plain forward ({plain.get('shape')}): working set {plain.get('working_mb', float('nan')):.0f} MB "
          f"above {plain.get('after_load_mb', float('nan')):.0f} MB after loading")
    rows, out = [], {"model": args.model, "plain": plain, "plugins": {}}
    for name in args.plugins.split(","):
        options = dict(OPTIONS[name])
        if small:
            options.update({k: v for k, v in SMALL.items() if k in options or k == "shots"})
            if name in ("inspect", "detect"):
                options = {"n_seqs": 8} if name == "detect" else {}
        if args.model == "tiny":
            options.update(TINY.get(name, {}))
        m = _spawn(spec, name, options, args.threads)
        ratio = m["working_mb"] / plain["working_mb"] if "working_mb" in m and plain.get("working_mb") else None
        out["plugins"][name] = {**m, "options": options, "ratio_to_plain": ratio}
        rows.append((name, f"{m.get('working_mb', float('nan')):.0f}", f"{ratio:.1f}×" if ratio else "—",
                     m.get("error") or WHY.get(name, "")))
        print(common.table(rows[-1:], ("plugin", "working set MB", "× plain forward", "why / error")), flush=True)
    out["environment"] = common.environment(args.threads)
    print(common.table(rows, ("plugin", "working set MB", "× plain forward", "why / error")))
    print("wrote", common.write_json(f"memory-{args.model}", out, args.out))


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
