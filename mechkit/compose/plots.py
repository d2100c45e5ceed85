"""What a composition run plots, as data: each figure is a :class:`Plot` naming one of
:mod:`mechkit.report`'s plot functions (``line_plot``, ``bar_plot``, ``head_heatmap``) and its
arguments, so every analysis draws with the same helpers and this layer stays below the reports.

- ``accuracy_vs_shots_<pair>``: the seeds' Figure 4.2 lines over the shots grid (dashed simple
  tasks, solid composite settings, dotted S_k / S_g);
- ``accuracy_vs_model_<pair>``: Figure 4.2 proper, accuracy vs model size, with several models;
- ``composite_specific_heads_<pair>`` / ``composite_specific_mlps_<pair>``: the layer × head
  heatmap and the MLP bars of the composite-specific effect;
- ``strengthen_<pair>``: held-out composite accuracy, clean vs selected vs random heads.

>>> specs = plots({"strengthen": {"capitalize+swap": {"scale": {
...     "clean": 0.1, "selected": {"accuracy": 0.3}, "random_mean": 0.1, "random_std": 0.0}}}},
...     shots=[10], treatments=["scale"])
>>> list(specs), specs["strengthen_capitalize_swap"].kind
(['strengthen_capitalize_swap'], 'bar_plot')
"""

from __future__ import annotations

from collections.abc import Sequence

from mechkit.compose.settings import composite_task, only, simple
from mechkit.eval.figures import Plot

__all__ = ["Plot", "plots", "slug"]


def slug(pair: str) -> str:
    """``capitalize+swap`` -> ``capitalize_swap`` (a file name)."""
    return pair.replace("+", "_")


def _series(rows_of, lines) -> tuple[dict, dict, dict]:
    """Mean, std and (colour, style) of each line measured somewhere; ``rows_of(setting)`` gives its rows."""
    series, errors, groups = {}, {}, {}
    for setting, label, colour, style in lines:
        rows = rows_of(setting)
        if any(r is not None for r in rows):
            series[label] = [r["mean"] if r else None for r in rows]
            errors[label] = [r["std"] if r else None for r in rows]
            groups[label] = (colour, style)
    return series, errors, groups


def shots_plot(pair: str, by_shots: dict, shots: Sequence[int]) -> Plot:
    """Figure 4.2's lines over the shots grid for one composite and model."""
    task = composite_task(pair)
    k, g = task.components
    lines = [(simple(k), k, 0, "--"), (simple(g), g, 1, "--"), ("composite", "composite", 2, "-"),
             ("composite-in-context", "composite in-context", 3, "-"), (only(k), f"S_{k} only", 0, ":"),
             (only(g), f"S_{g} only", 1, ":"), ("composite-steps", "in-context, steps", 4, "-")]
    series, errors, groups = _series(
        lambda s: [by_shots.get(str(x), {}).get("settings", {}).get(s) for x in shots], lines)
    return Plot("line_plot", (list(shots), series, f"({task.letter}) {task.name}: accuracy vs demonstrations",
                              "shots K", "exact-match accuracy"), {"errors": errors, "groups": groups})


def model_plot(pair: str, study: dict, models: dict, shots: int) -> Plot:
    """Figure 4.2 proper: accuracy vs model size (parameters, millions) at ``shots``."""
    task = composite_task(pair)
    k, g = task.components
    specs = sorted(study, key=lambda s: models[s]["parameters"])
    lines = [(simple(k), k, 0, "--"), (simple(g), g, 1, "--"), ("composite", "composite", 2, "-"),
             ("composite-in-context", "composite in-context", 3, "-")]
    series, errors, groups = _series(
        lambda s: [study[m].get(task.id, {}).get(str(shots), {}).get("settings", {}).get(s) for m in specs], lines)
    title = f"({task.letter}) {task.name}: accuracy vs model size (K={shots}; {' < '.join(specs)})"
    return Plot("line_plot", ([models[s]["parameters"] / 1e6 for s in specs], series, title, "parameters (millions)",
                              "exact-match accuracy"), {"errors": errors, "groups": groups})


def plots(out: dict, shots: Sequence[int], treatments: Sequence[str], contrast: str = "max",
          model: str | None = None, grid: bool = True) -> dict[str, Plot]:
    """Every figure of a run's results ``out`` (:meth:`~mechkit.compose.analysis.ComposeStudy.run`,
    with ``"models"``: spec -> ``{"parameters"}`` for the model-size plots). The shots plots are
    ``model``'s (default: the first), drawn when the grid was measured (``grid``) and has 2+ points."""
    figures: dict[str, Plot] = {}
    study = out.get("study", {}).get("summary", {})
    model = model if model is not None else next(iter(study), None)
    if grid and len(shots) > 1 and model in study:
        for pair, by_shots in study[model].items():
            figures[f"accuracy_vs_shots_{slug(pair)}"] = shots_plot(pair, by_shots, shots)
    if len(study) > 1:
        pairs = dict.fromkeys(p for s in study.values() for p in s)
        for pair in pairs:
            figures[f"accuracy_vs_model_{slug(pair)}"] = model_plot(pair, study, out["models"], max(shots))
    for pair, row in out.get("components", {}).get("pairs", {}).items():
        figures[f"composite_specific_heads_{slug(pair)}"] = Plot(
            "head_heatmap", (row["composite_specific_heads"], f"{pair}: composite-specific effect ({contrast})",
                             "CS (Δ log-prob)"), {"highlight": [(h["layer"], h["head"]) for h in row["selected"]]})
        mlps = row["composite_specific_mlps"]
        figures[f"composite_specific_mlps_{slug(pair)}"] = Plot(
            "bar_plot", ([str(i) for i in range(len(mlps))], {"CS": mlps},
                         f"{pair}: composite-specific effect of MLP blocks", "CS (Δ log-prob)"))
    for pair, res in out.get("strengthen", {}).items():
        ts = list(treatments)
        figures[f"strengthen_{slug(pair)}"] = Plot(
            "bar_plot", (ts, {"clean": [res[t]["clean"] for t in ts],
                              "selected": [res[t]["selected"]["accuracy"] for t in ts],
                              "random": [res[t]["random_mean"] for t in ts]},
                         f"{pair}: held-out composite accuracy", "accuracy"),
            {"errors": {"random": [res[t]["random_std"] for t in ts]}})
    return figures
