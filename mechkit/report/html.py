"""``report.html``: one self-contained page rendered from the same data as ``report.json``.

The page reads top down the way a researcher asks: what was found (the plugin's ``finding``
sentence, numbers included), the headline figure (the first one the plugin made), the plugin's
tables (:class:`~mechkit.report.table.Table` pivots, numbers rounded per table, long head lists
shortened with the full list on hover), the other figures; then parameters, model, raw results,
timings and environment, each collapsed. The page must open from a laptop's file browser, an
e-mail attachment or an air-gapped cluster, so it carries its CSS inline and its PNGs as base64
data URIs and references nothing outside itself. At 1280 px nothing scrolls sideways: figures
shrink to the column, text breaks anywhere it must, and a table wider than the column scrolls
inside its own box.
"""

from __future__ import annotations

import base64
import json
from html import escape
from typing import Any

from mechkit.report import values, views
from mechkit.report.table import Table, cell_text, generic_tables, is_value

CSS = views.CSS + """
*,*::before,*::after{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;max-width:1120px;margin:0 auto;
padding:1.5em 2em;overflow-wrap:anywhere}
h1{font-size:1.6em;margin:0 0 .1em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3,h4,h5,h6{font-size:1em;margin:1.2em 0 .4em}.muted{color:#666}code{font-family:ui-monospace,monospace}
.meta{color:#555;margin:0 0 1em}
.finding{font-size:1.15em;line-height:1.5;border-left:4px solid #3b6fd6;background:#f3f6fd;padding:.6em 1em;margin:1em 0}
.scroll{max-width:100%;overflow-x:auto;margin:.4em 0 1em}
table{border-collapse:collapse;font-size:13.5px}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top;overflow-wrap:normal}
th{background:#f5f5f7;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.txt{max-width:28em;overflow-wrap:anywhere}
[title]{text-decoration:underline dotted #999;cursor:help}
.note{color:#666;font-size:13px;margin:-.6em 0 1em}
figure{margin:1em 0;max-width:100%}figure img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#666;font-size:12px}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,480px),1fr));gap:1em}
.figs figure{margin:0}
details{margin:.5em 0;border:1px solid #e5e5e5;border-radius:6px;padding:.3em .8em}
summary{cursor:pointer;font-weight:600}
pre{background:#f5f5f7;padding:.6em;overflow-x:auto;font-size:12px;white-space:pre-wrap}
"""

_MAX_ROWS = 200
_MAX_DEPTH = 6


def render_html(report: dict, images: dict[str, bytes], tables: list[Table] | None = None) -> str:
    """Return the report as one HTML page; ``images`` maps artifact file names to PNG bytes and
    ``tables`` are the plugin's (default: :func:`~mechkit.report.table.generic_tables` of the results)."""
    results = report.get("results") or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_escape(report.get('plugin', 'mechkit'))} — mechkit report</title>",
        f'<style>{CSS}</style></head><body class="mk-scope">',
        *top_sections(report, images, tables),
    ]
    others = [a for a in report.get("artifacts") or [] if a not in images]
    parts.append("<h2>Details</h2>")
    if others:
        parts.append(_details("Files", "<ul>" + "".join(f"<li><code>{_escape(a)}</code></li>" for a in others) + "</ul>"))
    parts.append(_details("Parameters", _kv_table(report.get("params") or {})))
    parts.append(_details("Model", _model_card(report)))
    parts.append(_details("Raw results", _block(results, 3)))
    parts.append(_details("Timings and environment", _kv_table(_seconds(report.get("timings") or {}))
                          + _kv_table(report.get("environment") or {})))
    parts.append(f'<p class="muted">schema <code>{_escape(report.get("schema", ""))}</code> · full results in '
                 "<code>report.json</code></p>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def top_sections(report: dict, images: dict[str, bytes], tables: list[Table] | None = None) -> list[str]:
    """What a reader reads first, in order: the header, the finding, the headline figure, the tables, the
    other figures. The page and the notebook view (:mod:`mechkit.report.inline`) both start with these.
    A figure the report keeps a layer × head grid for (``report["views"]``, :mod:`mechkit.report.views`)
    gets that grid beside it, to hover and click; the script and shared patterns come last, once."""
    tables = generic_tables(report.get("results") or {}) if tables is None else tables
    names = [a for a in report.get("artifacts") or [] if a in images] + \
        [n for n in images if n not in (report.get("artifacts") or [])]
    shown = views.sane(report.get("views"))  # a crafted or damaged report.json renders without its grids
    parts = [_header(report)]
    if report.get("finding"):
        parts.append(f'<p class="finding">{_escape(report["finding"])}</p>')
    if names:
        parts.append(_with_grid(shown, names[0], figure_html(names[0], images[names[0]], headline=True)))
    if tables:
        parts += ["<h2>Results</h2>", *(table_html(t) for t in tables)]
    if len(names) > 1:
        parts += ["<h2>More figures</h2>", '<div class="figs">'
                  + "".join(_with_grid(shown, n, figure_html(n, images[n])) for n in names[1:]) + "</div>"]
    parts.append(views.data_html(shown if any(n in (shown or {}).get("grids", {}) for n in names) else None))
    return parts


def _with_grid(shown: dict | None, name: str, figure: str) -> str:
    """The figure, and beside it its interactive grid where the report keeps one."""
    grid = views.grid_html(shown, name)
    return f'<div class="mk-pair">{figure}{grid}</div>' if grid else figure


def details_html(summary: str, body: str) -> str:
    """A collapsed section: ``summary`` shown, ``body`` on a click."""
    return _details(summary, body)


def kv_html(d: dict) -> str:
    """A two-column key/value table."""
    return _kv_table(d)


def seconds(timings: dict) -> dict:
    """Timings as people read them: ``2.31 s``, ``1,024 MB``."""
    return _seconds(timings)


def table_html(t: Table) -> str:
    """One table: its title, the table in its own horizontally scrolling box, and its note."""
    head = "".join(f"<th>{_escape(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows[:_MAX_ROWS]:
        cells = []
        for j, v in enumerate(row):
            text, full = cell_text(v, t.digits)
            inner = f'<span title="{_escape(full)}">{_escape(text)}</span>' if full else _escape(text)
            if j == 0:
                cells.append(f"<th>{inner}</th>")
            else:
                cells.append(f'<td class="{"num" if is_value(v) or v is None else "txt"}">{inner}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    more = len(t.rows) - _MAX_ROWS
    note = t.note + (f" … {more} more rows in report.json" if more > 0 else "")
    return (f"<h3>{_escape(t.title)}</h3><div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>" + (f'<p class="note">{_escape(note)}</p>' if note else ""))


def figure_html(name: str, png: bytes, headline: bool = False, caption: str | None = None) -> str:
    data = base64.b64encode(png).decode("ascii")
    cls = ' class="headline"' if headline else ""
    return (f'<figure{cls}><img src="data:image/png;base64,{data}" alt="{_escape(name)}">'
            f"<figcaption>{_escape(caption or name)}</figcaption></figure>")


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{_escape(summary)}</summary>{body}</details>"


def _escape(v: Any) -> str:
    return escape(str(v), quote=True)


def model_line(report: dict) -> str:
    """``tiny:llama · LlamaForCausalLM · 2 layers × 4 heads (2 KV) · float32 on cpu`` — the model in one line."""
    model = report.get("model") or {}
    parts = [str(model.get("name") or model.get("spec") or "unknown model")]
    if model.get("architecture") and model["architecture"] != parts[0]:
        parts.append(str(model["architecture"]))
    shape = []
    if "n_layers" in model:
        shape.append(f"{model['n_layers']} layers")
    if "n_heads" in model:
        kv = model.get("n_kv_heads")
        shape.append(f"{model['n_heads']} heads" + (f" ({kv} KV)" if kv not in (None, model["n_heads"]) else ""))
    if shape:
        parts.append(" × ".join(shape))
    device = " on ".join(str(model[k]) for k in ("dtype", "device") if model.get(k))
    if device:
        parts.append(device)
    return " · ".join(parts)


def _header(report: dict) -> str:
    return (f'<h1>{_escape(report.get("plugin", "?"))} <span class="muted">{_escape(report.get("plugin_version", ""))}'
            f'</span></h1><p class="meta">{_escape(model_line(report))} · seed {_escape(report.get("seed", "—"))} · '
            f'{_escape(report.get("created", ""))} · mechkit {_escape(report.get("mechkit_version", ""))}</p>')


def _model_card(report: dict) -> str:
    model = report.get("model") or {}
    return _kv_table(model) if model else '<p class="muted">(none)</p>'


def _block(v: Any, depth: int) -> str:
    """Render any JSON value; ``depth`` is the heading level for nested sections."""
    if depth > 3 + _MAX_DEPTH:
        return f"<pre>{_escape(json.dumps(v, indent=1, ensure_ascii=False))}</pre>"
    if isinstance(v, dict):
        if _is_grid(v):
            return _grid_table(v)
        return _dict_block(v, depth)
    if isinstance(v, list):
        if not v:
            return '<p class="muted">(empty)</p>'
        shape = values.numeric_shape(v)
        if shape and len(shape) >= 2:
            return f"<p>array {_escape(values.array_summary(v))}</p>"
        if values.is_head_list(v):
            return f"<p>{_cell_span(v)}</p>"
        if all(values.is_scalar(x) for x in v):
            more = f" … ({len(v) - 50} more)" if len(v) > 50 else ""
            return f"<p>{_escape(values.cell(v[:50] if more else v, width=2000))}{_escape(more)}</p>"
        if all(isinstance(x, dict) for x in v):
            return _records_table(v)
        return "".join(f"<h{_h(depth)}>[{i}]</h{_h(depth)}>{_block(x, depth + 1)}" for i, x in enumerate(v))
    return f"<p>{_escape(values.fmt(v))}</p>"


def _dict_block(d: dict, depth: int) -> str:
    simple = {k: v for k, v in d.items() if values.is_cell_value(v)}
    out = [_kv_table(simple)] if simple else []
    for k, v in d.items():
        if k not in simple:
            out.append(f"<h{_h(depth)}>{_escape(k)}</h{_h(depth)}>{_block(v, depth + 1)}")
    return "".join(out) or '<p class="muted">(empty)</p>'


def _h(depth: int) -> int:
    return min(depth, 6)


def _kv_table(d: dict) -> str:
    if not d:
        return '<p class="muted">(none)</p>'
    rows = []
    for k, v in d.items():
        td = _num_td(v) if values.is_number(v) else f'<td class="txt">{_cell_span(v, 200)}</td>'
        rows.append(f"<tr><th>{_escape(k)}</th>{td}</tr>")
    return f"<div class=\"scroll\"><table>{''.join(rows)}</table></div>"


def _cell_span(v: Any, width: int = 80) -> str:
    """A raw value as cell text; head lists shortened, the full list on hover."""
    if values.is_head_list(v):
        text, full = cell_text(v)
        return f'<span title="{_escape(full)}">{_escape(text)}</span>' if full else _escape(text)
    return _escape(values.cell(v, width=width))


def _num_td(v: Any) -> str:
    return f'<td class="num">{_escape(values.fmt(v))}</td>'


def _is_grid(d: dict) -> bool:
    """A dict of dicts of numbers, such as ``{task: {condition: accuracy}}``: shown as a 2-D table."""
    return bool(d) and all(
        isinstance(row, dict) and row and not values.is_head(row) and all(values.is_number(x) for x in row.values())
        for row in d.values()
    )


def _grid_table(d: dict) -> str:
    cols = list(dict.fromkeys(c for row in d.values() for c in row))
    head = "".join(f"<th>{_escape(c)}</th>" for c in cols)
    body = "".join(
        f"<tr><th>{_escape(k)}</th>{''.join(_num_td(row.get(c)) if c in row else '<td></td>' for c in cols)}</tr>"
        for k, row in d.items()
    )
    return f"<div class=\"scroll\"><table><tr><th></th>{head}</tr>{body}</table></div>"


def _records_table(records: list[dict]) -> str:
    flat = [values.flatten(r) for r in records[:_MAX_ROWS]]
    cols = list(dict.fromkeys(c for r in flat for c in r))
    head = "".join(f"<th>{_escape(c)}</th>" for c in cols)
    body = []
    for r in flat:
        cells = []
        for c in cols:
            if c not in r:
                cells.append("<td></td>")
            elif values.is_number(r[c]):
                cells.append(_num_td(r[c]))
            else:
                cells.append(f'<td class="txt">{_cell_span(r[c])}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    more = len(records) - _MAX_ROWS
    note = f'<p class="muted">… {more} more rows in report.json</p>' if more > 0 else ""
    return f"<div class=\"scroll\"><table><tr>{head}</tr>{''.join(body)}</table></div>{note}"


def _seconds(timings: dict) -> dict:
    def fmt(k: str, v):
        if not isinstance(v, float):
            return v
        return f"{v:,.0f} MB" if k.endswith("_mb") else f"{v:.2f} s"

    return {k: fmt(k, v) for k, v in timings.items()}
