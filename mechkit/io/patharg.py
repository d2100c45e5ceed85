"""A path argument of the Python API, as text: what ``str | os.PathLike`` promises, bytes included.

``os.PathLike`` may give bytes (``__fspath__`` returning ``b"runs/a"``), and ``pathlib.Path`` raises a raw
TypeError on those: ``TaskVector.load``, ``mk.load_report`` and every save did. Each public entry that takes
a path reads it through :func:`text_path` first, so bytes are decoded as the system decodes them and a
non-path is the caller's one-line refusal.
"""

from __future__ import annotations

import os
from pathlib import Path


def text_path(value: object) -> Path | None:
    """``value`` as a :class:`Path` of text, or None where it is no path (see :func:`path_text`).

    >>> text_path(b"runs/b"), text_path(3)
    (PosixPath('runs/b'), None)
    """
    text = path_text(value)
    return None if text is None else Path(text)


def path_text(value: object) -> str | None:
    """``value`` as text, or None where it is no path (or its ``__fspath__`` raises); a trailing ``/`` is
    kept (a ``Path`` drops it, and ``x/`` names a folder where a file is asked for).

    >>> class Raw:
    ...     def __fspath__(self):
    ...         return b"runs/a/"
    >>> path_text(Raw()), path_text(b"runs/b"), path_text("runs/c"), path_text(3)
    ('runs/a/', 'runs/b', 'runs/c', None)
    """
    if not isinstance(value, str | bytes | os.PathLike):
        return None
    try:
        raw = os.fspath(value)
    except Exception:  # noqa: BLE001 - a path object whose own __fspath__ raises: no path
        return None
    return os.fsdecode(raw) if isinstance(raw, str | bytes) else None


def path_arg(value: object, what: str, example: str) -> Path:
    """``value`` as a text :class:`Path`, else one line naming ``what`` took it and an ``example`` call: a wrong
    type had reached ``Path()`` and raised a raw TypeError (``TaskVector.load(None)``).

    >>> try:
    ...     path_arg(None, "TaskVector.load", 'TaskVector.load("v.safetensors")')
    ... except Exception as err:
    ...     print(err)
    TaskVector.load takes a path (a str or pathlib.Path), not NoneType — pass one, e.g. TaskVector.load("v.safetensors")
    """
    from mechkit.errors import MechkitError

    path = text_path(value)
    if path is None:
        raise MechkitError(f"{what} takes a path (a str or pathlib.Path), not {type(value).__name__}",
                           f"pass one, e.g. {example}")
    return path
