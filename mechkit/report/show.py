"""Read a report back and print its summary: the code behind ``mechkit report show PATH``.

The same summary is printed at the end of every run, so a terminal user sees the numbers without
opening the HTML page. rich is imported inside the functions to keep ``import mechkit.report`` light.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError, first_line
from mechkit.report import values
from mechkit.report.schema import MAX_INT, MAX_REPORT_BYTES, validate_report
from mechkit.report.table import Table as ReportTable
from mechkit.report.table import cell_text, generic_tables, is_value

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

MAX_ROWS = 40
MAX_TEXT = 4000  # characters of one report string shown in a terminal (a finding is a paragraph)


def run_dir_of(path: str | os.PathLike[str]) -> Path:
    """The run directory of PATH (a run directory, or its ``report.json``): the folder the report file really
    lies in, links resolved, so its figures are its own and not the PNGs beside a link to it."""
    p = Path(path)
    return p if p.is_dir() else Path(os.path.realpath(p)).parent


def _float_sized_int(text: str) -> int:
    """An integer of a report, refused (ValueError) where no float holds it: mechkit writes none, and every
    reader that draws or sums numbers (tables, grids) raised OverflowError on a crafted one."""
    value = int(text)
    if abs(value) > MAX_INT:
        raise ValueError(f"the integer {text[:20]}… is too large for a number in a report")
    return value



def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a report from a run directory or its ``report.json``.

    A missing, unreadable or malformed file raises :class:`MechkitError` with one line naming it.
    """
    from mechkit.io.runfile import read_run_file

    p, data = read_run_file(path, MAX_REPORT_BYTES)  # settled, its own regular file, capped, links not followed
    try:
        report = json.loads(data.decode("utf-8"), parse_int=_float_sized_int)
    except json.JSONDecodeError as err:
        # a damaged report.json is rerun; another file (report.html, a notes file) was the wrong PATH
        fix = "rerun the analysis to write it again" if p.name == "report.json" else \
            "pass a report.json written by a mechkit run, or its run directory"
        raise MechkitError(f"{p} is not valid JSON ({err.msg} at line {err.lineno})", fix) from None
    except (OSError, UnicodeDecodeError) as err:
        raise MechkitError(f"cannot read {p} as a report: {first_line(err)}",
                           "pass a report.json written by a mechkit run, or its run directory") from None
    except (RecursionError, ValueError) as err:  # nesting too deep, an integer too long to convert
        raise MechkitError(f"{p} is not a mechkit report ({type(err).__name__}: {first_line(err, 120)})",
                           "pass a report.json written by a mechkit run") from None
    try:
        validate_report(report)
    except MechkitError as err:
        raise MechkitError(f"{p}: {err.problem}", err.fix) from None
    return report


def safe_text(value: Any, style: str = "") -> Text:
    r"""``value`` as plain terminal text: never read as rich markup, and control characters (escape
    sequences, newlines) shown escaped, so a report's strings cannot restyle or move the terminal.

    >>> safe_text("[bold]x[/] \x1b[2J").plain
    '[bold]x[/] \\x1b[2J'
    """
    from rich.text import Text

    text = str(value)
    if len(text) > MAX_TEXT:  # a crafted report's megabyte string would take minutes to wrap
        text = f"{text[:MAX_TEXT]}… ({len(text) - MAX_TEXT:,} more characters)"
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return Text(text, style=style)


def summary_table(report: dict) -> Table:
    """The report's first table (the generic one: a conditions × tasks accuracy grid, else its
    summary or top-level values) as a rich table."""
    tables = generic_tables(report.get("results") or {})
    if not tables:
        return _scalars_table(report.get("results") or {})
    return rich_table(tables[0])


def rich_table(t: ReportTable) -> Table:
    """A :class:`~mechkit.report.table.Table` for the terminal: the same cells and rounding as the page."""
    from rich.table import Table

    table = Table(title=safe_text(t.title), title_justify="left", caption=safe_text(t.note) if t.note else None,
                  caption_justify="left")
    values = [any(is_value(r[j]) for r in t.rows) for j in range(len(t.columns))]
    for j, column in enumerate(t.columns):
        table.add_column(safe_text(column), justify="right" if values[j] and j else "left",
                         overflow="fold", max_width=None if values[j] else 40)
    for row in t.rows[:MAX_ROWS]:
        table.add_row(*(safe_text(cell_text(v, t.digits)[0]) for v in row))
    if len(t.rows) > MAX_ROWS:
        table.caption = f"… {len(t.rows) - MAX_ROWS} more rows in report.json"
    return table


def print_summary(report: dict, console: Console | None = None, tables: list[ReportTable] | None = None) -> None:
    """Print the report in the page's order: plugin and model, the finding, then the tables
    (``tables``, default the generic ones of the results), then the timings."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    model = report.get("model") or {}
    header = Text()
    header.append(safe_text(f"{report.get('plugin', '?')} ", style="bold"))
    header.append(safe_text(f"{report.get('plugin_version', '')}  ", style="dim"))
    header.append(safe_text(model.get("name") or model.get("spec") or "unknown model", style="cyan"))
    details = [str(model[k]) for k in ("architecture", "dtype", "device") if model.get(k)]
    if details:
        header.append(safe_text(f" ({', '.join(details)})", style="dim"))
    header.append(safe_text(f"  seed {report.get('seed', '—')}"))
    console.print(header)
    if report.get("finding"):
        console.print(safe_text(report["finding"], style="bold"))
    results = report.get("results") or {}
    tables = generic_tables(results) if tables is None else tables
    for t in tables:
        console.print(rich_table(t))
    if not tables:
        console.print(_scalars_table(results))
    timings = report.get("timings") or {}
    if timings:
        console.print(safe_text("  ".join(f"{k} {values.fmt(v)}" for k, v in timings.items()), style="dim"))


def _scalars_table(results: dict) -> Table:
    from rich.table import Table

    flat = _flat_scalars(results)
    table = Table(title="results", title_justify="left")
    table.add_column("key")
    table.add_column("value", overflow="fold", max_width=60)
    for key, text in flat[:MAX_ROWS]:
        table.add_row(safe_text(key), safe_text(text))
    if len(flat) > MAX_ROWS:
        table.caption = f"… {len(flat) - MAX_ROWS} more in report.json"
    if not flat:
        table.caption = "(no results)"
    return table


def _flat_scalars(results: dict) -> list[tuple[str, str]]:
    """Dotted keys with short text; bulky values (record lists) are counted, not dumped."""
    out = []
    for key, v in values.flatten(results).items():
        if isinstance(v, list) and v and not values.is_head_list(v) and all(isinstance(x, dict) for x in v):
            out.append((key, f"{len(v)} records"))
        else:
            out.append((key, values.cell(v, width=60)))
    return out
