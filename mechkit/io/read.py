"""Read a file mechkit wrote only where it is still a plain file of sensible size.

A run directory is the user's: anything may sit under a name mechkit wrote. A FIFO there blocks a plain
``open`` until some other process writes to it (``report compare`` hung); a device never ends; a symlink
carries any local file into a page. So every read of a run's own files opens the name without following
a link and without blocking, checks on the open descriptor that it is a regular file under a size limit,
and only then reads.

>>> import os, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "report.json").write_text("{}")
>>> read_regular(d / "report.json", limit=100)
b'{}'
>>> os.mkfifo(d / "pipe.png")
>>> read_regular(d / "pipe.png", limit=100) is None    # returns at once: a FIFO is not read
True
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a symlink, FIFO, device or socket) of at most
    ``limit`` bytes; else ``None``. Never blocks and never follows a link."""
    try:
        fd = os.open(Path(path), _FLAGS)
    except (OSError, ValueError):  # ValueError: a name no file can have (a NUL, a lone surrogate from JSON)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def read_regular_text(path: str | os.PathLike[str], limit: int = 32 * 2**20) -> str | None:
    """:func:`read_regular` decoded as UTF-8; ``None`` where it is not a plain file or not UTF-8."""
    data = read_regular(path, limit)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None
