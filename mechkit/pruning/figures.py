"""The figures of a prune run, as :class:`~mechkit.eval.figures.Plot` data read from its rows; the plugin
draws them with :func:`mechkit.report.draw`."""

from __future__ import annotations

from mechkit.eval.figures import Plot
from mechkit.pruning.findings import level_text


def accuracy_vs_speedup(tasks: list[str], dense: dict, rows: list[dict]) -> Plot:
    """Held-out mean accuracy against measured speedup, one series per guide, the dense model as reference."""
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        xs, ys = series.setdefault(r["guide"], ([], []))
        xs.append(r["speedup"])
        ys.append(r["mean_accuracy"])
    return Plot("xy_plot", (series, f"Held-out accuracy vs measured speedup ({', '.join(tasks)})",
                            "forward speedup over dense (×)", "mean exact-match accuracy"),
                {"reference": (1.0, dense["mean_accuracy"])})


def kept_heads(row: dict, n_layers: int, n_heads: int) -> Plot:
    """Layer × head: 1 where the row's plan keeps the head, 0 where it removes it (or its whole layer)."""
    plan = row.get("plan") or {}
    gone = set(plan.get("layers", []))
    removed = {(int(layer), h) for layer, hs in (plan.get("heads") or {}).items() for h in hs}
    kept = [[0.0 if layer in gone or (layer, h) in removed else 1.0 for h in range(n_heads)] for layer in range(n_layers)]
    return Plot("head_heatmap", (kept, f"Heads {row['guide']} keeps at {level_text(row['sparsity'])} (1 kept, 0 removed)",
                                 "kept"))

