"""``report.html``: one self-contained page rendered from the same data as ``report.json``.

The page must open from a laptop's file browser, an e-mail attachment or an air-gapped cluster,
so it carries its CSS inline and its PNGs as base64 data URIs and references nothing outside itself.
Results are rendered generically — scalars as key/value rows, lists of records as tables, score
grids as a one-line summary (the heatmap shows them) — so a new plugin gets a readable page for free.
"""

from __future__ import annotations

import base64
import json
from html import escape
from typing import Any

from mechkit.report import values as V

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;max-width:1100px;margin:0 auto;padding:1.5em}
h1{font-size:1.6em;margin:0 0 .2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3,h4,h5,h6{font-size:1em;margin:1.2em 0 .4em}.muted{color:#666}code{font-family:ui-monospace,monospace}
table{border-collapse:collapse;margin:.4em 0 1em;font-size:13px}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f5f5f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.card{background:#f5f5f7;border-radius:6px;padding:.6em 1em;margin:.8em 0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{color:#666;font-size:12px}
pre{background:#f5f5f7;padding:.6em;overflow-x:auto;font-size:12px}
"""

_MAX_ROWS = 200
_MAX_DEPTH = 6


def render_html(report: dict, images: dict[str, bytes]) -> str:
    """Return the report as one HTML page; ``images`` maps artifact file names to PNG bytes."""
    results = report.get("results") or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(report.get('plugin', 'mechkit'))} — mechkit report</title>",
        f"<style>{_CSS}</style></head><body>",
        _header(report),
        "<h2>Parameters</h2>",
        _kv_table(report.get("params") or {}),
    ]
    summary, rest = _split_summary(results)
    if summary:
        parts += ["<h2>Summary</h2>", *summary]
    if rest:
        parts += ["<h2>Results</h2>", _block(rest, 3)]
    parts.append(_images(report.get("artifacts") or [], images))
    parts += ["<h2>Timings</h2>", _kv_table(_seconds(report.get("timings") or {}))]
    parts += ["<h2>Environment</h2>", _kv_table(report.get("environment") or {})]
    parts.append(f'<p class="muted">schema <code>{_e(report.get("schema", ""))}</code></p>')
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def _e(v: Any) -> str:
    return escape(str(v), quote=True)


def _header(report: dict) -> str:
    model = report.get("model") or {}
    shape = []
    if "n_layers" in model:
        shape.append(f"{model['n_layers']} layers")
    if "n_heads" in model:
        kv = model.get("n_kv_heads")
        shape.append(
            f"{model['n_heads']} heads" + (f" ({kv} KV)" if kv not in (None, model["n_heads"]) else "")
        )
    if "d_head" in model:
        shape.append(f"d_head {model['d_head']}")
    name = model.get("name") or model.get("spec") or "unknown model"
    lines = [
        f'<h1>{_e(report.get("plugin", "?"))} <span class="muted">{_e(report.get("plugin_version", ""))}</span></h1>',
        f'<div class="muted">{_e(report.get("created", ""))} · mechkit {_e(report.get("mechkit_version", ""))}'
        f" · seed {_e(report.get('seed', '—'))}</div>",
        '<div class="card">',
        f"<strong>{_e(name)}</strong>",
    ]
    if model.get("architecture"):
        lines.append(f" · <code>{_e(model['architecture'])}</code>")
    if shape:
        lines.append(f"<br>{_e(' × '.join(shape))}")
    device = " on ".join(_e(model[k]) for k in ("dtype", "device") if model.get(k))
    if device:
        lines.append(f"<br>{device}")
    if model.get("spec") and model.get("spec") != name:
        lines.append(f'<br><span class="muted">spec <code>{_e(model["spec"])}</code></span>')
    if model.get("weights_sha256"):
        lines.append(
            f'<br><span class="muted">weights sha256 <code>{_e(str(model["weights_sha256"])[:16])}…</code></span>'
        )
    lines.append("</div>")
    return "\n".join(lines)


def _split_summary(results: dict) -> tuple[list[str], dict]:
    """The summary is ``results["summary"]`` if the plugin wrote one, else the top-level scalars;
    a conditions × tasks accuracy grid is added when ``results["conditions"]`` has that shape."""
    summary: list[str] = []
    if isinstance(results.get("summary"), (dict, list)):
        summary.append(_block(results["summary"], 3))
        rest = {k: v for k, v in results.items() if k != "summary"}
    else:
        scalars = {k: v for k, v in results.items() if V.is_cell_value(v)}
        if scalars:
            summary.append(_kv_table(scalars))
        rest = {k: v for k, v in results.items() if k not in scalars}
    grid = V.conditions_accuracy(results)
    if grid:
        tasks, rows = grid
        head = "".join(f"<th>{_e(t)}</th>" for t in tasks)
        body = []
        for r in rows:
            accs = "".join(_num_td(r["accuracy"].get(t)) for t in tasks)
            seed = "" if r["seed"] is None else _e(r["seed"])
            body.append(f"<tr><td>{_e(r['name'])}</td><td>{seed}</td><td>{_e(r['heads'])}</td>{accs}</tr>")
        summary.append(
            "<h3>Accuracy by condition</h3><table><tr><th>condition</th><th>seed</th><th>heads</th>"
            f"{head}</tr>{''.join(body)}</table>"
        )
    return summary, rest


def _block(v: Any, depth: int) -> str:
    """Render any JSON value; ``depth`` is the heading level for nested sections."""
    if depth > 3 + _MAX_DEPTH:
        return f"<pre>{_e(json.dumps(v, indent=1, ensure_ascii=False))}</pre>"
    if isinstance(v, dict):
        if _is_grid(v):
            return _grid_table(v)
        return _dict_block(v, depth)
    if isinstance(v, list):
        if not v:
            return '<p class="muted">(empty)</p>'
        shape = V.numeric_shape(v)
        if shape and len(shape) >= 2:
            return f"<p>array {_e(V.array_summary(v))}</p>"
        if V.is_head_list(v) or all(V.is_scalar(x) for x in v):
            more = f" … ({len(v) - 50} more)" if len(v) > 50 and not V.is_head_list(v) else ""
            return f"<p>{_e(V.cell(v[:50] if more else v, width=2000))}{_e(more)}</p>"
        if all(isinstance(x, dict) for x in v):
            return _records_table(v)
        return "".join(f"<h{_h(depth)}>[{i}]</h{_h(depth)}>{_block(x, depth + 1)}" for i, x in enumerate(v))
    return f"<p>{_e(V.fmt(v))}</p>"


def _dict_block(d: dict, depth: int) -> str:
    simple = {k: v for k, v in d.items() if V.is_cell_value(v)}
    out = [_kv_table(simple)] if simple else []
    for k, v in d.items():
        if k not in simple:
            out.append(f"<h{_h(depth)}>{_e(k)}</h{_h(depth)}>{_block(v, depth + 1)}")
    return "".join(out) or '<p class="muted">(empty)</p>'


def _h(depth: int) -> int:
    return min(depth, 6)


def _kv_table(d: dict) -> str:
    if not d:
        return '<p class="muted">(none)</p>'
    rows = []
    for k, v in d.items():
        td = _num_td(v) if V.is_number(v) else f"<td>{_e(V.cell(v, width=200))}</td>"
        rows.append(f"<tr><th>{_e(k)}</th>{td}</tr>")
    return f"<table>{''.join(rows)}</table>"


def _num_td(v: Any) -> str:
    return f'<td class="num">{_e(V.fmt(v))}</td>'


def _is_grid(d: dict) -> bool:
    """A dict of dicts of numbers, such as ``{task: {condition: accuracy}}``: shown as a 2-D table."""
    return bool(d) and all(
        isinstance(row, dict) and row and not V.is_head(row) and all(V.is_number(x) for x in row.values())
        for row in d.values()
    )


def _grid_table(d: dict) -> str:
    cols = list(dict.fromkeys(c for row in d.values() for c in row))
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        f"<tr><th>{_e(k)}</th>{''.join(_num_td(row.get(c)) if c in row else '<td></td>' for c in cols)}</tr>"
        for k, row in d.items()
    )
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def _records_table(records: list[dict]) -> str:
    flat = [V.flatten(r) for r in records[:_MAX_ROWS]]
    cols = list(dict.fromkeys(c for r in flat for c in r))
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for r in flat:
        cells = []
        for c in cols:
            if c not in r:
                cells.append("<td></td>")
            elif V.is_number(r[c]):
                cells.append(_num_td(r[c]))
            else:
                cells.append(f"<td>{_e(V.cell(r[c]))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    more = len(records) - _MAX_ROWS
    note = f'<p class="muted">… {more} more rows in report.json</p>' if more > 0 else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{note}"


def _images(artifacts: list[str], images: dict[str, bytes]) -> str:
    names = [a for a in artifacts if a in images] + [n for n in images if n not in artifacts]
    others = [a for a in artifacts if a not in images]
    if not names and not others:
        return ""
    out = ["<h2>Figures and files</h2>"]
    for name in names:
        data = base64.b64encode(images[name]).decode("ascii")
        out.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(name)}">'
            f"<figcaption>{_e(name)}</figcaption></figure>"
        )
    if others:
        out.append("<ul>" + "".join(f"<li><code>{_e(a)}</code></li>" for a in others) + "</ul>")
    return "\n".join(out)


def _seconds(timings: dict) -> dict:
    return {k: (f"{v:.2f} s" if isinstance(v, float) else v) for k, v in timings.items()}
