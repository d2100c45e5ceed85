"""Weight-space task arithmetic through the Python API: a multi-task merge and an unlearning sweep.

1. fine-tune two task models (or reuse directories from `mechkit finetune`), extract ΔΨ for each;
2. multi-task merge: Ψ0 + ΔΨ_A + ΔΨ_B, and TIES / DARE merges of the two, scored zero-shot on both tasks;
3. unlearning sweep: Ψ0 + ΔΨ_A + λ·ΔΨ_B for λ ≤ 0 — task B should fall while task A stays.

Run:  python examples/task_arithmetic.py [--model llama] [--tasks capitalize,past-tense] [--steps 120]
      python examples/task_arithmetic.py --finetuned runs/ft-cap,runs/ft-past   # reuse fine-tuned dirs
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mechkit as mk
from mechkit import taskarith as ta


def score(model, tasks: list[str], n: int) -> str:
    accs = [mk.score_prompts(model, mk.build_prompts(t, n=n, shots=0, seed=0)).accuracy for t in tasks]
    return "  ".join(f"{t} {a:.2f}" for t, a in zip(tasks, accs, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--tasks", default="capitalize,past-tense")
    parser.add_argument("--finetuned", default=None, help="two fine-tuned model dirs A,B (skips fine-tuning)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--out", default="mechkit-runs/task-arithmetic")
    args = parser.parse_args(argv)
    tasks, out = args.tasks.split(","), Path(args.out)
    base = mk.load_model(args.model)

    dirs = args.finetuned.split(",") if args.finetuned else [
        mk.run("finetune", model=base, task=t, steps=args.steps, lr=args.lr, out=out / f"ft-{t}", force=True).out_dir
        for t in tasks]
    a, b = (ta.extract(base, d) for d in dirs)  # ΔΨ = Ψ_ft − Ψ0, streamed from the safetensors
    print(f"cos(ΔΨ_A, ΔΨ_B) = {a.cosine(b):.3f}")

    print("base            ", score(base, tasks, args.n))
    for name, vector in [("A only", a), ("B only", b), ("A + B", a + b),
                         ("TIES d=0.2", ta.merge([a, b], "ties", density=0.2)),
                         ("DARE p=0.5", ta.merge([a, b], "dare", p=0.5, seed=0))]:
        with ta.apply(base, vector):  # reversible: Ψ0 is restored bit-exactly on exit
            print(f"{name:16s}", score(base, tasks, args.n))

    print("unlearning sweep: Ψ0 + ΔΨ_A + λ·ΔΨ_B")
    with ta.arithmetic(base) as weights:
        for lam in (0.0, -0.25, -0.5, -0.75, -1.0):
            weights.set((a, 1.0), (b, lam))  # always from the snapshot: no drift across λ
            print(f"λ={lam:<5g}         ", score(base, tasks, args.n))


if __name__ == "__main__":
    main()
