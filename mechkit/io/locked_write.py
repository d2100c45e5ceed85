"""One file written by the Python API (an attention page, an activation vector), under its lock like every writer.

``TaskVector.save`` took its file's lock, but ``AttentionView.save`` and ``ActivationVector.save`` did not:
saved into a directory another mechkit run was writing (``attention --out d --force``), the file went in
without a word, and the run's set could then replace it. Here the save takes the file's own lock, which
also refuses a directory above it that a live run holds (:func:`mechkit.io.locks.refuse_locked_ancestor`),
and checks again under it that the file is not one of a run's set or a model's
(:func:`mechkit.io.replace.refuse_foreign_file`).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_locked(path: str | os.PathLike[str], data: bytes | str, writer: str) -> Path:
    """Write ``data`` to ``path`` atomically under its lock; ``writer`` names the caller in refusals.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "page.html"
    >>> write_locked(p, "<p>hi</p>", "the attention page").read_text()
    '<p>hi</p>'
    >>> sorted(q.name for q in p.parent.iterdir())   # no lock file left
    ['page.html']
    """
    from mechkit.io.atomic import file_path, write_atomic
    from mechkit.io.fs_errors import one_line_errors
    from mechkit.io.out import refuse_dot_dot_past_missing
    from mechkit.io.outlock import out_lock
    from mechkit.io.replace import refuse_foreign_file

    path = file_path(path)  # a non-path, bytes, `x/`: one line (or decoded) before any check reads it
    with one_line_errors():  # a full disk: one line, as the CLI gives, not an OSError traceback
        refuse_dot_dot_past_missing(path, "file", "the path")  # `f/../page.html`: "mkdir -p f/.." could never be done
        refuse_foreign_file(path, writer)  # never a model's or another run's file
        if path.is_dir() or not path.parent.is_dir():
            return write_atomic(path, data)  # refuses a non-path, a directory or a missing folder in one line
        with out_lock(path):
            refuse_foreign_file(path, writer)  # again: a run may have installed its set meanwhile
            return write_atomic(path, data)
