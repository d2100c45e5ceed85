"""Reports: every run leaves ``report.json`` (schema ``mechkit.report/v1``), ``report.html`` and its figures.

A report reads top down: the plugin's finding (one or two sentences with the numbers), the headline
figure, the plugin's tables (:class:`Table`), then parameters, environment and raw results.

Importing this package stays cheap — no torch, no matplotlib: the plot functions load on first use.

>>> import tempfile, pathlib
>>> from mechkit.report import build_report, head_heatmap, load_report, write_report
>>> report = build_report(plugin="probe", plugin_version="0.1", model={"spec": "tiny:llama"},
...                       params={"k": 2}, seed=0, results={"score": 0.5}, artifacts=[], timings={"run_s": 1.2})
>>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> _ = write_report(out, report, figures={"heatmap": head_heatmap([[0.1, 0.9], [0.4, 0.2]], "score")})
>>> sorted(p.name for p in out.iterdir())      # .mechkit-files: the names mechkit wrote (what --force replaces)
['.mechkit-files', 'heatmap.png', 'report.html', 'report.json']
>>> load_report(out)["results"]
{'score': 0.5}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mechkit.report.compare import Comparison, compare_runs, print_compare, render_compare_html, write_compare
from mechkit.report.html import render_html
from mechkit.report.schema import SCHEMA, build_report, to_jsonable, validate_report
from mechkit.report.show import load_report, print_summary, rich_table, summary_table
from mechkit.report.table import Table, compare_tables, generic_tables, kv_table, plugin_tables, pm, pm_of
from mechkit.report.writer import default_out_dir, write_report

if TYPE_CHECKING:
    from mechkit.report.attention_view import AttentionView, show_attention
    from mechkit.report.patterns import Patterns, record_patterns
    from mechkit.report.plots import bar_plot, head_heatmap, line_plot, xy_plot

_PLOTS = ("head_heatmap", "line_plot", "bar_plot", "xy_plot", "draw")
# Attention patterns and their viewer (numpy, and torch to record): loaded on first use as well.
_LAZY = {"Patterns": "patterns", "record_patterns": "patterns", "AttentionView": "attention_view",
         "show_attention": "attention_view"}

__all__ = [
    "SCHEMA",
    "AttentionView",
    "Comparison",
    "Patterns",
    "Table",
    "bar_plot",
    "build_report",
    "compare_runs",
    "compare_tables",
    "default_out_dir",
    "draw",
    "generic_tables",
    "head_heatmap",
    "kv_table",
    "line_plot",
    "plugin_tables",
    "xy_plot",
    "load_report",
    "pm",
    "pm_of",
    "print_compare",
    "print_summary",
    "record_patterns",
    "render_compare_html",
    "render_html",
    "rich_table",
    "show_attention",
    "summary_table",
    "to_jsonable",
    "validate_report",
    "write_compare",
    "write_report",
]


def __getattr__(name: str) -> Any:
    # The plots import matplotlib (~0.3 s) only when a figure is actually made.
    if name in _PLOTS:
        from mechkit.report import plots

        return getattr(plots, name)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mechkit.report.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PLOTS) | set(_LAZY))
