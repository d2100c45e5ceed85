"""The figures of an adapt run, as :class:`~mechkit.eval.figures.Plot` data read from its results alone
(so a report can be redrawn without rerunning); the plugin draws them with :func:`mechkit.report.draw`."""

from __future__ import annotations

from mechkit.adapt.findings import pruned_copies
from mechkit.eval.figures import Plot


def frontier(results: dict) -> Plot:
    """Held-out accuracy against measured latency: adaptive, the best static plan and the pruned copies."""
    rows = results["rows"]
    series = {"adaptive": ([r["adaptive"]["latency_ratio"] for r in rows], [r["adaptive"]["mean_accuracy"] for r in rows]),
              "best static plan": ([r["static"]["latency_ratio"] for r in rows],
                                   [r["static"]["mean_accuracy"] for r in rows])}
    pruned = sorted((c for r in rows for c in pruned_copies(r)), key=lambda c: c["latency_ratio"])
    if pruned:
        series["static prune"] = ([x["latency_ratio"] for x in pruned], [x["mean_accuracy"] for x in pruned])
    return Plot("xy_plot", (series, f"Held-out accuracy vs measured latency ({', '.join(results['tasks'])})",
                            "measured latency / dense (median over inputs)", "mean exact-match accuracy"),
                {"reference": (1.0, results["dense"]["mean_accuracy"])})


def per_task(results: dict) -> Plot:
    """Each task's held-out accuracy against the budget, adaptive (solid) and best static (dashed)."""
    rows = results["rows"]
    series, groups = {}, {}
    for i, t in enumerate(results["tasks"]):
        for kind, style in (("adaptive", "-"), ("static", "--")):
            series[f"{t} {kind}"] = [r[kind]["accuracy"][t] for r in rows]
            groups[f"{t} {kind}"] = (i, style)
    return Plot("line_plot", ([r["budget"] for r in rows], series, "Held-out accuracy per task vs latency budget "
                              "(solid: adaptive, dashed: best static)", "budget (fraction of dense latency)",
                              "exact-match accuracy"), {"groups": groups})
