"""What a select-tasks report says: the finding sentence, the tables and the two figures.

The tables are the plugin's (``mechkit.plugins.select_tasks``): reports sit above the analyses.
"""

from __future__ import annotations

from typing import Any


def _pm(cell: dict | None) -> str:
    return "—" if not cell else f"{cell['mean']:.2f} ± {cell['std']:.2f}"


def finding(results: dict) -> str:
    """One sentence per target on the selection; with validation, Selected against the others, and ρ."""
    parts = []
    for target, r in results["targets"].items():
        s = r["selection"]
        parts.append(f"For {target}, Algorithm 1 ({results['features']['representation']}, p={s['p']:g}) selects "
                     f"{', '.join(s['selected'])} ({len(s['selected'])} of {len(s['order'])} candidates; "
                     f"{s['stop']})")
    text = "; ".join(parts) + "."
    table = results.get("table") or {}
    if table:
        col = results["columns"][0]
        rows = []
        for target, row in table.items():
            rows.append(f"{target}: Selected {_pm(row.get('Selected', {}).get(col))}, All "
                        f"{_pm(row.get('All', {}).get(col))}, Random {_pm(row.get('Random', {}).get(col))}, "
                        f"None {_pm(row.get('None', {}).get(col))}")
        text += f" Target {col} exact match after fine-tuning (mean ± std over seeds): " + "; ".join(rows) + "."
    rho = _rho_line(results)
    if rho:
        text += " " + rho
    return text


def _rho_line(results: dict) -> str:
    rep, col = results["features"]["representation"], (results.get("columns") or [""])[0]
    vals = [(t, (r.get("transfer") or {}).get("rho", {}).get(f"{rep} | {col}")) for t, r in results["targets"].items()]
    vals = [(t, v) for t, v in vals if v]
    if not vals:
        return ""
    return ("Spearman ρ of single-candidate gain with similarity / coverage (" + rep + ", " + col + "): "
            + "; ".join(f"{t} {_num(v['similarity'])} / {_num(v['coverage'])}" for t, v in vals) + ".")


def _num(x: Any) -> str:
    return "—" if x is None else f"{x:.2f}"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def coverage_figure(results: dict):
    """Seed 000 Figure 8.1(b): coverage as candidates are added in similarity order (relative to the
    first), one line per target; the selected prefix is drawn solid, the rest dashed."""
    fig = _figure(6.4, 4.0)
    ax = fig.add_subplot()
    for target, r in results["targets"].items():
        s = r["selection"]
        curve = [c / s["curve"][0] for c in s["curve"]]
        k = len(s["selected"])
        line, = ax.plot(range(1, k + 1), curve[:k], marker="o", label=f"{target} (selects {k})")
        ax.plot(range(k, len(curve) + 1), curve[k - 1:], linestyle="--", color=line.get_color())
    ax.set_xlabel("candidates added, most similar first")
    ax.set_ylabel("coverage / coverage of the first")
    ax.set_title("Coverage as tasks are added (Algorithm 1)")
    ax.legend(fontsize=8)
    return fig


def heatmap_figure(names: list[str], cosine: list[list[float]], title: str):
    """The task × task cosine similarity of the representation's vectors."""
    fig = _figure(7.5, 6.5)
    ax = fig.add_subplot()
    image = ax.imshow(cosine, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="cosine similarity")
    return fig


__all__ = ["coverage_figure", "finding", "heatmap_figure"]
