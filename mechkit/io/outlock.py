"""The lock of a run's output directory: two runs never race to the same ``--out`` (or resume directory).

An ``flock`` on a hidden file beside the directory, which the kernel releases however the holder ends;
beside :mod:`mechkit.io.atomic`, which makes what the run writes there appear whole.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from mechkit.errors import MechkitError, ReportExistsError
from mechkit.io.locks import (
    HELD,
    OutInUseError,
    holder,
    is_lock_text,
    lock_path,
    real_place,
    refuse_locked_ancestor,
    refuse_locked_below,
    whose,
)
from mechkit.io.out import check_out


@contextlib.contextmanager
def out_lock(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the lock of ``out_dir`` for a run, or raise :class:`OutInUseError` (one line) at once.

    An ``flock`` on :func:`lock_path`, a hidden file beside ``out_dir`` holding the owner's pid: the
    kernel releases it when the process ends however it ends (``kill -9`` included), so a lock file a
    killed run left behind is simply taken over. The file is removed, still locked, when the run ends
    (success, error or Ctrl-C); a run that locked a file just removed this way sees it is no longer at
    the path and locks the new one, so two runs never both hold the lock. Missing parents of
    ``out_dir`` are created for the lock file, and removed again if the run leaves them empty.
    Where ``fcntl`` is missing (Windows) runs are not locked.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> with out_lock(out):
    ...     try:
    ...         with out_lock(out):
    ...             pass
    ...     except OutInUseError as err:
    ...         print(str(err).replace(str(out), "OUT").replace(str(os.getpid()), "N"))
    --out OUT is in use by another mechkit run (pid N, this very process) — wait for it or choose another --out
    >>> lock_path(out).exists()
    False
    """
    try:
        import fcntl  # noqa: F401 - only whether it exists (Windows has none)
    except ImportError:  # pragma: no cover - Windows
        yield lock_path(out_dir)
        return
    path = lock_path(out_dir)
    created: list[Path] = []
    try:  # exists() itself raises for a name too long ($MECHKIT_CACHE's): one line, and a resume lock warns
        created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
        for attempt in itertools.count():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = _open_lock(path)
            except FileNotFoundError:  # a parent another run had made was removed again as it ended
                if attempt < 100:
                    continue
                raise
            try:
                _flock_soon(fd)
            except BlockingIOError:
                pid = holder(fd)
                os.close(fd)
                raise OutInUseError(f"--out {out_dir} is in use by another mechkit run"
                                    + whose(pid),
                                    "wait for it or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed this file as it finished: lock the one now at the path
    except OSError as err:
        _remove_empty(created)
        raise MechkitError(f"cannot lock --out {out_dir}: {err.strerror or type(err).__name__} ({path})",
                           "choose an --out in a writable directory") from err
    except BaseException:
        _remove_empty(created)
        raise
    HELD.add(path)
    try:
        _write_pid(fd, path, out_dir)
        from mechkit.io.leftovers import clean_dead_locks, clean_leftovers

        real = Path(os.path.realpath(Path(out_dir).expanduser()))
        refuse_locked_ancestor(real, out_dir)
        refuse_locked_below(real, out_dir)  # a live run writing a folder inside it (that --force would replace)
        clean_leftovers(real.parent, real.name, locked=True)  # a killed writer's temp dirs and half-installed set
        _recover_as_named(out_dir, real)
        clean_dead_locks(real)  # a killed run's lock of a folder inside, which no live run holds (checked above)
        yield path
    finally:
        HELD.discard(path)
        with contextlib.suppress(OSError):
            path.unlink()  # while still locked: whoever opened it meanwhile retries on the new file
        os.close(fd)
        _remove_empty(created)  # those the run left empty (a written report keeps its parents)


def _recover_as_named(out_dir: str | os.PathLike[str], real: Path) -> None:
    """Roll back, under ``real``'s lock, a killed write's journal beside ``out_dir`` as named, where that name now
    leads elsewhere (the user moved the folder and put a link to it in its place): the journal is beside the name
    the write had, so readers said "no report" while the old set waited, and a writer committed over the half set
    without a word, its journal left to block the next read."""
    from mechkit.io.journal import journal_path, recover

    given = Path(os.path.abspath(os.fspath(out_dir)))
    with contextlib.suppress(OSError):
        if given != real and journal_path(given).exists():
            recover(given)  # through the link: the half set is where the name leads


def _write_pid(fd: int, path: Path, out_dir: str | os.PathLike[str]) -> None:
    """Record this process's pid in its lock file, or one line naming the lock file: on a full disk the
    ``pwrite`` failed with an OSError naming no file, which reached the user as "cannot write a file mechkit
    was writing ... choose another --out" even where the full disk was $MECHKIT_CACHE's (a run's resume
    lock), and stopped a run that goes on, unkept, when the cache cannot hold its steps."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as err:
        from mechkit.io.fs_errors import describe

        named = OSError(err.errno, err.strerror or type(err).__name__, os.fspath(path))
        raise (describe(named) or MechkitError(f"cannot lock --out {out_dir}: {named.strerror} ({path})",
                                               "choose an --out in a writable directory")) from named


_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
LOCK_MAX_BYTES = 32  # a pid and a newline: anything larger at the lock's name is not a lock mechkit made


def _open_lock(path: Path) -> int:
    """Open (or create) the lock file ``path``, or refuse (one line) what sits at its name and is not one: the
    lock is truncated and written, so a symlink or a hard link there would have replaced the user's file it
    leads to with a pid, a FIFO gave a traceback and a directory a fix that could not help."""
    try:
        fd = os.open(path, _LOCK_FLAGS, 0o644)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) or (os.path.lexists(path) and not path.is_file()):
            _refuse_not_a_lock(path)
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > LOCK_MAX_BYTES \
                or not is_lock_text(os.pread(fd, LOCK_MAX_BYTES + 1, 0)):  # a user's note there: never truncated
            _refuse_not_a_lock(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_not_a_lock(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
        links = path.lstat().st_nlink
    except OSError:
        mode, links = 0, 1
    what = ("a symlink" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a hard link to another file" if stat.S_ISREG(mode) and links > 1
            else "a file that is not a lock" if stat.S_ISREG(mode) else "not a regular file")
    raise MechkitError(f"{path} is {what}, not a lock file mechkit made, and mechkit locks the --out beside it "
                       "there", f"move {path} away (mechkit never writes through it), or choose another --out")


def _flock_soon(fd: int) -> None:
    """Lock ``fd`` exclusively, retrying for up to ~0.1 s: another writer's :func:`refuse_locked_ancestor`
    holds a directory's lock for microseconds while it looks, which must not refuse the directory's own run."""
    import fcntl

    for attempt in range(20):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == 19:
                raise
            time.sleep(0.005)


def _remove_empty(dirs: list[Path]) -> None:
    """Remove the directories a failed run created (deepest first) while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


def check_run_out(out_dir: Path, force: bool, inputs: tuple = (), plugin: str | None = None,
                  writes: tuple[str, ...] = ()) -> None:
    """Refuse ``out_dir`` (one line) where a run's report cannot go: a report already there without
    ``force``, a file, a read-only place, the working or home directory, the cache, a place holding an input,
    or (``plugin`` given) a model another plugin's run saved there, or one among ``writes`` (the run's other
    outputs) that mechkit never wrote (:func:`mechkit.io.replace.refuse_foreign_model`)."""
    from mechkit.io.fs_errors import check_name_lengths

    check_name_lengths(out_dir)  # first: a name too long makes even exists() fail
    if (out_dir / "report.json").exists() and not force:
        raise ReportExistsError(f"{out_dir} already holds a report", "pass --force to overwrite or choose another --out")
    check_out(out_dir, force=force, kind="dir", inputs=inputs)
    if force and plugin is not None:
        from mechkit.io.replace import refuse_foreign_model

        refuse_foreign_model(out_dir, plugin, ("report.json", "report.html", *writes))  # what the run writes


@contextlib.contextmanager
def locked_fresh_dir(base: Path) -> Iterator[Path]:
    """A fresh run directory named ``base`` (else ``base-2``, ``base-3`` …), locked: two runs started in
    the same second get ``NAME`` and ``NAME-2`` instead of one failing."""
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        if candidate.exists():
            continue
        try:
            check_run_out(candidate, force=False)
        except OutInUseError:  # another run started with this name just now: take the next
            continue
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(out_lock(candidate))
            except OutInUseError:
                continue
            if candidate.exists():  # made between the check and the lock
                continue
            yield candidate
            return
    raise MechkitError(f"no free run directory name beside {base}", "pass --out")


@contextlib.contextmanager
def claimed(resume: Path, console) -> Iterator[Path | None]:
    """The run's resume directory, locked for it; ``None`` (with a warning) where another run of the same
    plugin, options, seed and model holds it, so two such runs never write or clear each other's steps."""
    try:
        lock = out_lock(resume)
        lock.__enter__()
    except OutInUseError:
        console.print(f"mechkit: warning: another run with the same options and model is keeping its steps in "
                      f"{resume}; this one keeps none (it will not resume if stopped)",
                      markup=False, highlight=False, soft_wrap=True)
        yield None
        return
    except MechkitError as err:  # an unwritable cache (or a file where it should be): the run goes on, unkept
        why = err.__cause__.strerror if isinstance(err.__cause__, OSError) and err.__cause__.strerror else "unwritable"
        console.print(f"mechkit: warning: cannot keep finished steps in {resume} ({why}); this run will not "
                      "resume from here if it stops", markup=False, highlight=False, soft_wrap=True)
        yield None  # not resumable: no steps kept, no checkpoints (a plugin's scratch() is None)
        return
    try:
        yield resume
    finally:
        lock.__exit__(None, None, None)


def settle_interrupted(directory: str | os.PathLike[str]) -> None:
    """Before ``directory`` is read (a model, a run): roll back a set a killed writer left half-installed there.

    A ``--force`` write killed between moving the old files out and the new ones in leaves a journal beside
    the directory (:mod:`mechkit.io.replace`); read then, the directory lacks its key file, and the reader
    said "config.json is missing", "no report", with a fix that could not help. Taking the directory's lock
    rolls the old set back whole, as the next writer would; a write still running is waited for instead. The
    folders above are asked too: a model saved at ``OUT/model`` is one of ``OUT``'s set, whose journal sits beside
    ``OUT``, and loading it had read a killed write's uncommitted model, which the next write then rolled back.
    """
    from mechkit.io.journal import journal_path

    real = real_place(directory)  # through a bind mount of the run's folder: the journal beside its own name
    given = Path(os.path.abspath(os.fspath(directory)))  # a folder moved and linked: the journal beside the link
    for place in dict.fromkeys((real, real.parent, real.parent.parent, given, given.parent, given.parent.parent)):
        try:  # OUT/model is in OUT's set, and OUT/FOLDER/NAME may be (a set's names go one folder deep)
            found = journal_path(place).exists()
        except OSError:  # a name too long to look up: no journal of mechkit's is there
            continue
        if found:
            _settle(directory, place)


def _settle(directory: str | os.PathLike[str], real: Path) -> None:
    from mechkit.io.journal import journal_path

    try:
        with out_lock(real):
            pass  # the lock cleans the killed writer's leftovers and rolls its journal back
    except OutInUseError:
        raise MechkitError(f"{directory} is being written by another mechkit run right now",
                           "wait for it to finish, then run this again") from None
    except MechkitError as err:
        if not isinstance(err.__cause__, OSError):  # not mechkit's journal, not a lock file: its own line says so
            raise
        if err.__cause__.errno == errno.EROFS:  # no owner can roll back there: "ask the owner" could not help
            raise MechkitError(f"{directory} holds a set of files a killed mechkit write left half-installed "
                               f"({journal_path(real)}), on a read-only file system, so it cannot be rolled back",
                               f"remount it writable, then read {directory} again (the roll-back runs first)") from None
        raise MechkitError(f"{directory} holds a set of files a killed mechkit write left half-installed "
                           f"({journal_path(real)}), which this user cannot roll back",
                           f"run any mechkit write to {directory} as its owner, or ask them to") from None
