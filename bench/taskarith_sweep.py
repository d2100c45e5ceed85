"""Task arithmetic on the embedded model: the seeds' Figure 23 pattern for three task pairs.

Fine-tunes (once; reused when present) capitalize, past-tense, lowercase and a second capitalize model
from different training data, extracts their task vectors, then sweeps Ψ0 + ΔΨ_1 + λ·ΔΨ_2 for

- irrelevant:    capitalize (T1) vs past-tense (T2)
- aligned:       capitalize (T1) vs capitalize fine-tuned on other data (T2)
- contradictory: capitalize (T1) vs lowercase (T2)
- irrelevant-fewshot: capitalize vs past-tense again, both fine-tuned on 1/3/5-shot prompts and
  evaluated at 1 and 5 shots, where the demonstrations say which task is asked (zero-shot, both
  tasks claim the same ``input: X / output:`` prompt, and their vectors contend for it)

and prints the accuracy tables (zero-shot and 5-shot unless said, n prompts per task), the best λ for multi-task
learning and unlearning, α̂ for each pair, and the time to extract / apply a task vector as a ratio
to ``load_model("llama")``. Everything is written under ``bench/results/taskarith/``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/taskarith_sweep.py [--steps 120] [--lambdas -1:1.5:0.25]
        [--pairs irrelevant-fewshot] [--merges-only] [--quick]

``--quick`` is a smoke test, not a measurement: ``tiny:llama``, two fine-tunes of 2 steps, the
irrelevant pair at three λ on 2 prompts, everything under a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
ROOT = Path(__file__).parent / "results" / "taskarith"
MODEL = "llama"  # the base every fine-tune starts from (--quick: tiny:llama)
MODELS = {  # name: (task, data seed, demonstrations per training prompt)
    "capitalize": ("capitalize", 1000, "0"),
    "past-tense": ("past-tense", 1000, "0"),
    "lowercase": ("lowercase", 1000, "0"),
    "capitalize-b": ("capitalize", 2000, "0"),
    "capitalize-fs": ("capitalize", 1000, "1,3,5"),
    "past-tense-fs": ("past-tense", 1000, "1,3,5"),
}
PAIRS = {  # label: (T1 model, T2 model, evaluation shots)
    "irrelevant": ("capitalize", "past-tense", "0,5"),
    "aligned": ("capitalize", "capitalize-b", "0,5"),
    "contradictory": ("capitalize", "lowercase", "0,5"),
    "irrelevant-fewshot": ("capitalize-fs", "past-tense-fs", "1,5"),
}


def ensure_finetuned(name: str, steps: int, lr: float) -> Path:
    import mechkit as mk

    out = ROOT / f"ft-{name}"
    if not (out / "report.json").exists():
        task, data_seed, shots = MODELS[name]
        mk.run("finetune", model=MODEL, task=task, steps=steps, lr=lr, data_seed=data_seed, shots=shots,
               out=out, force=True)
    report = json.loads((out / "report.json").read_text())["results"]
    print(f"fine-tuned {name:13s} loss {report['summary']['loss']:>15s}  zero-shot "
          f"{report['accuracy_before']['accuracy']:.2f} -> {report['accuracy_after']['accuracy']:.2f}")
    return out


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def extract_all(handle, dirs: dict[str, Path]) -> dict[str, Path]:
    from mechkit import taskarith as ta

    load_s, _ = timed(lambda: __import__("mechkit").load_model(MODEL))
    paths, extract_times = {}, []
    for name, d in dirs.items():
        t, tv = timed(lambda d=d: ta.extract(handle, d), repeats=1)
        extract_times.append(t)
        paths[name] = tv.save(ROOT / f"tv-{name}.safetensors")
    tv = ta.TaskVector.load(paths["capitalize"])

    def apply_once():
        with ta.apply(handle, tv):
            pass

    apply_s, _ = timed(apply_once)
    ext = statistics.median(extract_times)
    print(f"\nload_model({MODEL!r}) {load_s:.2f} s | extract {ext:.2f} s ({ext / load_s:.2f}x load) | "
          f"apply+restore {apply_s:.2f} s ({apply_s / load_s:.2f}x load)")
    return paths


def print_pair(label: str, results: dict) -> None:
    cols = results["columns"]
    print(f"\n## {label}: {results['tasks'][0]} (T1) + λ·{results['tasks'][1]} (T2)")
    print("| model | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, row in results["reference"].items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in cols) + " |")
    for row in results["table"]:
        print(f"| λ={row['lambda']:g} | " + " | ".join(f"{row[c]:.2f}" for c in cols) + " |")
    for key, row in results["best"].items():
        if row:
            print(f"best λ {key}: {row['lambda']:g} ({', '.join(f'{c} {row[c]:.2f}' for c in cols)})")
    print("α̂: " + ", ".join(f"{k} {v:.3f}" for k, v in results["alpha"].items()))


def merges(handle, paths: dict[str, Path], n: int) -> None:
    """Multi-task merges of the irrelevant pair (capitalize + past-tense), zero-shot accuracy on both."""
    import mechkit as mk
    from mechkit import taskarith as ta

    a, b = (ta.TaskVector.load(paths[k]) for k in ("capitalize", "past-tense"))
    prompts = {t: mk.build_prompts(t, n=n, shots=0, seed=0) for t in ("capitalize", "past-tense")}
    cases = {"task arithmetic λ=1": lambda: a + b, "task arithmetic λ=0.5": lambda: 0.5 * (a + b),
             "TIES d=0.2": lambda: ta.merge([a, b], "ties", density=0.2),
             "TIES d=0.2 λ=1.5": lambda: ta.merge([a, b], "ties", density=0.2, scale=1.5),
             "DARE p=0.9": lambda: ta.merge([a, b], "dare", p=0.9, seed=0),
             "DARE-TIES p=0.9": lambda: ta.merge([a, b], "dare_ties", p=0.9, seed=0)}
    print("\n## multi-task merges of capitalize + past-tense (zero-shot)")
    print("| merge | capitalize | past-tense | merge s |\n|---|---|---|---|")
    for name, make in cases.items():
        t0 = time.perf_counter()
        merged = make()
        merge_s = time.perf_counter() - t0
        with ta.apply(handle, merged):
            accs = [mk.score_prompts(handle, ps).accuracy for ps in prompts.values()]
        print(f"| {name} | {accs[0]:.2f} | {accs[1]:.2f} | {merge_s:.1f} |")


def main() -> None:
    import tempfile

    import mechkit as mk

    global ROOT, MODEL, MODELS
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--lambdas", default="-1:1.5:0.25")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--pairs", default="", help="comma list of pair labels to sweep (default: all)")
    parser.add_argument("--merges-only", action="store_true", help="only the multi-task merge table")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    args = parser.parse_args()
    if args.quick:
        ROOT, MODEL = Path(tempfile.mkdtemp(prefix="taskarith-quick-")), "tiny:llama"
        MODELS = {k: MODELS[k] for k in ("capitalize", "past-tense")}
        args.steps, args.n, args.lambdas, args.pairs = 2, 2, "0:1:0.5", "irrelevant"
    ROOT.mkdir(parents=True, exist_ok=True)
    dirs = {name: ensure_finetuned(name, args.steps, args.lr) for name in MODELS}
    handle = mk.load_model(MODEL)
    paths = extract_all(handle, dirs)
    if not args.pairs:
        merges(handle, paths, args.n)
    if args.merges_only:
        return
    summary = {}
    for label, (a, b, shots) in PAIRS.items():
        if args.pairs and label not in args.pairs.split(","):
            continue
        run = mk.run("taskvec-sweep", model=handle, vectors=f"{paths[a]},{paths[b]}",
                     tasks=f"{MODELS[a][0]},{MODELS[b][0]}", lambdas=args.lambdas, n=args.n, shots=shots,
                     out=ROOT / f"sweep-{label}", force=True)
        print_pair(label, run.results)
        summary[label] = run.results
    path = ROOT / "summary.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**previous, **summary}, indent=2, default=str))


if __name__ == "__main__":
    main()
