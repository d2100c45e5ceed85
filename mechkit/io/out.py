"""The ``--out`` check every command runs before any work: right kind, not clobbering, writable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from mechkit.errors import MechkitError


def check_out(path: str | os.PathLike[str], force: bool = False, kind: Literal["dir", "file"] = "dir") -> Path:
    """``path`` as a Path if a ``kind`` can be written there, else a one-line :class:`MechkitError`.

    Refused: a file where a directory is wanted and a directory where a file is wanted (also with
    ``force``), a non-empty directory or an existing file without ``force``, and a location whose
    nearest existing parent is not a writable directory (probed by making and removing a hidden
    directory there, so a read-only location fails before any work). An empty directory is fine.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> check_out(root / "new" / "run") == root / "new" / "run"
    True
    >>> _ = (root / "v.safetensors").write_bytes(b"x")
    >>> for kind in ("file", "dir"):
    ...     try:
    ...         check_out(root / "v.safetensors", kind=kind)
    ...     except MechkitError as err:
    ...         print(str(err).replace(str(root), "DIR"))
    DIR/v.safetensors already exists — pass --force to overwrite it or choose another --out
    DIR/v.safetensors is a file, not a directory — choose a directory name for --out
    """
    if kind not in ("dir", "file"):
        raise ValueError(f"kind must be 'dir' or 'file', not {kind!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        raise MechkitError(f"--out {str(path)!r} holds a control character (a newline, a tab…)",
                           "choose a path without them")
    path = Path(path)
    try:
        if kind == "dir":
            if path.exists() and not path.is_dir():
                raise MechkitError(f"{path} is a file, not a directory", "choose a directory name for --out")
            if path.is_dir() and not force and any(path.iterdir()):
                raise MechkitError(f"{path} already exists and is not an empty directory",
                                   "pass --force to replace it or choose another --out")
        else:
            if path.is_dir():
                raise MechkitError(f"{path} is a directory, not a file", "pass a file name for --out")
            if path.exists() and not force:
                raise MechkitError(f"{path} already exists", "pass --force to overwrite it or choose another --out")
    except OSError as err:  # e.g. a directory that cannot be listed
        raise MechkitError(f"cannot inspect {path}: {err.strerror or type(err).__name__}",
                           "choose another --out") from err
    _probe_writable(path)
    return path


def _probe_writable(path: Path) -> None:
    """Make and remove a hidden directory in the nearest existing parent of ``path`` (where the
    missing parents or the temporary copy will be created): the one test that sees read-only
    mounts, ACLs and full disks alike."""
    parent = path.absolute().parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise MechkitError(f"{parent} is not a directory, so {path} cannot be created", "choose another --out")
    probe = parent / f".mechkit-probe-{os.urandom(4).hex()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise MechkitError(f"cannot write in {parent}: {err.strerror or type(err).__name__}",
                           "choose an --out in a writable directory") from err
