"""What a prune run's measurements say: the results it reports (rows, budget, summary lines) and its finding.

Derived from the study's rows alone, so the plugin only declares options, runs rows and draws figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mechkit.pruning.study import PruneStudy


def prune_results(study: PruneStudy, guides: list[str], calib: int, dense: dict, rows: list[dict],
             budget: dict | None) -> dict:
    """The ``results`` of a prune run: the dense model and every row, the budget search, one summary line each."""
    summary = {"dense": summary_line(dense)}
    for r in rows:
        summary[f"{r['guide']} {level_text(r['sparsity'])}"] = summary_line(r)
    if budget:
        summary["budget"] = (f"{budget['unit']} ≤ {budget['budget']:.2f}: chose {budget['chosen']['mix']} "
                             f"{level_text(budget['chosen']['sparsity'])}, measured {budget['measured_ratio']:.2f} "
                             f"({'met' if budget['met'] else 'NOT met'})")
    return {"tasks": study.tasks, "guides": guides, "targets": study.targets, "dense": dense, "rows": rows,
            "budget": {k: v for k, v in budget.items() if k != "chosen_row"} if budget else None,
            "heldout_text": study.text_source, "calibration_prompts_per_task": calib, "summary": summary}


def num(v: float | None, fmt: str = ".2f") -> str:
    """A number for a sentence; ``—`` where there is none."""
    return "—" if v is None else format(v, fmt)


def finding(results: dict) -> str:
    """At the highest sparsity, which guide keeps the most accuracy and at what speedup (or, with
    ``--budget``, what the search chose and whether it met the budget)."""
    rows, dense, budget = results["rows"], results["dense"], results.get("budget")
    where = f"mean accuracy over {len(results['tasks'])} task{'s' if len(results['tasks']) != 1 else ''}"
    if budget:
        r = rows[-1]
        return (f"Within {budget['unit']} ≤ {budget['budget']:.2f} of the dense model, the {budget['guide']} guide "
                f"chose {level_text(budget['chosen']['sparsity'])}, measured at {budget['measured_ratio']:.2f} "
                f"({'met' if budget['met'] else 'NOT met'}); it keeps {num(r['mean_accuracy'])} {where} "
                f"(dense {num(dense['mean_accuracy'])}) at {num(r.get('speedup'))}× the dense speed.")
    level = level_text(rows[-1]["sparsity"])
    at = sorted((r for r in rows if level_text(r["sparsity"]) == level),
                key=lambda r: -(r["mean_accuracy"] if r["mean_accuracy"] is not None else -1))
    best, others = at[0], at[1:]
    if others and all(r["mean_accuracy"] == best["mean_accuracy"] for r in others):
        speeds = [r.get("speedup") for r in at if r.get("speedup") is not None]
        return (f"At {level}, the {len(at)} guides tie at {num(best['mean_accuracy'])} {where} "
                f"(dense {num(dense['mean_accuracy'])})"
                + (f", at {min(speeds):.2f}–{max(speeds):.2f}× the dense speed." if speeds else "."))
    text = (f"At {level}, {best['guide']} keeps the most accuracy: {num(best['mean_accuracy'])} {where} "
            f"(dense {num(dense['mean_accuracy'])}) at {num(best.get('speedup'))}× the dense speed")
    if others:
        text += "; " + ", ".join(f"{r['guide']} {num(r['mean_accuracy'])}" for r in others)
    return text + "."


def level_text(sparsity: dict) -> str:
    """A sparsity level as the tables and summaries name it: ``neurons=0.20,heads=0.10``."""
    return ",".join(f"{k}={v:.2f}" for k, v in sparsity.items())


def summary_line(r: dict) -> str:
    """One measured model in a line: accuracy per task, perplexity, parameters, speedup."""
    acc = " ".join(f"{t} {a:.2f}" for t, a in r["accuracy"].items())
    return (f"acc {r['mean_accuracy']:.2f} ({acc}) | ppl {perplexity_text(r['perplexity'])} | params {r['params'] / 1e6:.1f}M | "
            f"speedup {r.get('speedup', 1.0):.2f}×")


def perplexity_text(value: float | None) -> str:
    """Perplexity, or ``overflow`` where it was too large to hold."""
    return "overflow" if value is None else f"{value:.1f}"
