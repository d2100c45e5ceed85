"""Atomic files and directories: a reader never sees a half-written one.

Everything is written under a unique temporary name in the target's own directory (same
filesystem, so ``os.replace`` is atomic), then renamed over the target in one step. Unique names
mean two writers never share a temporary file; whoever renames last wins, whole.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from mechkit.errors import MechkitError


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically (text is UTF-8); return the path.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> write_atomic(p, '{"a": 1}').read_text()
    '{"a": 1}'
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # honours the umask, unlike tempfile.mkstemp (0600)
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def temp_dir_beside(target: str | os.PathLike[str]) -> Path:
    """A new, empty hidden directory next to ``target`` (same filesystem), for building ``target``.

    ``os.mkdir`` honours the umask: ``tempfile.mkdtemp`` would make it 0700, and a directory renamed
    into place would then be private.
    """
    target = Path(target)
    while True:
        tmp = target.parent / f".{target.name}.tmp-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str], replace: bool = False) -> Iterator[Path]:
    """Build a directory in a hidden temporary directory beside ``target``; on success it becomes
    ``target`` in one rename, on any error (Ctrl-C included) it is removed.

    An existing ``target`` is swapped out and deleted only when ``replace`` is true; otherwise the
    rename fails with :class:`~mechkit.errors.MechkitError` — also when another writer created
    ``target`` while this one was building (one wins, the other is told).

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "model"
    >>> with atomic_dir(out) as tmp:
    ...     _ = (tmp / "config.json").write_text("{}")
    >>> sorted(p.name for p in out.iterdir())
    ['config.json']
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(target)
    try:
        yield tmp
        _rename_dir(tmp, target, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _rename_dir(tmp: Path, target: Path, replace: bool) -> None:
    if target.exists() or target.is_symlink():
        if not replace:
            raise MechkitError(f"{target} already exists", "pass --force to replace it or choose another --out")
        old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
        return
    try:
        os.replace(tmp, target)  # renaming onto a directory another writer just made fails: never merged
    except OSError as err:
        if target.exists():
            raise MechkitError(f"{target} was created by another writer meanwhile",
                               "choose another --out, or pass --force to replace it") from err
        raise
