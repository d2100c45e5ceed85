"""Reports: every run leaves ``report.json`` (schema ``mechkit.report/v1``), ``report.html`` and its figures.

Importing this package stays cheap — no torch, no matplotlib: the plot functions load on first use.

>>> import tempfile, pathlib
>>> from mechkit.report import build_report, head_heatmap, load_report, write_report
>>> report = build_report(plugin="probe", plugin_version="0.1", model={"spec": "tiny:llama"},
...                       params={"k": 2}, seed=0, results={"score": 0.5}, artifacts=[], timings={"run_s": 1.2})
>>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> _ = write_report(out, report, figures={"heatmap": head_heatmap([[0.1, 0.9], [0.4, 0.2]], "score")})
>>> sorted(p.name for p in out.iterdir())
['heatmap.png', 'report.html', 'report.json']
>>> load_report(out)["results"]
{'score': 0.5}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mechkit.report.html import render_html
from mechkit.report.schema import SCHEMA, build_report, to_jsonable, validate_report
from mechkit.report.show import load_report, print_summary, summary_table
from mechkit.report.writer import default_out_dir, write_report

if TYPE_CHECKING:
    from mechkit.report.plots import bar_plot, head_heatmap, line_plot, xy_plot

_PLOTS = ("head_heatmap", "line_plot", "bar_plot", "xy_plot")

__all__ = [
    "SCHEMA",
    "bar_plot",
    "build_report",
    "default_out_dir",
    "head_heatmap",
    "line_plot",
    "xy_plot",
    "load_report",
    "print_summary",
    "render_html",
    "summary_table",
    "to_jsonable",
    "validate_report",
    "write_report",
]


def __getattr__(name: str) -> Any:
    # The plots import matplotlib (~0.3 s) only when a figure is actually made.
    if name in _PLOTS:
        from mechkit.report import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PLOTS))
