"""``mechkit report compare DIR…``: several runs of one plugin side by side, as ``compare.html``.

Each run becomes a column, labelled by what sets it apart from the others (the model, the seed,
the options that differ) — the seeds' figures are comparisons across models, and this is the page
that makes them: every run's finding, the runs' headline figures in a row, then for each of the
plugin's tables and each of its measurement columns one table of rows × runs
(:func:`~mechkit.report.table.compare_tables`). Reports of different plugins are refused.

>>> import tempfile, pathlib
>>> from mechkit.report import build_report, write_report
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> for seed, acc in ((0, 0.5), (1, 0.75)):
...     r = build_report(plugin="probe", plugin_version="0.1", model={"name": "m"}, params={}, seed=seed,
...                      results={"accuracy": acc}, artifacts=[], timings={}, finding=f"accuracy {acc}")
...     _ = write_report(root / f"s{seed}", r)
>>> cmp = compare_runs([root / "s0", root / "s1"])
>>> cmp.labels, [t.rows for t in cmp.tables]
(['seed 0', 'seed 1'], [[['accuracy', 0.5, 0.75]]])
>>> write_compare(cmp, root / "cmp").name
'cmp'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError
from mechkit.report import values
from mechkit.report.artifact_files import own_png, plain_png_name
from mechkit.report.html import CSS, figure_html, model_line, table_html
from mechkit.report.show import load_report, rich_table, run_dir_of, safe_text
from mechkit.report.table import Table, compare_tables, generic_tables

if TYPE_CHECKING:
    from rich.console import Console

COMPARE_HTML = "compare.html"


def _escape(v: object) -> str:
    return escape(str(v), quote=True)


_LABEL_WIDTH = 48


@dataclass
class Comparison:
    """Runs of one plugin, their column labels, and the side-by-side tables."""

    plugin: str
    dirs: list[Path]
    reports: list[dict]
    labels: list[str]
    settings: Table
    tables: list[Table]
    headlines: list[tuple[str, bytes] | None] = field(default_factory=list)


def compare_runs(paths: Sequence[str | os.PathLike[str]],
                 tables_of: Callable[[dict], list[Table]] | None = None) -> Comparison:
    """Load the reports at ``paths`` (run directories or their ``report.json``) and line them up.

    ``tables_of(report)`` gives a report's tables (the CLI passes the plugin's ``tables`` hook);
    by default the generic ones. Raises :class:`MechkitError` (one line) for fewer than two reports
    or reports of different plugins.
    """
    if len(paths) < 2:
        raise MechkitError("report compare needs at least two reports", "pass two or more run directories")
    tables_of = tables_of or (lambda r: generic_tables(r.get("results") or {}))
    reports = [load_report(p) for p in paths]  # first: each path checked (a name too long, ~user) before any look-up
    dirs = [run_dir_of(p) for p in paths]
    plugins = list(dict.fromkeys(r["plugin"] for r in reports))
    if len(plugins) > 1:
        which = ", ".join(f"{d.name or d} ({r['plugin']})" for d, r in zip(dirs, reports, strict=True))
        raise MechkitError(f"cannot compare reports of different plugins: {which}",
                           "compare runs of one plugin (e.g. the same analysis on several models or seeds)")
    labels = run_labels(reports, dirs)
    return Comparison(plugin=plugins[0], dirs=dirs, reports=reports, labels=labels,
                      settings=_settings(reports, dirs, labels),
                      tables=compare_tables(labels, [tables_of(r) for r in reports]),
                      headlines=[_headline(r, d) for r, d in zip(reports, dirs, strict=True)])


def run_labels(reports: list[dict], dirs: list[Path]) -> list[str]:
    """Each run's column label: what sets it apart — the model where models differ, the seed where
    seeds differ, and the differing options only where those two do not already tell the runs apart;
    runs with the same settings are told apart by their directories."""
    models = [_model_name(r) for r in reports]
    seeds = [str(r.get("seed")) for r in reports]
    parts: list[list[str]] = [[] for _ in reports]
    if len(set(models)) > 1:
        for p, m in zip(parts, models, strict=True):
            p.append(m)
    if len(set(seeds)) > 1:
        for p, s in zip(parts, seeds, strict=True):
            p.append(f"seed {s}")
    if len({tuple(p) for p in parts}) < len(parts):
        for p, r in zip(parts, reports, strict=True):
            p += [f"{k}={values.cell((r.get('params') or {}).get(k), width=24)}" for k in _differing_params(reports)]
    labels = []
    for p, d in zip(parts, dirs, strict=True):
        label = " · ".join(p) or d.name or str(d)
        labels.append(label if len(label) <= _LABEL_WIDTH else label[: _LABEL_WIDTH - 1] + "…")
    if len(set(labels)) < len(labels):  # same settings twice: the directory tells them apart
        labels = [f"{label} ({d.name})" if label != d.name else label for label, d in zip(labels, dirs, strict=True)]
    return labels


def _model_name(report: dict) -> str:
    model = report.get("model") or {}
    return str(model.get("name") or model.get("spec") or "?")


def _differing_params(reports: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in reports for k in (r.get("params") or {})))
    return [k for k in keys if len({repr((r.get("params") or {}).get(k)) for r in reports}) > 1]


def _settings(reports: list[dict], dirs: list[Path], labels: list[str]) -> Table:
    rows: list[list] = [["directory", *(str(d) for d in dirs)],
                        ["model", *(_model_name(r) for r in reports)],
                        ["seed", *(r.get("seed") for r in reports)]]
    shapes = [_heads_per_layer(r) for r in reports]
    if len(set(shapes)) > 1:  # a pruned model numbers its own heads: its 0.1 need not be the dense 0.1
        rows.append(["heads per layer (each run numbers its model's own)", *shapes])
    for k in _differing_params(reports):
        rows.append([k, *(values.cell((r.get("params") or {}).get(k), width=60) for r in reports)])
    return Table("Runs", ["", *labels], rows)


def _heads_per_layer(report: dict) -> str:
    model = report.get("model") or {}
    counts = model.get("heads_per_layer")
    if isinstance(counts, list) and all(isinstance(c, int) for c in counts):
        return values.cell(",".join(map(str, counts)), width=60)
    return values.cell(f"{model.get('n_heads', '?')} in each of {model.get('n_layers', '?')}", width=60)


def _headline(report: dict, run_dir: Path) -> tuple[str, bytes] | None:
    """The run's first PNG artifact, read only where it is its own: a plain file name, a regular file (no
    symlink) directly in ``run_dir``, a real PNG, under :data:`MAX_IMAGE_BYTES`. Anything else is skipped."""
    for name in report.get("artifacts") or []:
        if not plain_png_name(name):
            continue
        data = own_png(run_dir / name)  # no symlink, FIFO or device: a FIFO would block the read
        if data is not None:
            return name, data
    return None


def render_compare_html(cmp: Comparison) -> str:
    """The comparison as one self-contained page (inline CSS and images, like ``report.html``)."""
    n = len(cmp.reports)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_escape(cmp.plugin)} — {n} runs compared — mechkit</title>",
        f"<style>{CSS}</style></head><body>",
        f'<h1>{_escape(cmp.plugin)} <span class="muted">{n} runs compared</span></h1>',
    ]
    findings = [(label, r.get("finding")) for label, r in zip(cmp.labels, cmp.reports, strict=True)]
    if any(f for _, f in findings):
        parts.append('<div class="finding">' + "".join(
            f"<p><strong>{_escape(label)}:</strong> {_escape(f or '(no finding recorded)')}</p>" for label, f in findings)
                     + "</div>")
    figures = [figure_html(h[0], h[1], caption=f"{label} — {h[0]}")
               for label, h in zip(cmp.labels, cmp.headlines, strict=True) if h is not None]
    if figures:
        parts.append('<div class="figs">' + "".join(figures) + "</div>")
    if cmp.tables:
        parts += ["<h2>Results</h2>", *(table_html(t) for t in cmp.tables)]
    parts += ["<h2>Details</h2>", table_html(cmp.settings)]
    for label, r in zip(cmp.labels, cmp.reports, strict=True):
        parts.append(f"<details><summary>{_escape(label)}</summary><p>{_escape(model_line(r))} · seed {_escape(r.get('seed'))}"
                     f" · {_escape(r.get('created', ''))}</p>" + table_html(Table(
                         "Parameters", ["", "value"], [[k, v] for k, v in (r.get("params") or {}).items()]))
                     + "</details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_compare(cmp: Comparison, out_dir: str | os.PathLike[str], force: bool = False) -> Path:
    """Write ``compare.html`` into ``out_dir`` as a set of mechkit's files, as a run writes its own; return ``out_dir``.

    A non-empty ``out_dir`` is refused without ``force`` (one line), as for a run's ``--out``, and so is, even
    with ``force``, one of the compared runs (the page went into the input run's directory), a ``compare.html``
    mechkit did not write (a user's own page was replaced), and another run's files (its set would be
    replaced). The page goes in with a manifest (:func:`mechkit.io.replace.replacing_dir`), so a later
    ``--force`` replaces only what mechkit wrote there.
    """
    from mechkit.io import check_out
    from mechkit.io.outlock import out_lock
    from mechkit.io.replace import replacing_dir

    inputs = tuple(cmp.dirs)
    out = check_out(out_dir, force=force, kind="dir", inputs=inputs)
    page = render_compare_html(cmp)
    with out_lock(out):
        out = check_out(out_dir, force=force, kind="dir", inputs=inputs)  # again under the lock
        _refuse_foreign_page(out)
        with replacing_dir(out, writer=COMPARE_WRITER, force=force) as tmp:
            (tmp / COMPARE_HTML).write_text(page, encoding="utf-8")
    return out


COMPARE_WRITER = "report compare"  # the writer its manifest records


def _refuse_foreign_page(out: Path) -> None:
    """One line where ``out`` holds a ``compare.html`` mechkit did not write, or another writer's set of files."""
    from mechkit.io.replace import owned_names, set_writer

    if not out.is_dir():
        return
    owned, writer = owned_names(out), set_writer(out)
    if owned and writer != COMPARE_WRITER:
        raise MechkitError(f"--out {out} holds the files a `{writer or 'mechkit'}` run wrote, and report compare "
                           "would replace them", "choose another --out for the comparison")
    page = out / COMPARE_HTML
    if os.path.lexists(page) and COMPARE_HTML not in owned and not _old_compare_page(page):
        raise MechkitError(f"--out {out} holds {COMPARE_HTML}, which mechkit did not write, and report compare would "
                           "replace it", "choose another --out, or move that file away first")


def _old_compare_page(page: Path) -> bool:
    """A page an older mechkit wrote (before its manifest): its title says so."""
    from mechkit.io.read import read_regular_text

    try:
        text = read_regular_text(page)
    except (OSError, MechkitError):
        return False
    return text is not None and "runs compared — mechkit</title>" in text[:4000]


def print_compare(cmp: Comparison, console: Console | None = None) -> None:
    """The comparison in the terminal: each run's finding, then the side-by-side tables."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    console.print(safe_text(f"{cmp.plugin}: {len(cmp.reports)} runs compared", style="bold"))
    for label, r in zip(cmp.labels, cmp.reports, strict=True):
        line = Text()
        line.append(safe_text(f"{label}: ", style="cyan"))
        line.append(safe_text(r.get("finding") or "(no finding recorded)"))
        console.print(line)
    for t in [cmp.settings, *cmp.tables]:
        console.print(rich_table(t))


__all__ = ["COMPARE_HTML", "Comparison", "compare_runs", "print_compare", "render_compare_html", "run_labels",
           "write_compare"]
