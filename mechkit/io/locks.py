"""Whether another live mechkit run is writing a place: the lock file of a run's ``--out`` and what a writer
reads of it (its holder's pid), without taking it for long.

Apart from :mod:`mechkit.io.outlock`, which takes and holds the lock for a run, because the checks of an
``--out`` (:mod:`mechkit.io.out`) ask it before any work, and :mod:`mechkit.io.outlock` uses those checks.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.read import canonical_place


def lock_path(out_dir: str | os.PathLike[str]) -> Path:
    """The lock file of a run writing ``out_dir``: hidden, beside it, never inside the report directory.

    The directory's real identity decides: ``runs/a``, ``./runs/../runs/a``, a symlink to it and the same
    folder through a bind mount share one lock (symlinks and ``..`` resolved, as far as the path exists, and a
    bind mount's name taken through its file system's own mount: :func:`real_place`).

    >>> import os
    >>> lock_path("runs/a") == lock_path("runs/../runs/a") == lock_path(os.path.abspath("runs/a"))
    True
    >>> lock_path("runs/a").name
    '.a.mechkit-lock'
    """
    out = real_place(out_dir)
    return out.parent / f".{out.name}.mechkit-lock"


def real_place(path: str | os.PathLike[str]) -> Path:
    """``path`` with symlinks and ``..`` resolved and a bind mount's name taken through its file system's own
    mount: the one name of a place that every lock is named by."""
    try:
        path = Path(path).expanduser()
    except RuntimeError:  # ~user of a user with no home: the name as it is (the caller's own check says so)
        path = Path(path)
    return canonical_place(Path(os.path.realpath(path)))


class OutInUseError(MechkitError):
    """Another mechkit run holds the lock of the same ``--out``."""


def holder(fd: int) -> str:
    """The pid recorded in a lock file another run holds (it writes it just after locking)."""
    for _ in range(50):
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return ""
        if text:
            return text
        time.sleep(0.01)
    return ""


def whose(pid: str) -> str:
    """`` (pid N)`` for a lock's holder, saying so where that is this very process (another thread's run)."""
    if not pid:
        return ""
    return f" (pid {pid}, this very process)" if pid == str(os.getpid()) else f" (pid {pid})"


class _HeldHere(threading.local):
    """The lock files this thread holds: a writer inside a directory its own run is writing is no conflict.

    Per thread, not per process: ``write_report`` from a second thread took a lock that ``mk.run`` in another
    thread held as its own, wrote the report, and the run failed after its work. Another thread's lock is
    another run's, and refused like one (its ``flock`` is taken on another open file)."""

    def __init__(self) -> None:
        self.paths: dict[Path, tuple[int, int] | None] = {}  # each lock file held -> its device and inode

    def __contains__(self, path: object) -> bool:
        """A lock file held here, by its name or, under another name, by its identity: a mount added or removed
        during the run changes the name a place's lock is given (:func:`real_place`), and the run's own lock was
        then refused as another's, after all its work."""
        if path in self.paths:
            return True
        known = [held for held in self.paths.values() if held is not None]
        return bool(known) and isinstance(path, (str, os.PathLike)) and _file_identity(path) in known

    def add(self, path: Path) -> None:
        self.paths[path] = _file_identity(path)

    def discard(self, path: Path) -> None:
        self.paths.pop(path, None)


def _file_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


HELD = _HeldHere()


def refuse_in_use(out: str | os.PathLike[str]) -> None:
    """Refuse (one line) an ``out`` another live mechkit run is writing, itself or a directory above it, before
    any work: ``taskvec extract --out x/v.safetensors`` while ``finetune --out x`` runs was refused only when
    it saved, after the model had loaded and the vector was computed. A lock this process holds is no
    conflict; the writer's own lock (:func:`mechkit.io.outlock.out_lock`) checks again when it is taken."""
    real = real_place(out)
    lock = lock_path(real)
    pid = _lock_taken(lock) if lock not in HELD else None
    if pid is not None:
        raise OutInUseError(f"--out {out} is in use by another mechkit run" + whose(pid),
                            "wait for it or choose another --out")
    refuse_locked_ancestor(real, out)
    refuse_locked_below(real, out)


def _lock_taken(lock: Path, held_here: bool = True) -> str | None:
    """The pid (``""`` where unknown) of a live process holding the lock file ``lock``, else ``None``
    (taken and released at once to see); ``held_here=False``: a lock this thread holds is ``None`` too."""
    import fcntl

    if not held_here and lock in HELD:
        return None
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # none (the usual case), or not one mechkit made: the writer's own lock refuses that
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        return holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def refuse_locked_ancestor(real: Path, out: str | os.PathLike[str]) -> None:
    """Refuse (one line) to write ``real`` inside a directory another live mechkit run is writing: ``taskvec
    extract --out x/v.safetensors`` while ``finetune --out x`` runs. Each folder above is named as its own
    writer names it (:func:`real_place`: a folder and the one below it can be named through different mounts,
    where one name is too long for a lock), and its lock tried without waiting and released at once; one this
    thread holds is no conflict."""
    for above in Path(real).parents:
        if above.parent == above:
            break
        folder = canonical_place(above)
        pid = _lock_taken(folder.parent / f".{folder.name}.mechkit-lock", held_here=False)
        if pid is not None:
            raise OutInUseError(f"--out {out} is inside {folder}, which another mechkit run is writing"
                                + whose(pid), "wait for it or choose another --out")


def refuse_locked_below(real: Path, out: str | os.PathLike[str]) -> None:
    """Refuse (one line) to write ``real`` where another live mechkit run is writing a folder directly inside it:
    ``finetune --out x --force`` (which replaces ``x/model``) while a run writes ``--out x/model`` took ``x``'s lock
    without a word, since only the folders above an ``--out`` were asked. The lock files beside its entries are
    tried, under its own name and its one name (:func:`real_place`)."""
    for folder in dict.fromkeys((Path(real), canonical_place(Path(real)))):
        try:
            names = [e.name for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(_LOCK)]
        except OSError:  # not there yet, or not a folder: nothing is written inside it
            continue
        for name in names:
            pid = _lock_taken(folder / name, held_here=False)
            if pid is not None:
                inside = folder / name[1:-len(_LOCK)]
                raise OutInUseError(f"--out {out} holds {inside}, which another mechkit run is writing"
                                    + whose(pid), "wait for it or choose another --out")


_LOCK = ".mechkit-lock"
_LOCK_TEXT = re.compile(rb"(\d+\n?)?")  # what mechkit writes: nothing yet, or the pid and a newline


def is_lock_text(data: bytes) -> bool:
    r"""Whether ``data`` is what a lock file mechkit made holds: its holder's pid, or nothing yet. A user's note
    under a lock's name (``.run.mechkit-lock`` holding "my notes") is no lock: never truncated, never removed.

    >>> is_lock_text(b"1234\n"), is_lock_text(b""), is_lock_text(b"my notes"), is_lock_text(b"  7 \n")
    (True, True, False, False)
    """
    return _LOCK_TEXT.fullmatch(data) is not None
