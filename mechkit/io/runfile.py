"""Read one JSON file of a run (its ``report.json``): what every reader of a run's file must do first.

``mechkit report show`` settled a killed ``--force`` write, refused a link in place of the run's own file, a
FIFO (the read would block) and a file past the size limit, and read without following links; a tool's reader
of the same file (``mechkit.taskselect.rho.load_report``) did none of it, and hung on a FIFO. Both read here.
"""

from __future__ import annotations

import os
from pathlib import Path

from mechkit.errors import MechkitError

MAX_RUN_FILE_BYTES = 32 * 2**20  # a run's largest report is about 1 MB: the writer refuses more, a reader too


def settled_file(value: object, call: str, what: str, example: str) -> tuple[Path, bool]:
    """``(path, whether it is a regular file)`` for a loader of one file (a task or activation vector): the path
    checked as :func:`mechkit.io.patharg.reader_path` checks it (no path at all named by ``call``), and a killed
    ``--force`` write of the run holding it rolled back first; a folder above that cannot be searched is one line.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "v.safetensors"
    >>> settled_file(f, "TaskVector.load", "the task vector", 'TaskVector.load("v.safetensors")')[1]
    False
    """
    from mechkit.io.fs_errors import one_line_errors
    from mechkit.io.outlock import settle_interrupted
    from mechkit.io.patharg import path_arg, reader_path, text_path

    if text_path(value) is None:
        path_arg(value, call, example)  # no path at all: the call named
    path = reader_path(value, what, example)  # bytes, ~user, a name too long, a trailing / after a file
    with one_line_errors(reading=True):
        settle_interrupted(path.parent)
        return path, path.is_file()


def read_run_file(path: str | os.PathLike[str], limit: int, name: str = "report.json", what: str = "report",
                  fix: str = "pass a report.json written by a mechkit run") -> tuple[Path, bytes]:
    """``(file, bytes)`` of ``path`` (a run directory, whose ``name`` is read, or the file itself), else one line.

    >>> import tempfile, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / "report.json").write_text("{}")
    >>> read_run_file(run, 100)[1]
    b'{}'
    >>> os.mkfifo(run / "pipe.json")
    >>> try:
    ...     read_run_file(run / "pipe.json", 100)
    ... except MechkitError as err:
    ...     print(str(err).replace(str(run), "RUN"))
    RUN/pipe.json is not a regular file — pass a report.json written by a mechkit run
    """
    from mechkit.io.fs_errors import one_line_errors
    from mechkit.io.patharg import reader_path

    p = reader_path(path, f"the {what}", f"a run directory such as mechkit-runs/NAME, or its {name}")
    with one_line_errors(reading=True):  # a folder above that cannot be searched: one line, in the API too
        return _read(p, limit, name, what, fix)


def _read(p: Path, limit: int, name: str, what: str, fix: str) -> tuple[Path, bytes]:
    from mechkit.io.outlock import settle_interrupted
    from mechkit.io.read import read_regular

    settle_interrupted(p if p.is_dir() else p.parent)  # a killed --force write: its old set back whole
    if p.is_dir():
        p = p / name
        if p.is_symlink():  # a run's file is its own: a link could carry any local JSON into a page
            raise MechkitError(f"{p} is a symlink, not the run's own {what}",
                               "pass the file it points to as PATH if you trust it")
    if os.path.lexists(p) and not p.is_file():  # a FIFO would block the read, a device never end
        raise MechkitError(f"{p} is not a regular file", fix)
    if not p.is_file():
        raise MechkitError(f"no {what} at {p}", "pass a run directory (under ./mechkit-runs/) or its " + name)
    size = p.stat().st_size
    if size > limit:  # refused before reading: a crafted file must fail fast, not after minutes
        raise MechkitError(f"{p} is {size / 2**20:.0f} MB, more than a {what}'s limit of {limit // 2**20} MB", fix)
    data = read_regular(os.path.realpath(p), limit)  # a PATH the user named may be a link
    if data is None:  # it changed since the checks above: now a FIFO, a device or larger
        raise MechkitError(f"{p} is no longer a regular file of at most {limit // 2**20} MB", fix)
    return p, data
