"""The supported-architectures table, rendered from the measured matrix (docs/architectures.json, written
by ``python -m tools.arch_coverage``) into docs/guides/architectures.md at build time."""

from __future__ import annotations

import json
from pathlib import Path

MARKER = "<!-- architectures-table -->"
MATRIX = Path(__file__).resolve().parents[2] / "docs" / "architectures.json"
ORDER = ("works", "unsupported", "gap", "failing", "not-buildable")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(matrix: dict) -> str:
    """Counts, then one row per model type: status and reason."""
    rows = matrix["types"]
    counts = {s: sum(r["status"] == s for r in rows.values()) for s in ORDER}
    lines = [f"Measured on transformers {matrix['transformers']}: {len(rows)} causal-LM model types, "
             + ", ".join(f"**{counts[s]} {s}**" for s in ORDER) + ".", "",
             "| model type | status | reason |", "| --- | --- | --- |"]
    for name in sorted(rows, key=lambda t: (ORDER.index(rows[t]["status"]), t)):
        row = rows[name]
        lines.append(f"| `{name}` | {row['status']} | {_cell(row.get('reason', ''))} |")
    return "\n".join(lines) + "\n"


def render(markdown: str) -> str:
    """``markdown`` with the marker replaced by the table (unchanged where the marker is absent)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, table(json.loads(MATRIX.read_text())))
