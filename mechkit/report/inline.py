"""A report where the reader already is: inline in a notebook, or in a few lines at a Python prompt.

:func:`render_fragment` is the top of ``report.html`` (finding, headline figure, tables, other figures)
as one HTML fragment for Jupyter's ``_repr_html_``: its CSS scoped to one ``div`` so the notebook's own
styles are left alone, its PNGs as data URIs, nothing fetched from anywhere. :func:`report_text` is the
report's ``repr``: plugin, model, finding and where it was written — a few lines, never the results.

>>> report = {"plugin": "probe", "plugin_version": "0.1", "model": {"spec": "tiny:llama"}, "seed": 0,
...           "finding": "Head 1.3 copies the token after the last match.", "results": {"score": 0.5}}
>>> print(report_text(report, where=None))
probe 0.1 on tiny:llama, seed 0
  finding: Head 1.3 copies the token after the last match.
  results: score
  report: not written (write=False)
>>> "Head 1.3 copies" in render_fragment(report, {})
True
"""

from __future__ import annotations

import re
import textwrap
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.report.html import CSS, details_html, kv_html, model_line, seconds, top_sections

if TYPE_CHECKING:
    from mechkit.report.table import Table

SCOPE = "mechkit-report"
_FINDING_CHARS = 320


def scoped_css(css: str = CSS, scope: str = SCOPE) -> str:
    """The page's CSS with every selector under ``.scope`` (``body`` becomes the scope itself).

    >>> scoped_css("body{margin:0}h1,td.num{color:red}", "r")
    '.r{margin:0}\\n.r h1,.r td.num{color:red}'
    """
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        scoped = [f".{scope}" if s.strip() == "body" else f".{scope} {s.strip()}" for s in selectors.split(",")]
        rules.append(f"{','.join(scoped)}{{{body}}}")
    return "\n".join(rules)


def report_images(out_dir: str | Path | None, report: dict) -> dict[str, bytes]:
    """The PNG artifacts of a written run, read from its directory: only its own files
    (:func:`mechkit.report.artifact_files.own_png`: no symlink, no FIFO, a real PNG of at most 8 MiB); the
    others, and those missing there, are skipped."""
    if out_dir is None:
        return {}
    from mechkit.report.artifact_files import own_pngs

    return own_pngs(out_dir, report.get("artifacts") or [])


def render_fragment(report: dict, images: dict[str, bytes], tables: list[Table] | None = None,
                    where: str | Path | None = None) -> str:
    """The report as an HTML fragment for a notebook cell: the page's top sections, then parameters and
    timings collapsed, and where the full report is."""
    parts = [f'<div class="{SCOPE} mk-scope"><style>{scoped_css()}</style>', *top_sections(report, images, tables),
             details_html("Parameters", kv_html(report.get("params") or {})),
             details_html("Timings", kv_html(seconds(report.get("timings") or {})))]
    if where is not None:
        parts.append(f'<p class="muted">full report: <code>{escape(str(Path(where) / "report.html"))}</code> '
                     f"· results: <code>run.results</code></p>")
    else:
        parts.append('<p class="muted">not written (<code>write=False</code>) · results: '
                     "<code>run.results</code></p>")
    parts.append("</div>")
    return "\n".join(parts)


def report_text(report: dict, where: str | Path | None) -> str:
    """A run in a few lines: what ran on which model, the finding (shortened), the result keys, where it is."""
    lines = [f"{report.get('plugin', '?')} {report.get('plugin_version', '')} on {model_line(report)}, "
             f"seed {report.get('seed', '—')}"]
    finding = str(report.get("finding") or "")
    if finding:
        lines += textwrap.wrap(textwrap.shorten(finding, _FINDING_CHARS, placeholder=" …"), 100,
                               initial_indent="  finding: ", subsequent_indent="    ")
    keys = list(report.get("results") or {})
    shown = ", ".join(keys[:8]) + (f", … ({len(keys) - 8} more)" if len(keys) > 8 else "")
    lines += textwrap.wrap(shown or "(none)", 100, initial_indent="  results: ", subsequent_indent="    ")
    lines.append(f"  report: {Path(where) / 'report.html'}" if where is not None else "  report: not written (write=False)")
    return "\n".join(lines)


__all__ = ["render_fragment", "report_images", "report_text", "scoped_css"]
