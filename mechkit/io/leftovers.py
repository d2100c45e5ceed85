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
removes them (and rolls journals back). A directory with a mount point anywhere inside is never one: a
removal would delete through the mount (a user's directory bind-mounted there), so it is left alone.

In ``$TMPDIR``, a folder a plugin prepares for its report (``prune --save-model``'s pruned model,
:func:`make_prepared_dir`) is ``mechkit-pruned-PID-TOKEN``, its own ``flock`` held by its run until the report
moved it: stale once process PID is gone and nobody holds its flock or its save's lock (:func:`stale_prepared`,
:func:`clean_prepared`, run by the next such save and by ``cache clear``). ``$TMPDIR`` is every user's: there,
the folder and the hidden entries beside it go by one rule, this user's and provably mechkit's only.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.journal import journal_problem, recover
from mechkit.io.locks import is_lock_text
from mechkit.io.read import mount_points
from mechkit.io.remove import remove_tree

_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?:(?P<pid>\d+)-)?[0-9a-f]{8}$")
# atomic_file's name before it held a pid: generic enough that only a writer of that very NAME removes it
_OLD_TMP_FILE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.tmp$")
_OLD = re.compile(r"^\.(?P<name>.+)\.old-(?P<pid>\d+)-[0-9a-f]{8}$")  # a pid: a user's .x.old-20251127 is not one
_LOCK = re.compile(r"^\.(?P<name>.+)\.mechkit-lock$")
_JOURNAL = re.compile(r"^\.(?P<name>.+)\.mechkit-replace$")
UNTAGGED_AGE_S = 24 * 3600
_LOCK_OPEN = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a link is never followed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie does not: a run killed a moment ago stays one until its parent
    reaps it, and its folders were taken for a live run's (its locks are already released)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but is someone else's
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
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
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > 32 \
                or not is_lock_text(os.pread(fd, 33, 0)):
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


def _entries(folder: Path) -> list[Path]:
    """``folder``'s entries in name order; none where it cannot be listed (gone, unreadable)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def stale_leftovers(folder: Path, name: str | None = None, locked: bool = False, prefix: str = "") -> list[Path]:
    """Leftovers of killed writers in ``folder`` (only those of target ``name`` when given, of targets whose
    name starts with ``prefix`` when given). ``locked``: the caller holds ``name``'s lock, so no other writer
    of it runs and its lock file is its own. A directory holding a mount point is none (see the module)."""
    found = []
    for p in _entries(folder):
        for pattern in (_TMP, _OLD, _LOCK, _JOURNAL) if name is None else (_TMP, _OLD, _LOCK, _JOURNAL, _OLD_TMP_FILE):
            m = pattern.match(p.name)
            if m and (name is None or m["name"] == name) and m["name"].startswith(prefix) \
                    and _stale(folder, p, pattern, m, locked) and mount_inside(p) is None:
                if not (pattern is _JOURNAL and name is None and (not _readable_journal(p, prefix)
                                                                  or journal_problem(folder / m["name"]))):
                    found.append(p)  # a sweep counts no journal it cannot roll back (unreadable_journals)
                break
    return found


def unreadable_journals(folder: Path, prefix: str = "") -> list[tuple[Path, MechkitError]]:
    """The journals in ``folder`` that no roll-back can read (damaged, or naming no folder mechkit makes) and
    no running writer holds, each with the one line saying why and what to do: a sweep of leftovers skips them
    (they need a hand), so that one never fails ``cache clear`` whole or an unrelated run's save."""
    found = []
    for p in _entries(folder):
        m = _JOURNAL.match(p.name)
        if m and m["name"].startswith(prefix) and _readable_journal(p, prefix) and not _held(folder, m["name"]):
            problem = journal_problem(folder / m["name"])
            if problem is not None:
                found.append((p, problem))
    return found


def _readable_journal(path: Path, prefix: str) -> bool:
    """Whether a sweep may open journal ``path`` at all: in ``$TMPDIR`` (a ``prefix`` sweep), shared by every
    user, only this user's are, checked before anything is read (another user's FIFO there hung ``cache
    list``); elsewhere any (what it is, a FIFO included, is then said without blocking by the read itself)."""
    if not prefix:
        return True
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _warn_skipped(problem: MechkitError) -> None:
    """One line on stderr for a leftover a sweep left alone, naming it and what to do."""
    import sys

    print(f"mechkit: warning: {problem.problem}, so it was left alone — {problem.fix}", file=sys.stderr)


def _stale(folder: Path, path: Path, pattern: re.Pattern, m: re.Match, locked: bool) -> bool:
    if pattern is _LOCK:
        return not locked and _lock_free(path)
    if not locked and _held(folder, m["name"]):
        return False  # a writer of this target is running: its files are live (its pid may be another namespace's)
    if pattern is _TMP and os.path.lexists(folder / f".{m['name']}.mechkit-replace"):
        return False  # a journal's roll-back needs it (its old files): it goes with the journal, never before
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


def clean_leftovers(folder: Path, name: str | None = None, locked: bool = False,
                    prefix: str = "") -> list[tuple[Path, int]]:
    """Remove the stale leftovers in ``folder`` (journals rolled back first); ``(path, bytes)`` of each. A sweep
    (no ``name``: ``cache clear``) skips a journal it cannot roll back, in one warning line each; a writer of
    ``name`` meets that journal as its own refusal, before its work (:func:`mechkit.io.outlock.out_lock`)."""
    removed = _remove_leftovers(folder, stale_leftovers(folder, name, locked, prefix), sweep=name is None)
    if name is None:
        for _, problem in unreadable_journals(folder, prefix):
            _warn_skipped(problem)
    return removed


def clean_dead_locks(folder: Path) -> list[tuple[Path, int]]:
    """Remove the lock files directly inside ``folder`` that no live run holds; ``(path, bytes)`` of each.

    A run killed while it wrote ``folder/x`` leaves ``folder/.x.mechkit-lock``. A run that writes ``folder`` itself
    (``--force``) calls this once it holds ``folder``'s lock, when no live run writes inside it
    (:func:`mechkit.io.locks.refuse_locked_below`): the dead lock had stayed among the new run's files. Only lock
    files go: the other leftovers inside are the next writer of their own name's to judge."""
    return _remove_leftovers(folder, [p for p in stale_leftovers(folder) if _LOCK.match(p.name)])


def _remove_leftovers(folder: Path, found: list[Path], sweep: bool = True) -> list[tuple[Path, int]]:
    removed = []
    for path in sorted(found, key=lambda p: not _JOURNAL.match(p.name)):  # roll back before temp dirs go
        m = _JOURNAL.match(path.name)
        size = size_of(path)
        with contextlib.suppress(OSError):
            if m:
                try:
                    recover(folder / m["name"])
                except MechkitError as problem:  # damaged since it was listed: skipped, said, the others go on
                    if not sweep:
                        raise
                    _warn_skipped(problem)
                    continue
            elif _LOCK.match(path.name):
                if not _unlink_lock(path):
                    continue
            elif _TMP.match(path.name) and os.path.lexists(folder / f".{_TMP.match(path.name)['name']}.mechkit-replace"):
                continue  # its journal could not be rolled back just now: its old files stay with it
            elif path.is_dir() and not path.is_symlink():
                if mount_inside(path) is not None or not remove_tree(path):  # never deleted through a mount
                    _warn_kept(path)
                    continue
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


def mount_inside(path: Path, points: frozenset[str] | None = None) -> str | None:
    """The first mount point at ``path`` or anywhere below it (``points``: :func:`mechkit.io.read.mount_points`,
    read again where not given); ``None`` where there is none or ``path`` is no directory. A removal never goes
    through one: ``shutil.rmtree`` descends into a mounted directory, and `cache clear` deleted the user's
    files a bind mount showed inside a run's folder. Bind mounts of the same disk are found in the kernel's list;
    a directory on another device (where that list is missing, not Linux) by its ``st_dev``."""
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    real = Path(os.path.realpath(path))
    points = mount_points() if points is None else points
    inside = sorted(p for p in points if p == str(real) or Path(p).is_relative_to(real))
    if inside:
        return inside[0]
    if os.path.ismount(path):
        return str(real)
    for top, dirs, _ in os.walk(path):  # links are not followed
        for d in dirs:
            with contextlib.suppress(OSError):
                if os.lstat(os.path.join(top, d)).st_dev != info.st_dev:
                    return str(real / os.path.relpath(os.path.join(top, d), path))
    return None


# Files a model folder holds: weights, configs, tokenizer files and mechkit's own metadata (a cache entry, a
# pruned model prepared in $TMPDIR).
MODEL_FILE = re.compile(r"^(.+\.safetensors|model\.safetensors\.index\.json|(generation_)?config\.json|"
                        r"tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json|vocab\.json|"
                        r"merges\.txt|tokenizer\.model|chat_template\.jinja|mechkit-[a-z]+\.json)$")
PREPARED_PREFIX = "mechkit-pruned-"  # as mechkit.io.fs_errors.SCRATCH_PREFIXES names it (a full $TMPDIR's fix)
_PREPARED = re.compile(r"^mechkit-pruned-(?:(?P<pid>\d+)-[0-9a-f]{8}|[a-z0-9_]{8})$")  # no pid: tempfile.mkdtemp's
_PREPARED_MANIFEST = ".mechkit-files"  # mechkit.io.replace.MANIFEST, the names the save wrote


_PREPARED_LOCKS: dict[str, int] = {}  # a prepared folder this process made -> the fd of its held flock
_PREPARED_THREADS: dict[str, int] = {}  # a prepared folder not yet released -> the thread that made it
_DIR_OPEN = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def make_prepared_dir() -> Path:
    """A new folder in ``$TMPDIR`` for a model a plugin prepares before the report moves it into ``--out``:
    ``mechkit-pruned-PID-TOKEN``, so a later run tells a killed run's folder (the whole pruned model, left for
    good by ``tempfile.mkdtemp``'s nameless one) by its pid; the killed runs' folders are removed first.

    The folder's own ``flock`` is held from its creation until :func:`release_prepared` (after the report moved
    it in, or it was removed), and by the kernel until this process ends however it ends: a run in another pid
    namespace, whose pid this one cannot see, had its live model deleted by ``cache clear leftovers`` between
    its save and the report's move, when only its pid spoke for it."""
    with contextlib.suppress(OSError, MechkitError):  # another run's leftover never blocks this one's save
        clean_prepared()
    tmpdir = Path(tempfile.gettempdir())
    while True:
        path = tmpdir / f"{PREPARED_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        fd = _lock_dir(path)
        if fd == -1:  # removed (or locked) by a cleaner between the mkdir and the lock: another name
            continue
        if fd is not None:
            _PREPARED_LOCKS[os.path.realpath(path)] = fd
        _PREPARED_THREADS[os.path.realpath(path)] = threading.get_ident()
        return path


def made_here(path: Path) -> bool:
    """Whether ``path`` is a folder :func:`make_prepared_dir` made in this process and nothing let go yet: the
    only returned path a refused run removes. Any path inside ``$TMPDIR`` counted, so a plugin returning a
    user's own folder there (or the working directory inside it) had it deleted when the run was refused."""
    return os.path.realpath(path) in _PREPARED_THREADS or os.path.realpath(path) in _PREPARED_LOCKS


def release_prepared(path: Path) -> None:
    """Let go of the lock :func:`make_prepared_dir` holds on ``path``, once it has been moved or removed."""
    key = os.path.realpath(path)  # its parent's real path: the name it was given
    _PREPARED_THREADS.pop(key, None)
    fd = _PREPARED_LOCKS.pop(key, None)
    if fd is not None:
        os.close(fd)


def discard_prepared(path: Path) -> None:
    """Remove what a plugin prepared for its report and the report never moved in (a refusal, an error or
    Ctrl-C after the save), and let go of its lock: a file, or a folder with no mount point inside (never
    deleted through one); a link or anything else is left where it is. A folder left held by a live process
    (a notebook's kernel) was a whole model in ``$TMPDIR`` per try, which nothing could clean until it ended."""
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    try:
        if info is not None and stat.S_ISDIR(info.st_mode) and mount_inside(path) is None:
            with contextlib.suppress(OSError):
                remove_tree(path)  # never through a mount that came to be reachable since the check
        elif info is not None and stat.S_ISREG(info.st_mode):
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        release_prepared(path)


@contextlib.contextmanager
def prepared_scope():
    """Within the block, a folder this thread made with :func:`make_prepared_dir` and never handed over (the
    plugin failed, or was interrupted, between its save and its return) is discarded when the block ends,
    however it ends (:func:`discard_prepared`). Another thread's folders (a run beside this one) are not."""
    me = threading.get_ident()
    before = {k for k, t in _PREPARED_THREADS.items() if t == me}
    try:
        yield
    finally:
        for key in [k for k, t in list(_PREPARED_THREADS.items()) if t == me and k not in before]:
            discard_prepared(Path(key))


def _lock_dir(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive ``flock``, still the folder at ``path``; -1 where it is held or gone;
    ``None`` where this system or file system has no such lock (the pid alone then speaks for the folder)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(path, _DIR_OPEN)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            return fd
    except (BlockingIOError, FileNotFoundError):  # held, or removed meanwhile
        pass
    except OSError:  # no flock here (a network file system): unlocked, as before
        os.close(fd)
        return None
    os.close(fd)
    return -1


def _dir_held(path: Path) -> bool:
    """Whether a process holds ``path``'s ``flock`` (a prepared folder in use: :func:`make_prepared_dir`)."""
    fd = _lock_dir(path)
    if fd is None or fd == -1:
        return fd == -1 and os.path.lexists(path)
    os.close(fd)
    return False


def stale_prepared(tmpdir: Path | None = None) -> list[Path]:
    """Killed runs' prepared folders in ``tmpdir`` (``$TMPDIR``) and the lock files, temporary folders and
    journals their saves left beside them, by one rule for every entry (:func:`_removable`): this user's,
    provably mechkit's (a prepared folder's name, holding nothing but a saved model's files, or a plain
    file), no mount point inside, and its prepared folder dead (neither its lock file's nor its own
    ``flock`` held, its pid gone; a name without a pid, from an older mechkit: once a day old). ``$TMPDIR``
    is shared by every user: a root ``cache clear`` deleted another user's hidden folder and lock there."""
    tmpdir = Path(tempfile.gettempdir()) if tmpdir is None else tmpdir
    return _stale_beside(tmpdir) + [p for p, _ in _prepared_entries(tmpdir) if _removable(tmpdir, p, p.name)]


def _stale_beside(tmpdir: Path) -> list[Path]:
    """The hidden leftovers beside prepared folders that :func:`_removable` allows."""
    found = []
    for path in stale_leftovers(tmpdir, prefix=PREPARED_PREFIX):
        m = next(m for pattern in (_TMP, _OLD, _LOCK, _JOURNAL) if (m := pattern.match(path.name)))
        if _removable(tmpdir, path, m["name"]):
            found.append(path)
    return found


def _prepared_entries(tmpdir: Path) -> list[tuple[Path, re.Match]]:
    try:
        return sorted((p, m) for p in tmpdir.iterdir() if (m := _PREPARED.match(p.name)))
    except OSError:
        return []


def _removable(tmpdir: Path, path: Path, name: str) -> bool:
    """The rule for any entry ``path`` in ``$TMPDIR`` that belongs to prepared folder ``name`` (the folder
    itself, or its save's lock file, temporary folder or journal): this user's, no link, a plain file or a
    folder holding only a saved model's files and no mount point, and ``name`` a prepared folder nobody uses."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if info.st_uid != os.geteuid() or not _PREPARED.match(name):
        return False  # another user's (a root cache clear deleted theirs), or no name mechkit gives
    if stat.S_ISDIR(info.st_mode):
        if not _model_files_only(path) or mount_inside(path) is not None:
            return False
    elif not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        return False
    return not _prepared_in_use(tmpdir, name)


def _model_files_only(path: Path) -> bool:
    try:
        names = list(path.iterdir())
    except OSError:
        return False
    return all(not p.is_symlink() and p.is_file() and (MODEL_FILE.match(p.name) or p.name == _PREPARED_MANIFEST
                                                       or is_mechkit_temp(p.name)) for p in names)


def _prepared_in_use(tmpdir: Path, name: str) -> bool:
    """Whether prepared folder ``name`` may be in use: its save's lock file or its own flock held, its pid alive
    (a name without one: less than a day old), or the folder another user's."""
    if _held(tmpdir, name):
        return True
    folder = tmpdir / name
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        info = None
    except OSError:
        return True
    if info is not None and (info.st_uid != os.geteuid() or (stat.S_ISDIR(info.st_mode) and _dir_held(folder))):
        return True
    pid = _PREPARED.match(name)["pid"]
    if pid:
        return _alive(int(pid))
    return info is not None and time.time() - info.st_mtime <= UNTAGGED_AGE_S


def clean_prepared(tmpdir: Path | None = None) -> list[tuple[Path, int]]:
    """Remove what :func:`stale_prepared` finds (journals rolled back first); ``(path, bytes)`` of each. A
    folder is removed holding its flock, so a run that locks it meanwhile sees it gone and makes another. A
    journal no roll-back can read is left alone, in one warning line (after the folders, so its fix names
    what is still there)."""
    tmpdir = Path(tempfile.gettempdir()) if tmpdir is None else tmpdir
    removed = _remove_leftovers(tmpdir, _stale_beside(tmpdir))
    for path, _ in _prepared_entries(tmpdir):
        if not _removable(tmpdir, path, path.name):
            continue
        fd = _lock_dir(path)
        if fd == -1:
            continue
        try:
            size = dir_size(path)
            with contextlib.suppress(OSError):
                if remove_tree(path):  # never through a mount
                    removed.append((path, size))
        finally:
            if fd is not None:
                os.close(fd)
    for path, problem in unreadable_journals(tmpdir, PREPARED_PREFIX):  # this user's, its folder dead: said
        if not _prepared_in_use(tmpdir, _JOURNAL.match(path.name)["name"]):  # this user's (a FIFO too): said
            _warn_skipped(problem)
    return removed


def _warn_kept(path: Path) -> None:
    """Say in one line that a leftover stays: a mount is at it or inside it (a cover over it unmounted since the
    check), and nothing is ever deleted through one."""
    import sys

    why = ("a mount point is at it or inside it, and mechkit never deletes through a mount; unmount it"
           if mount_inside(path) is not None or os.path.ismount(path) else
           "part of it could not be removed (a file the system refused to delete: read-only, immutable or in use); "
           "fix that")
    print(f"mechkit: warning: kept {path}: {why}, then clear again (mechkit cache clear leftovers)", file=sys.stderr)
