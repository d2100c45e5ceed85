"""The three figures reports need: a layer × head heatmap, curves with error bars, grouped bars.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, never through pyplot: that
keeps them out of pyplot's global registry (no leaked figures across a sweep), works on headless
machines, and leaves a notebook user's chosen backend alone. matplotlib is imported inside each
function because importing it costs ~0.3 s that ``mechkit --help`` should not pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from mechkit.report.patterns import Patterns


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _integer_ticks(axis: Any, n: int) -> None:
    from matplotlib.ticker import MaxNLocator

    if n <= 40:  # every layer/head labelled while it still fits
        axis.set_ticks(range(n))
    else:
        axis.set_major_locator(MaxNLocator(integer=True))


def head_heatmap(
    scores: Sequence[Sequence[float]] | Any,
    title: str,
    cbar_label: str = "score",
    highlight: Sequence[tuple[int, int]] | None = None,
    xlabels: Sequence[str] | None = None,
    xlabel: str = "head",
    patterns: Patterns | None = None,
) -> Figure:
    """Heatmap of per-head scores: layer on the y axis (layer 0 at the top), head on the x axis.

    ``xlabels``/``xlabel`` label the columns otherwise (a layer × position map: the tokens).

    ``highlight`` boxes the given ``(layer, head)`` cells, e.g. the heads an ablation removed.
    Missing scores (``None``/NaN) are left blank.

    A layer × head figure also keeps its numbers as ``fig.mechkit_grid`` (a
    :class:`~mechkit.report.views.HeadGrid`), which a report page draws beside the PNG as a grid to hover;
    with ``patterns`` (:class:`~mechkit.report.patterns.Patterns`) a click there opens a head's pattern.

    >>> fig = head_heatmap([[0.1, 0.9], [0.3, 0.2]], "induction score", highlight=[(0, 1)])
    """
    import numpy as np
    from matplotlib.patches import Rectangle

    grid = np.array(scores, dtype=float)
    if grid.ndim != 2 or 0 in grid.shape:
        raise ValueError(f"head_heatmap needs a non-empty [layers, heads] grid, got shape {grid.shape}")
    n_layers, n_heads = grid.shape
    fig = _figure(min(12.0, max(4.0, 2.0 + 0.4 * n_heads)), min(11.0, max(3.0, 1.2 + 0.24 * n_layers)))
    ax = fig.add_subplot()
    image = ax.imshow(
        np.ma.masked_invalid(grid), aspect="auto", origin="upper", interpolation="nearest", cmap="viridis"
    )
    if xlabels is not None:
        ax.set_xticks(range(n_heads), [repr(t)[1:-1] for t in xlabels], rotation=60, ha="right")
    else:
        _integer_ticks(ax.xaxis, n_heads)
    _integer_ticks(ax.yaxis, n_layers)
    ax.tick_params(labelsize=7 if max(n_layers, n_heads) > 16 else 9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=cbar_label)
    for layer, head in highlight or ():
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"highlight {layer}.{head} is outside the {n_layers} × {n_heads} grid")
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    if xlabels is None and xlabel == "head":  # a layer × head grid (not a layer × position map)
        from mechkit.report.views import HeadGrid

        fig.mechkit_grid = HeadGrid(grid.tolist(), title, cbar_label, [tuple(h) for h in highlight or ()], patterns)
    return fig


def _check_lengths(kind: str, n: int, series: dict[str, Sequence[float]], errors: dict | None) -> None:
    for name, values in {**series, **(errors or {})}.items():
        if len(values) != n:
            raise ValueError(f"{kind} series {name!r} has {len(values)} values for {n} points")


def _floats(values: Sequence[float | None] | None) -> list[float] | None:
    """Reports store NaN as ``None``; matplotlib wants NaN back so it draws a gap."""
    if values is None:
        return None
    return [float("nan") if v is None else float(v) for v in values]


def line_plot(
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    title: str,
    xlabel: str,
    ylabel: str,
    errors: dict[str, Sequence[float]] | None = None,
    groups: dict[str, tuple[int, str]] | None = None,
) -> Figure:
    """One line per series over ``x`` (e.g. accuracy vs. number of ablated heads k), with optional
    error bars from ``errors[name]`` (e.g. the std over random-head seeds). ``groups`` maps a
    series to (colour index, line style), so related series (one task's target and random
    curves) share a colour; the legend then sits outside the axes.

    >>> fig = line_plot([0, 1, 2], {"target": [0.9, 0.5, 0.2]}, "ablation", "k", "accuracy")
    """
    xs = list(x)
    _check_lengths("line_plot", len(xs), series, errors)
    fig = _figure(7.5 if groups else 6.0, 4.0)
    ax = fig.add_subplot()
    for name, values in series.items():
        yerr = _floats((errors or {}).get(name))
        style = {}
        if groups and name in groups:
            colour, linestyle = groups[name]
            style = {"color": f"C{colour}", "linestyle": linestyle}
        ax.errorbar(xs, _floats(values), yerr=yerr, marker="o", markersize=4, capsize=3, label=name, **style)
    if xs and all(float(v).is_integer() for v in xs):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series and groups:
        ax.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif series:
        ax.legend(frameon=False)
    return fig


def bar_plot(
    categories: Sequence[str],
    series: dict[str, Sequence[float]],
    title: str,
    ylabel: str,
    errors: dict[str, Sequence[float]] | None = None,
) -> Figure:
    """Grouped bars: one group per category (e.g. task), one bar per series (e.g. condition).

    >>> fig = bar_plot(["capitalize", "swap"], {"clean": [0.9, 0.8], "target": [0.1, 0.2]},
    ...                "accuracy by task", "accuracy")
    """
    cats = [str(c) for c in categories]
    _check_lengths("bar_plot", len(cats), series, errors)
    n = max(len(series), 1)
    fig = _figure(min(14.0, max(5.0, 1.0 + 0.25 * n * len(cats) + 0.4 * len(cats))), 4.0)
    ax = fig.add_subplot()
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        positions = [c + (i - (n - 1) / 2) * width for c in range(len(cats))]
        yerr = _floats((errors or {}).get(name))
        ax.bar(positions, _floats(values), width, yerr=yerr, capsize=3 if yerr is not None else 0, label=name)
    ax.set_xticks(range(len(cats)))
    long_labels = sum(len(c) for c in cats) > 60
    ax.set_xticklabels(cats, rotation=30 if long_labels else 0, ha="right" if long_labels else "center")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(frameon=False)
    return fig


def xy_plot(
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    reference: tuple[float, float] | None = None,
) -> Figure:
    """Lines with their own x values (e.g. accuracy against speedup, one line per method);
    ``reference`` marks one point (the dense model) with a star."""
    fig = _figure(6.4, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    for name, (xs, ys) in series.items():
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        ax.plot([xs[i] for i in order], _floats([ys[i] for i in order]), marker="o", label=name)
    if reference is not None:
        ax.plot([reference[0]], [reference[1]], marker="*", markersize=14, color="black", linestyle="none",
                label="dense")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def draw(plot: Any) -> Figure:
    """Draw an analysis' :class:`~mechkit.eval.figures.Plot`: the plot function it names, with its arguments."""
    if plot.kind not in ("head_heatmap", "line_plot", "bar_plot", "xy_plot"):
        raise ValueError(f"unknown plot kind {plot.kind!r}")
    return globals()[plot.kind](*plot.args, **plot.kwargs)
