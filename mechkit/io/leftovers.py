"""What a killed writer leaves beside its target, recognised and cleaned by the next writer or ``cache clear``.

A write in progress keeps, beside its target (hidden, so listings stay clean):

- ``.NAME.tmp-PID-TOKEN/``: the directory being built (:func:`mechkit.io.temp_dir_beside`), or the file
  (:func:`mechkit.io.atomic_file`); stale once process PID is gone (a name without a pid, from an older
  mechkit, once it is a day old, as is an older mechkit's temporary file ``.NAME.TOKEN.tmp``);
- ``.NAME.old-PID-TOKEN``: an old directory set aside to be deleted; stale once process PID is gone and no
  writer holds NAME (a name without a pid is a user's, never removed);
- ``.NAME.mechkit-lock``: the lock file (:mod:`mechkit.io.outlock`); stale when nobody holds its lock;
- ``.NAME.mechkit-replace``: the journal of a half-installed set (:mod:`mechkit.io.replace`): rolled back.

:func:`stale_leftovers` finds them without touching a live writer's files; :func:`clean_leftovers`
removes them (and rolls journals back).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

from mechkit.io.journal import recover

_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?:(?P<pid>\d+)-)?[0-9a-f]{8}$")
# atomic_file's name before it held a pid: generic enough that only a writer of that very NAME removes it
_OLD_TMP_FILE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.tmp$")
_OLD = re.compile(r"^\.(?P<name>.+)\.old-(?P<pid>\d+)-[0-9a-f]{8}$")  # a pid: a user's .x.old-20251127 is not one
_LOCK = re.compile(r"^\.(?P<name>.+)\.mechkit-lock$")
_JOURNAL = re.compile(r"^\.(?P<name>.+)\.mechkit-replace$")
UNTAGGED_AGE_S = 24 * 3600
_LOCK_OPEN = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a link is never followed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but is someone else's
        return True
    return True


def _lock_free(path: Path) -> bool:
    """Whether nobody holds the flock of lock file ``path`` (checked by taking and releasing it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: never judged stale
        return False
    try:
        fd = os.open(path, _LOCK_OPEN)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > 32:
            return False  # not a lock file mechkit made (a user's file under that name): never removed as one
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _held(folder: Path, name: str) -> bool:
    lock = folder / f".{name}.mechkit-lock"
    return lock.exists() and not lock.is_symlink() and not _lock_free(lock)  # a link is no lock mechkit made


def lock_holder(folder: Path, name: str) -> tuple[bool, int | None]:
    """Whether a live process holds the lock of ``folder/name``, and its pid where the lock file says."""
    if not _held(folder, name):
        return False, None
    try:
        text = (folder / f".{name}.mechkit-lock").read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return True, None
    return True, int(text) if text.isascii() and text.isdigit() else None  # "²": no pid


def is_mechkit_temp(name: str) -> bool:
    """Whether ``name`` is one of the names mechkit gives its temporary files, lock files and journals (live or
    left by a killed writer): a hidden name that matches none of them is a user's (``.git``, ``.notes``).

    >>> is_mechkit_temp(".report.json.tmp-123-0a1b2c3d"), is_mechkit_temp(".git")
    (True, False)
    """
    return any(p.match(name) for p in (_TMP, _OLD_TMP_FILE, _OLD, _LOCK, _JOURNAL))


def stale_leftovers(folder: Path, name: str | None = None, locked: bool = False) -> list[Path]:
    """Leftovers of killed writers in ``folder`` (only those of target ``name`` when given). ``locked``: the
    caller holds ``name``'s lock, so no other writer of it runs and its lock file is its own."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    found = []
    for p in entries:
        for pattern in (_TMP, _OLD, _LOCK, _JOURNAL) if name is None else (_TMP, _OLD, _LOCK, _JOURNAL, _OLD_TMP_FILE):
            m = pattern.match(p.name)
            if m and (name is None or m["name"] == name) and _stale(folder, p, pattern, m, locked):
                found.append(p)
                break
    return found


def _stale(folder: Path, path: Path, pattern: re.Pattern, m: re.Match, locked: bool) -> bool:
    if pattern is _LOCK:
        return not locked and _lock_free(path)
    if not locked and _held(folder, m["name"]):
        return False  # a writer of this target is running: its files are live (its pid may be another namespace's)
    if (pattern is _TMP or pattern is _OLD) and m["pid"]:
        return not _alive(int(m["pid"]))
    if pattern is _TMP or pattern is _OLD_TMP_FILE:
        if pattern is _OLD_TMP_FILE and path.is_dir():
            return False  # only ever a file
        with contextlib.suppress(OSError):
            return time.time() - path.lstat().st_mtime > UNTAGGED_AGE_S
        return False
    return True


def dir_size(path: Path) -> int:
    """Total size in bytes of the files under ``path`` (0 when it is gone)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def size_of(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return dir_size(path)
    with contextlib.suppress(OSError):
        return path.lstat().st_size
    return 0


def clean_leftovers(folder: Path, name: str | None = None, locked: bool = False) -> list[tuple[Path, int]]:
    """Remove the stale leftovers in ``folder`` (journals rolled back first); ``(path, bytes)`` of each."""
    removed = []
    found = stale_leftovers(folder, name, locked)
    for path in sorted(found, key=lambda p: not _JOURNAL.match(p.name)):  # roll back before temp dirs go
        m = _JOURNAL.match(path.name)
        size = size_of(path)
        with contextlib.suppress(OSError):
            if m:
                recover(folder / m["name"])
            elif _LOCK.match(path.name):
                if not _unlink_lock(path):
                    continue
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            else:
                continue  # the roll-back removed it
            removed.append((path, size))
    return removed


def _unlink_lock(path: Path) -> bool:
    """Remove a lock file nobody holds, holding its lock meanwhile (as :func:`mechkit.io.outlock.out_lock` does
    when it ends), so a run that opened it just now sees it gone and locks a new one."""
    import fcntl

    fd = os.open(path, _LOCK_OPEN)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        path.unlink()
        return True
    finally:
        os.close(fd)
