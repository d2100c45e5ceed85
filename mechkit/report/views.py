"""Interactive views in a report: every layer × head heatmap also as a grid to hover and click.

:func:`~mechkit.report.plots.head_heatmap` keeps the numbers it drew on its figure (a :class:`HeadGrid`);
the runner collects them with :func:`views_of` into the report's optional ``views`` key::

    "views": {"grids": {"induction_scores.png": {"title", "label", "values", "highlight", "patterns": "p0"}},
              "patterns": {"p0": {mechkit.patterns/v1, see mechkit.report.patterns}}}

and the page (and the notebook view) draws each grid beside its PNG: hover shows the head and its
value; where the plugin recorded patterns (detect: every head on the first detection sequence) a click
opens that head's pattern. So no plugin writes HTML, and a new plugin's heatmaps are interactive too.

Drawing is one hand-written script, ``viewer.js`` (package data, ~210 lines, embedded inline): plain
SVG, because a grid of 270 cells and a pattern of ~1,300 are few enough for DOM elements, which stay
sharp at any zoom, print, and can be read back by a test. A charting library would be the larger part
of every page (plotly's standalone bundle is ~3 MB) and loaded from a CDN it would go blank offline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from html import escape
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy loads only when patterns are drawn: importing the report layer stays cheap
    from mechkit.report.patterns import Patterns

CSS = """
.mk-pair{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start;margin:1em 0}
.mk-pair>figure{flex:0 1 400px;margin:0;min-width:0}
.mk-view{flex:1 1 300px;max-width:100%;overflow-x:auto;font-size:12px}
.mk-panels{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}
.mk-info{font-variant-numeric:tabular-nums;color:#333;min-height:1.5em;font-weight:600}
.mk-title{color:#666;margin:.2em 0;max-width:520px}
.mk-view svg{display:block;font:9px ui-monospace,monospace;fill:#555}
.mk-grid rect{cursor:pointer;stroke:#fff;stroke-width:.5}.mk-grid rect:hover{stroke:#000;stroke-width:1.5}
.mk-grid rect.mk-marked{stroke:#d62728;stroke-width:1.5}.mk-grid rect.mk-pinned{stroke:#000;stroke-width:2.5}
.mk-pattern rect[data-q]{cursor:pointer}
.mk-view select{font:inherit;margin:.2em 0}
.mk-text{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap}
.mk-line{border-bottom:1px solid #eee}.mk-who{display:inline-block;width:4em;color:#666;font-size:11px}
.mk-tok{cursor:pointer;border-radius:2px}.mk-view .mk-tok[title]{text-decoration:none;cursor:pointer}
.mk-q{outline:2px solid #e8590c}
"""


@dataclass
class HeadGrid:
    """A layer × head grid as the page draws it: the values (``None`` blank), their label, the outlined
    heads, and optionally the patterns a click opens."""

    values: list[list[float | None]]
    title: str
    label: str = "value"
    highlight: list[tuple[int, int]] = field(default_factory=list)
    patterns: Patterns | None = None
    text: bool = False  # also the prompt as text, tinted per head, and a head picker (the attention view)

    def to_json(self) -> dict[str, Any]:
        values = [[None if v is None or not math.isfinite(float(v)) else float(v) for v in row] for row in self.values]
        out = {"title": self.title, "label": self.label, "values": values,
               "highlight": [[int(a), int(b)] for a, b in self.highlight]}
        return {**out, "text": True} if self.text else out


def png_name(name: str) -> str:
    """The file a figure named ``name`` is saved as: ``heat`` and ``heat.png`` are both ``heat.png``.

    >>> png_name("heat"), png_name("heat.PNG")
    ('heat.png', 'heat.PNG')
    """
    if not isinstance(name, str):  # refused by the writer's name check, named as given
        return name
    return name if name.lower().endswith(".png") else f"{name}.png"


def views_of(figures: Mapping[str, Any]) -> dict | None:
    """The ``views`` of a report from its figures (those that carry a :class:`HeadGrid` as
    ``mechkit_grid``); patterns shared by several grids are stored once. ``None`` when there are none."""
    grids: dict[str, dict] = {}
    patterns: dict[str, dict] = {}
    keys: dict[int, str] = {}
    for name, fig in figures.items():
        grid = getattr(fig, "mechkit_grid", None)
        if not isinstance(grid, HeadGrid):
            continue
        entry = grid.to_json()
        if grid.patterns is not None:
            key = keys.setdefault(id(grid.patterns), f"p{len(keys)}")
            patterns.setdefault(key, grid.patterns.to_json())
            entry["patterns"] = key
        grids[png_name(name)] = entry
    return {"grids": grids, "patterns": patterns} if grids else None


MAX_CELLS = 250_000
"""Most cells a grid of a read-back report may hold (a 128-layer × 2,048-position residual map fits); a
crafted larger one is left out, not drawn for minutes."""


def sane(views: Any) -> dict | None:
    """The well-formed part of a report's ``views`` as read back from disk, ``None`` when nothing is.

    A report.json may be crafted or damaged, and the grids are an extra beside the PNGs: a grid that is not
    a list of rows of numbers (or blanks), that is larger than :data:`MAX_CELLS`, or whose fields have the
    wrong types is left out, so the page still renders, with its figures, instead of raising.

    >>> sane({"grids": {"a.png": {"values": [[1, None]], "title": "t", "patterns": "p9"}, "b.png": "x"}})
    {'grids': {'a.png': {'title': 't', 'label': 'value', 'values': [[1.0, None]], 'highlight': []}}, 'patterns': {}}
    >>> sane([1, 2]) is None
    True
    """
    if not isinstance(views, Mapping) or not isinstance(views.get("grids"), Mapping):
        return None
    patterns = views.get("patterns") if isinstance(views.get("patterns"), Mapping) else {}
    grids, used = {}, {}
    for name, grid in views["grids"].items():
        entry = _sane_grid(grid)
        if not isinstance(name, str) or entry is None:
            continue
        key = grid.get("patterns")
        if isinstance(key, str) and isinstance(patterns.get(key), Mapping):
            entry["patterns"], used[key] = key, patterns[key]
            if grid.get("text") is True:
                entry["text"] = True
        grids[name] = entry
    return {"grids": grids, "patterns": used} if grids else None


def _sane_grid(grid: Any) -> dict | None:
    """One grid's fields checked and copied (see :func:`sane`), or ``None``."""
    if not isinstance(grid, Mapping):
        return None
    rows = grid.get("values")
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows) or \
            sum(len(r) for r in rows) > MAX_CELLS:
        return None
    if not all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for r in rows for v in r):
        return None
    pairs = grid.get("highlight") if isinstance(grid.get("highlight"), list) else []
    highlight = [[a, b] for a, b in (p for p in pairs if isinstance(p, list) and len(p) == 2)
                 if isinstance(a, int) and isinstance(b, int)]
    text = lambda key, default: grid[key] if isinstance(grid.get(key), str) else default  # noqa: E731
    return {"title": text("title", ""), "label": text("label", "value"),
            "values": [[None if v is None or not math.isfinite(v) else float(v) for v in r] for r in rows],
            "highlight": highlight}


def json_script(data: Any, attrs: str = "") -> str:
    """``data`` as an inert JSON block (``<`` escaped, so no text in it can close the script)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    return f'<script type="application/json"{attrs}>{text}</script>'


def view_html(spec: dict) -> str:
    """One view: an empty box the script draws into, holding its spec (grid, patterns key, first head)."""
    return f'<div class="mk-view scroll">{json_script(spec)}</div>'


def grid_html(views: dict | None, name: str) -> str:
    """The interactive grid of figure ``name``, or "" when the report keeps none for it."""
    grid = ((views or {}).get("grids") or {}).get(name)
    if not grid:
        return ""
    spec: dict[str, Any] = {"grid": {k: v for k, v in grid.items() if k not in ("patterns", "text")}}
    if grid.get("patterns"):
        spec["patterns"] = grid["patterns"]
        spec["pick"] = _best(grid["values"])
        spec["text"] = bool(grid.get("text"))
    return view_html(spec)


def _best(values: Sequence[Sequence[float | None]]) -> str | None:
    """The highest-valued head (what a reader wants to see first: the strongest induction head)."""
    cells = [(v, f"{layer}.{h}") for layer, row in enumerate(values) for h, v in enumerate(row) if v is not None]
    return max(cells, key=lambda c: c[0])[1] if cells else None


def data_html(views: dict | None) -> str:
    """The shared pattern blocks and the script, once per page or notebook output ("" without views)."""
    if not views or not views.get("grids"):
        return ""
    blocks = [json_script(p, f' data-mk-patterns="{escape(key, quote=True)}"')
              for key, p in (views.get("patterns") or {}).items()]
    return "".join(blocks) + script_html()


@lru_cache(maxsize=1)
def viewer_js() -> str:
    """The view script (``mechkit/report/viewer.js``)."""
    return resources.files("mechkit.report").joinpath("viewer.js").read_text(encoding="utf-8")


def script_html() -> str:
    return f"<script>{viewer_js()}</script>"


__all__ = ["CSS", "MAX_CELLS", "HeadGrid", "data_html", "grid_html", "json_script", "png_name", "sane", "script_html",
           "view_html", "views_of", "viewer_js"]
