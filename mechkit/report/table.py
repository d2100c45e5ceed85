"""Tables as a reader sees them: a title, column names and rows of cells, pivoted by the plugin.

A report's results are stored however the analysis needs them; what a person reads is a small
pivot (conditions × tasks, guides × sparsity, λ × task). A plugin builds those pivots as
:class:`Table` objects (its ``tables`` hook, run at render time on the report's JSON results, so
``report.html``, ``mechkit report show`` and ``mechkit report compare`` all show the same ones);
every other plugin gets :func:`generic_tables`. The first column of a table labels its rows.

Cells are plain report values: a number (rounded to the table's ``digits`` decimals everywhere),
text, ``None`` (shown as an em dash), a head ``{"layer", "head"}`` or a list of heads (shortened,
the full list on hover and in ``report.json``), or :func:`pm` — a mean ± std.

>>> t = Table("Accuracy", ["condition", "capitalize"], [["clean", 0.4], ["random", pm(0.37, 0.058)]])
>>> [cell_text(row[1], t.digits)[0] for row in t.rows]
['0.40', '0.37 ± 0.06']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mechkit.errors import MechkitError
from mechkit.report import values

HEAD_LIMIT = 4  # heads shown in a cell before "+N more"


@dataclass
class Table:
    """One table: ``rows`` are lists of cells, one per column; the first column labels the row."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""
    digits: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.columns, str) or not isinstance(self.columns, (list, tuple)):
            raise TableError(f"table {self.title!r}: columns must be a list of names, not {self.columns!r}"[:200],
                             "pass columns=[\"name\", \"value\"] (a string would be split into letters)")
        if isinstance(self.rows, str) or not isinstance(self.rows, (list, tuple)):
            raise TableError(f"table {self.title!r}: rows must be a list of rows, not {type(self.rows).__name__}",
                             "pass rows=[[cell, ...], ...], one cell per column")
        for i, row in enumerate(self.rows):
            if isinstance(row, str) or not isinstance(row, (list, tuple)) or len(row) != len(self.columns):
                got = f"{len(row)} cells" if isinstance(row, (list, tuple)) else f"a {type(row).__name__}"
                raise TableError(f"table {self.title!r}: row {i} has {got} for {len(self.columns)} columns",
                                 "give every row one cell per column")


class TableError(MechkitError, ValueError):
    """A table whose shape is wrong (one line; still a ``ValueError`` for code that catches that)."""


def pm(mean: float | None, std: float | None) -> dict[str, float | None]:
    """A mean ± std cell (e.g. accuracy over random-head seeds)."""
    return {"mean": mean, "std": std}


def pm_of(values: list[float]) -> dict[str, float]:
    """The mean ± population std cell of ``values`` (0 for one value).

    >>> pm_of([0.2, 0.4])
    {'mean': 0.30000000000000004, 'std': 0.1}
    """
    import statistics

    return pm(statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0)


def is_pm(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"mean", "std"} and all(values.is_number(x) for x in v.values())


def is_value(v: Any) -> bool:
    """A cell that holds a measurement (a number or mean ± std), as opposed to a label."""
    return (values.is_number(v) and v is not None) or is_pm(v)


def fixed(v: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals (ints with thousands separators); tiny and huge floats in
    scientific notation rather than as ``0.00``; ``None`` as an em dash.

    >>> fixed(0.4), fixed(-5.5381, 3), fixed(107200), fixed(0.00004), fixed(None)
    ('0.40', '-5.538', '107,200', '4.0e-05', '—')
    """
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if not isinstance(v, float):
        return str(v)
    if v != 0 and (abs(v) < 0.5 * 10 ** -digits or abs(v) >= 1e7):
        return f"{v:.{max(digits - 1, 1)}e}"
    text = f"{v:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # never "-0.00"


def cell_text(v: Any, digits: int = 2) -> tuple[str, str | None]:
    """``(text, full)``: the cell's short text, and the full text where it was shortened (a hover)."""
    if is_pm(v):
        if v["std"] is None:
            return fixed(v["mean"], digits), None
        return f"{fixed(v['mean'], digits)} ± {fixed(v['std'], digits)}", None
    if values.is_head(v):
        return values.heads_text([v]), None
    if values.is_head_list(v):
        full = values.heads_text(v)
        return (values.heads_text(v, limit=HEAD_LIMIT), full) if len(v) > HEAD_LIMIT else (full, None)
    if isinstance(v, list) and not v:
        return "", None
    if values.is_number(v) or isinstance(v, bool):
        return fixed(v, digits), None
    if isinstance(v, str):
        return v, None
    text = values.cell(v, width=60)
    full = values.cell(v, width=4000)
    return text, (full if full != text else None)


def kv_table(title: str, items: Mapping[str, Any], digits: int = 2, note: str = "",
             columns: tuple[str, str] = ("", "value")) -> Table:
    """A two-column table of named values."""
    return Table(title, list(columns), [[str(k), v] for k, v in items.items()], note=note, digits=digits)


def generic_tables(results: dict) -> list[Table]:
    """The tables of a plugin without its own: a conditions × tasks accuracy grid when
    ``results["conditions"]`` has that shape; ``results["summary"]`` when it is a dict of short values,
    else every other value by its dotted key (score grids summarised, record lists counted); and
    every ``{row: {column: number}}`` dict as a pivot."""
    tables: list[Table] = []
    grid = values.conditions_accuracy(results)
    rest = dict(results)
    if grid:
        tasks, rows = grid
        tables.append(Table("Accuracy by condition", ["condition", "seed", "heads", *tasks],
                            [[r["name"], r["seed"], r["heads_list"] or r["heads"],
                              *(r["accuracy"].get(t) for t in tasks)] for r in rows]))
        rest.pop("conditions")
    pivots = {k: v for k, v in rest.items() if isinstance(v, dict) and _is_grid(v)}
    summary = rest.get("summary")
    if isinstance(summary, dict) and summary and all(values.is_cell_value(v) for v in summary.values()):
        tables.append(kv_table("Summary", summary, digits=3))
    else:
        flat = values.flatten({k: v for k, v in rest.items() if k not in pivots})
        if flat:
            tables.append(kv_table("Results", {k: _short(v) for k, v in flat.items()}, digits=3))
    for key, value in pivots.items():
        cols = list(dict.fromkeys(c for row in value.values() for c in row))
        tables.append(Table(str(key), ["", *cols], [[k, *(row.get(c) for c in cols)] for k, row in value.items()],
                            digits=3))
    return tables


def _short(v: Any) -> Any:
    """A value as one cell: short values as they are, record lists counted, anything else summarised."""
    if values.is_cell_value(v) or is_pm(v):
        return v
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return f"{len(v)} records"
    return values.cell(v, width=80)


def _is_grid(d: dict) -> bool:
    return bool(d) and all(
        isinstance(row, dict) and row and not values.is_head(row) and all(values.is_number(x) for x in row.values())
        for row in d.values()
    )


def compare_tables(labels: list[str], per_run: list[list[Table]]) -> list[Table]:
    """Several runs' tables side by side: for each table of the first run (matched by title in the
    others) and each of its columns after the row labels, one table of rows × runs.

    >>> a = [Table("Accuracy", ["condition", "swap"], [["clean", 0.5], ["target", 0.1]])]
    >>> b = [Table("Accuracy", ["condition", "swap"], [["clean", 0.75], ["random", 0.5]])]
    >>> t = compare_tables(["seed 0", "seed 1"], [a, b])[0]
    >>> t.title, t.columns, t.rows
    ('Accuracy', ['condition', 'seed 0', 'seed 1'], [['clean', 0.5, 0.75], ['target', 0.1, None], ['random', None, 0.5]])
    """
    out: list[Table] = []
    for first in per_run[0] if per_run else []:
        matched = [next((t for t in tables if t.title == first.title), None) for tables in per_run]
        for j, column in enumerate(first.columns[1:], start=1):
            rows: dict[str, list[Any]] = {}
            for i, t in enumerate(matched):
                at = _column(t, first, j)
                if at is None:
                    continue
                for r in t.rows:
                    rows.setdefault(cell_text(r[0])[0], [None] * len(matched))[i] = r[at]
            body = [[k, *v] for k, v in rows.items()]
            if any(t.rows == body and t.title.endswith(f": {column}") for t in out):
                continue  # the same label column of a sibling table (e.g. the heads beside accuracy and log-prob)
            title = first.title if len(first.columns) == 2 else f"{first.title}: {column}"
            out.append(Table(title, [first.columns[0] or "", *labels], body, note=first.note if j == 1 else "",
                             digits=first.digits))
    return out


def _column(t: Table | None, first: Table, j: int) -> int | None:
    """Where the first run's column ``j`` is in ``t``: the same place when the columns agree, else by name."""
    if t is None:
        return None
    if t.columns == first.columns:
        return j
    name = first.columns[j]
    return t.columns.index(name) if name in t.columns else None


__all__ = ["Table", "cell_text", "compare_tables", "fixed", "generic_tables", "is_pm", "is_value", "kv_table",
           "pm"]


def plugin_tables(plugin: Any, results: dict, console: Any = None) -> list[Table]:
    """``plugin.tables(results)``, else the generic tables (with a one-line warning on ``console``) where
    that hook fails on these results: a report written by another version, or a third-party hook's bug,
    must not cost a run its report nor a reader its page."""
    try:
        tables = list(plugin.tables(results))
        odd = next((t for t in tables if not isinstance(t, Table)), None)
        if odd is not None:  # a duck-typed table failed deep inside the page's rendering, after the work
            raise TypeError(f"it returned a {type(odd).__name__}, not a mechkit.report.Table")
        for t in tables:  # each cell drawn now as the page and the terminal draw it: a cell of no JSON form, or
            for row in t.rows:  # one whose own __format__ raises, failed the report's write after the work
                for value in row:
                    values.cell(value)
                    cell_text(value)
        return tables
    except Exception as err:
        if console is not None:
            console.print(f"mechkit: warning: the tables of plugin {plugin.name!r} failed ({type(err).__name__}: "
                          f"{err}); the report shows its results generically", markup=False, highlight=False)
        return generic_tables(results)
