"""Asking a run's step cache whether it already keeps a key, without computing it.

Shared by the executors (which send out only the units not kept yet) and the traced sweep (which
groups only the missing traces into remote jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[str, Callable[[], Any]], Any]


class _Pending(Exception):
    """Raised in place of a step's compute: the step is not kept yet."""


def stored(step: Step, key: str) -> tuple[bool, Any]:
    """``(True, value)`` where ``step`` already keeps ``key``, else ``(False, None)``, computing nothing
    (a step calls ``compute`` only for a key it does not keep, and keeps nothing when it raises).

    >>> kept = {"a": 1}
    >>> step = lambda key, compute: kept[key] if key in kept else kept.setdefault(key, compute())
    >>> stored(step, "a"), stored(step, "b"), "b" in kept
    ((True, 1), (False, None), False)
    """
    def pending():
        raise _Pending

    try:
        return True, step(key, pending)
    except _Pending:
        return False, None
