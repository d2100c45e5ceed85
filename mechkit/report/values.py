"""How report values are recognised and shown as short text, shared by the HTML page and the terminal.

Reports are rendered generically (no per-plugin templates), so both views need the same answers to
"is this a list of heads?", "is this a layer × head score grid?" and "what is one condition's
accuracy on each task?". Keeping those answers here keeps the page and ``mechkit report show`` in step.
"""

from __future__ import annotations

import json
import math
from typing import Any

Scalar = (str, int, float, bool, type(None))


def is_scalar(v: Any) -> bool:
    return isinstance(v, Scalar)


def is_number(v: Any) -> bool:
    """A number or a missing one (``None``, which is how NaN is stored)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def fmt(v: Any) -> str:
    """Short text for a scalar: floats to 4 significant digits, ``None`` (null/NaN) as an em dash."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def is_head(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"layer", "head"} and all(isinstance(x, int) for x in v.values())


def is_head_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(is_head(h) for h in v)


def and_list(parts: list[str]) -> str:
    """Parts joined as a sentence lists them.

    >>> and_list(["a"]), and_list(["a", "b", "c"])
    ('a', 'a, b and c')
    """
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def heads_text(heads: list[dict], limit: int | None = None) -> str:
    """``[{"layer": 17, "head": 3}, …]`` as ``17.3, 18.6`` — the layer.head grammar used everywhere."""
    names = [f"{h['layer']}.{h['head']}" for h in heads]
    if limit is not None and len(names) > limit:
        return ", ".join(names[:limit]) + f" (+{len(names) - limit})"
    return ", ".join(names)


def numeric_shape(v: Any) -> tuple[int, ...] | None:
    """Shape of a rectangular nested list of numbers (``None`` allowed inside), else ``None``."""
    if not isinstance(v, list) or not v:
        return None
    if all(is_number(x) for x in v):
        return (len(v),)
    shapes = {numeric_shape(x) for x in v}
    if len(shapes) != 1 or None in shapes:
        return None
    return (len(v), *shapes.pop())


def array_summary(v: list) -> str:
    """``30 × 9, max 0.93 at (17, 3), mean 0.04`` — a score grid summarised rather than dumped."""
    shape = numeric_shape(v) or (len(v),)
    best: tuple[float, tuple[int, ...]] | None = None
    total, count, lo = 0.0, 0, math.inf
    stack: list[tuple[Any, tuple[int, ...]]] = [(v, ())]
    while stack:
        x, idx = stack.pop()
        if isinstance(x, list):
            stack.extend((y, (*idx, i)) for i, y in enumerate(x))
        elif x is not None:
            total, count, lo = total + x, count + 1, min(lo, x)
            if best is None or x > best[0] or (x == best[0] and idx < best[1]):
                best = (x, idx)
    dims = " × ".join(str(n) for n in shape)
    if best is None:
        return f"{dims}, all missing"
    at = ", ".join(str(i) for i in best[1])
    return f"{dims}, max {fmt(best[0])} at ({at}), min {fmt(lo)}, mean {fmt(total / count)}"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (``metrics.capitalize.accuracy``); other values are left as they are."""
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not is_head(v):
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def cell(v: Any, width: int = 80) -> str:
    """One table cell's text for any value, never longer than ``width`` characters."""
    if is_scalar(v):
        text = fmt(v)
    elif is_head(v):
        text = heads_text([v])
    elif is_head_list(v):
        text = heads_text(v)
    elif isinstance(v, list) and len(numeric_shape(v) or ()) >= 2:
        text = array_summary(v)
    elif isinstance(v, list) and all(is_scalar(x) for x in v):
        text = ", ".join(fmt(x) for x in v)
    else:
        text = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def is_cell_value(v: Any) -> bool:
    """Values short enough to sit in a key/value row rather than get a section of their own."""
    if is_scalar(v) or is_head(v) or is_head_list(v):
        return True
    if isinstance(v, list) and all(is_scalar(x) for x in v):
        return len(v) <= 16
    return False


def conditions_accuracy(results: dict) -> tuple[list[str], list[dict[str, Any]]] | None:
    """For ``results["conditions"]``: the task names and one row per condition, else ``None``.

    Each row is ``{"name", "seed", "heads", "heads_list", "accuracy": {task: value}}`` (``heads`` is
    short text, ``heads_list`` the heads themselves or ``None``); a task's metric may be a dict with
    ``"accuracy"`` or a bare number.
    """
    conditions = results.get("conditions") if isinstance(results, dict) else None
    if not isinstance(conditions, list) or not conditions:
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("metrics"), dict) for c in conditions):
        return None
    tasks: list[str] = []
    rows = []
    for c in conditions:
        acc = {}
        for task, m in c["metrics"].items():
            value = m.get("accuracy") if isinstance(m, dict) else m
            if is_number(value):
                acc[task] = value
                if task not in tasks:
                    tasks.append(task)
        heads = c.get("heads")
        rows.append(
            {
                "name": str(c.get("name", "?")),
                "seed": c.get("seed"),
                "heads": heads_text(heads, limit=6)
                if is_head_list(heads)
                else cell(heads, 40)
                if heads
                else "",
                "heads_list": heads if is_head_list(heads) else None,
                "accuracy": acc,
            }
        )
    return (tasks, rows) if tasks else None
