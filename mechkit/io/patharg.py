"""A path argument of the Python API, as text: what ``str | os.PathLike`` promises, bytes included.

``os.PathLike`` may give bytes (``__fspath__`` returning ``b"runs/a"``), and ``pathlib.Path`` raises a raw
TypeError on those: ``TaskVector.load``, ``mk.load_report`` and every save did. Each public entry that takes
a path reads it through :func:`text_path` first, so bytes are decoded as the system decodes them and a
non-path is the caller's one-line refusal.
"""

from __future__ import annotations

import os
from pathlib import Path


def names_folder(text: str) -> bool:
    """Whether path text names a folder by its spelling: a trailing ``/``, or a last part ``.`` or ``..``
    (``notes/.``): ``Path`` drops both, and a save to ``notes/.`` had replaced the user's file ``notes``.

    >>> [names_folder(t) for t in ("a/", "a/.", "a/..", ".", "a", "a.b")]
    [True, True, True, True, False, False]
    """
    last = text.rstrip("/").rsplit("/", 1)[-1]
    return text.endswith("/") or last in (".", "..")


def folder_tail(text: str) -> str:
    """The spelling that makes ``text`` name a folder (see :func:`names_folder`): ``/``, ``/.`` or ``/..``."""
    return "/" if text.endswith("/") else "/" + text.rsplit("/", 1)[-1] if "/" in text else text


def folder_fix(text: str, prefix: str = "", example: str = "page.html") -> str:
    """The fix for a file path that names a folder (``x/``, ``x/.``): a file inside it where it is a folder, else
    the path without that ending, named as the system resolves it (never a file under a file, never a ``..`` past a
    missing name); ``prefix`` is the option to write before it (``"--out "``), if any.

    >>> folder_fix("/", "--out ")
    'name a file inside it, e.g. --out /page.html'
    """
    meant = Path(os.path.realpath(text.rstrip("/") or "/"))
    if meant.is_dir():
        return f"name a file inside it, e.g. {prefix}{meant / example}"
    return f"drop the {folder_tail(text)} ({prefix}{meant})"


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
    return Path(checked_text(value, what, example))


def checked_text(value: object, what: str, example: str) -> str:
    """``value`` as path text (a trailing ``/`` kept), else one line: no path at all, an empty one (``Path("")`` is
    the working directory: ``mk.load_report("")`` read ``./report.json``), or one holding a NUL byte (no file name
    can: a raw ValueError once a folder was made with it)."""
    from mechkit.errors import MechkitError

    text = path_text(value)
    if text is None:
        raise MechkitError(f"{what} takes a path (a str or pathlib.Path), not {type(value).__name__}",
                           f"pass one, e.g. {example}")
    if not text:  # " " is a name a file can have: only "" is none
        raise MechkitError(f"{what} was given an empty path, which names no file", f"pass one, e.g. {example}")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): a raw UnicodeEncodeError from the first look-up
        raise MechkitError(f"{what} was given a path holding {ascii(text)[1:-1][:80]}, a character no file name can "
                           "hold", f"pass one, e.g. {example}") from None
    if "\0" in text:
        raise MechkitError(f"{what} was given a path holding a NUL byte, which no file name can hold",
                           f"pass one, e.g. {example}")
    return text


def expand_user(path: str | os.PathLike[str], what: str = "the path") -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; one line where it names a user with no home
    (``~nosuchuser/r``): :meth:`Path.expanduser` raised RuntimeError, a traceback from every reader.

    >>> expand_user("runs/a")
    PosixPath('runs/a')
    """
    from mechkit.errors import MechkitError

    try:
        return Path(path).expanduser()
    except RuntimeError:
        first = os.fspath(path).split("/")[0]
        raise MechkitError(f"{what} {os.fspath(path)} starts with {first}, which names no user with a home "
                           "directory here", "spell the path out (an absolute path, or ~/ for your own home)") from None


def reader_path(value: object, what: str, example: str) -> Path:
    """The path a reader of a file (a report, a vector, a scheduler) was given, checked before any look-up: a
    path at all (:func:`path_arg`), ``~user`` expanded (:func:`expand_user`), and no name longer than the file
    system allows, each refused in one line. A long name had raised a raw OSError from the first look-up (in
    the API), or "choose a shorter --out" (on the command line, for a command with no --out).

    >>> try:
    ...     reader_path("a" * 300, "the report", 'mk.load_report("runs/a")')
    ... except Exception as err:
    ...     print(str(err)[-69:])
    it is 300 bytes long, and the file system allows 255 — check the path
    """
    from mechkit.errors import MechkitError
    from mechkit.io.fs_errors import NAME_MAX, PATH_MAX

    text = checked_text(value, what, example)
    path = expand_user(text, what)
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > NAME_MAX or len(os.fsencode(os.fspath(path))) > PATH_MAX:
        shown = os.fspath(path)
        why = (f"a name in it is {longest} bytes long, and the file system allows {NAME_MAX}" if longest > NAME_MAX
               else f"it is longer than the {PATH_MAX} bytes the system allows")
        raise MechkitError(f"cannot look up {what} {shown[:60]}{'…' if len(shown) > 60 else ''}: {why}",
                           "check the path")
    if names_folder(text) and os.path.lexists(path) and not os.path.isdir(path):  # Path() drops it: the file read
        raise MechkitError(f"{what} {text} names a folder (it ends with / or .), and {path} is a file",
                           f"name the file itself ({path})")
    return path
