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
from mechkit.report import values as V
from mechkit.report.schema import validate_report

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

MAX_ROWS = 40


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a report from a run directory or its ``report.json``.

    A missing, unreadable or malformed file raises :class:`MechkitError` with one line naming it.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise MechkitError(
            f"no report at {p}", "pass a run directory (under ./mechkit-runs/) or its report.json"
        )
    try:
        report = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise MechkitError(
            f"{p} is not valid JSON ({err.msg} at line {err.lineno})", "rerun the analysis to write it again"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise MechkitError(f"cannot read {p}: {first_line(err)}") from None
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
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return Text(text, style=style)


def summary_table(report: dict) -> Table:
    """The results as one compact table.

    With ``results["conditions"]`` (clean / target / random runs): one row per condition and one
    accuracy column per task. Otherwise: results flattened to dotted keys, at most ``MAX_ROWS`` rows.
    """
    results = report.get("results") or {}
    grid = V.conditions_accuracy(results)
    return _conditions_table(*grid) if grid else _scalars_table(results)


def print_summary(report: dict, console: Console | None = None) -> None:
    """Print plugin, model, seed, timings and the results table(s)."""
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
    timings = report.get("timings") or {}
    if timings:
        console.print(safe_text("  ".join(f"{k} {V.fmt(v)}" for k, v in timings.items()), style="dim"))
    results = report.get("results") or {}
    grid = V.conditions_accuracy(results)
    if grid:
        console.print(_conditions_table(*grid))
    # A plugin's own "summary" is what it wants a terminal reader to see; the rest is in report.json.
    if isinstance(results.get("summary"), dict):
        console.print(_scalars_table({"summary": results["summary"]}))
    elif grid:
        rest = {k: v for k, v in results.items() if k != "conditions"}
        if rest:
            console.print(_scalars_table(rest))
    else:
        console.print(_scalars_table(results))


def _conditions_table(tasks: list[str], rows: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="accuracy by condition", title_justify="left")
    table.add_column("condition")
    table.add_column("seed", justify="right")
    table.add_column("heads", overflow="fold", max_width=40)
    for task in tasks:
        table.add_column(safe_text(task), justify="right")
    for r in rows[:MAX_ROWS]:
        seed = "" if r["seed"] is None else str(r["seed"])
        accs = [_acc(r["accuracy"].get(t)) if t in r["accuracy"] else "" for t in tasks]
        table.add_row(*(safe_text(c) for c in (r["name"], seed, r["heads"], *accs)))
    if len(rows) > MAX_ROWS:
        table.caption = f"… {len(rows) - MAX_ROWS} more conditions in report.json"
    return table


def _acc(v: Any) -> str:
    return "—" if v is None else f"{v:.3f}" if V.is_number(v) else str(v)


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
    for key, v in V.flatten(results).items():
        if isinstance(v, list) and v and not V.is_head_list(v) and all(isinstance(x, dict) for x in v):
            out.append((key, f"{len(v)} records"))
        else:
            out.append((key, V.cell(v, width=60)))
    return out
