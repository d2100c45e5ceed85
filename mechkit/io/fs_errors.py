"""The file system says no: one line naming the path and the fix, for the errors the environment causes.

A full disk, a quota, a read-only mount, a permission, a name too long: none is a bug, and a traceback
would hide the one thing the user must change. :func:`describe` turns such an :class:`OSError` into a
:class:`~mechkit.errors.MechkitError`; the CLI does it for any that reaches it (the writers have removed
their temporary files by then: :mod:`mechkit.io.atomic`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mechkit.errors import MechkitError

NAME_MAX = 255  # bytes per path component on ext4, xfs, btrfs, tmpfs, apfs, ntfs
SUFFIX_ROOM = 40  # what mechkit adds to a name for its temporary copies and lock: .NAME.tmp-PID-TOKEN

_WHY = {
    errno.ENOSPC: ("no space left on the device", "free some space there, or choose another --out"),
    errno.EDQUOT: ("disk quota exceeded", "free some space in your quota, or choose another --out"),
    errno.EROFS: ("the file system is read-only", "choose an --out on a writable file system"),
    errno.EACCES: ("permission denied", "choose a place you can write, or change its permissions"),
    errno.EPERM: ("operation not permitted", "choose a place you can write, or change its permissions"),
    errno.ENAMETOOLONG: ("a name is too long for the file system", "choose a shorter --out"),
    errno.EMLINK: ("too many links", "choose another --out"),
    errno.EFBIG: ("a file is larger than the file system or your file-size limit allows",
                  "choose an --out on a file system that allows larger files"),
    errno.ELOOP: ("a symlink loop (a link that leads back to itself)", "remove the link or choose another --out"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "choose another --out"),
    # A rename across a mount point (a bind mount the checks before the work did not see): a last resort.
    errno.EXDEV: ("a rename would cross a mount point (a bind mount or another file system)",
                  "choose a directory inside the mount, e.g. --out MOUNT/run, or another --out"),
    errno.EBUSY: ("the path is in use as a mount point", "choose a directory inside the mount, e.g. --out MOUNT/run, "
                  "or another --out"),
}
PATH_MAX = 4096  # bytes in a whole path on Linux
INNER_ROOM = 64  # what a run writes inside --out: model/model.safetensors, .previous/…


READ_FIXES = {errno.EACCES: "make it readable (chmod) or pass another path",
              errno.EPERM: "make it readable (chmod) or pass another path",
              errno.ELOOP: "remove the link loop or pass another path"}  # else: "check the path"


def describe(err: OSError, reading: bool = False) -> MechkitError | None:
    """The one-line error for an environment :class:`OSError` (``None`` for other kinds: a bug, re-raised);
    ``reading``: met reading a path the user named (a report, a vector), whose fix is never "choose an --out"."""
    why = _WHY.get(err.errno or 0)
    if why is None:
        return None
    if reading:
        where = err.filename if err.filename is not None else "a file mechkit was reading"
        return MechkitError(f"cannot read {where}: {why[0]}", READ_FIXES.get(err.errno or 0, "check the path"))
    where = err.filename if err.filename is not None else "a file mechkit was writing"
    fix = why[1]
    if err.errno == errno.EFBIG:
        fix = _file_size_limit_fix() or fix
    if err.errno in (errno.EBUSY, errno.EXDEV) and err.filename is not None and _is_file(err.filename):
        fix = "choose another file name for --out, or unmount it first"  # a file mount point: no "inside" it
    from mechkit.io.disk_cache import cache_root

    try:
        if err.filename is not None:
            cache, failed = Path(os.path.realpath(cache_root())), Path(os.path.realpath(os.fsdecode(err.filename)))
            if failed == cache or cache in failed.parents:  # the cache, not --out: the fix is $MECHKIT_CACHE
                import re

                fix = re.sub(r"choose (another --out|an --out[^,]*)", "point $MECHKIT_CACHE elsewhere", fix)
                fix = fix.replace("a shorter --out", "a shorter $MECHKIT_CACHE")
        if err.filename is not None and err.errno in (errno.ENOSPC, errno.EDQUOT) and _in_scratch(err.filename):
            tmpdir = os.path.realpath(tempfile.gettempdir())  # where mechkit built a model before moving it
            fix = f"free some space in the temporary directory ({tmpdir}), or set TMPDIR to a directory on a larger disk"
    except (OSError, ValueError, TypeError):
        pass
    return MechkitError(f"cannot write {where}: {why[0]}", fix)


SCRATCH_PREFIXES = ("mechkit-pruned-",)  # folders mechkit makes in $TMPDIR (PruneStudy.save), then moves into --out


def _in_scratch(name: str | bytes | int) -> bool:
    """``name`` lies in a folder mechkit made in ``$TMPDIR``: a full disk there is ``TMPDIR``'s to fix, and
    "choose another --out" could not help (another --out is built in the same ``$TMPDIR``)."""
    tmpdir = Path(os.path.realpath(tempfile.gettempdir()))
    failed = Path(os.path.realpath(os.fsdecode(name)))
    return any(p.parent == tmpdir and p.name.startswith(SCRATCH_PREFIXES) for p in (failed, *failed.parents))


def _is_file(name: str | bytes | int) -> bool:
    """``name`` is an existing non-directory (the directory fixes, "MOUNT/run", do not fit it)."""
    try:
        return os.path.lexists(name) and not os.path.isdir(name)
    except (TypeError, ValueError):
        return False


def one_line(err: BaseException, reading: bool = False) -> MechkitError | None:
    """:func:`describe` of the environment error underneath ``err`` (an OSError, or safetensors' wrapper of
    one), chained from it; ``None`` for a bug. The CLI prints it, and the Python API raises it
    (:func:`mechkit.runner.run_plugin`, :func:`mechkit.io.locked_write.write_locked`), so a full disk is the
    same line in both instead of a traceback in Python."""
    if isinstance(err, MechkitError):
        return None
    found = os_error_of(err) if isinstance(err, Exception) else None
    line = describe(found, reading) if found is not None else None
    if line is not None:
        if found is not err:
            found.__cause__ = err
        line.__cause__ = found
    return line


@contextlib.contextmanager
def one_line_errors(reading: bool = False) -> Iterator[None]:
    """Raise :func:`one_line` of an environment error inside (chained from the OSError); others pass."""
    try:
        yield
    except Exception as err:
        line = one_line(err, reading)
        if line is None:
            raise
        raise line from line.__cause__


def _file_size_limit_fix() -> str | None:
    """Where the process has a file-size limit (``ulimit -f``), it, not the file system, is what a larger
    file meets: the only fix is raising it (another --out or TMPDIR meets the same limit)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - Windows
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return f"raise your file-size limit (ulimit -f unlimited; it is {soft} bytes now)"


def refuse_over_file_size_limit(n_bytes: int, what: str) -> None:
    """Before the work whose result is a file of about ``n_bytes`` (a fine-tuned or pruned model's weights):
    one line where the process's file-size limit (``ulimit -f``) is smaller, not the same line after
    minutes of training, when the weights are written."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - Windows
        return
    if soft == resource.RLIM_INFINITY or n_bytes <= soft:
        return
    raise MechkitError(f"{what} would be at least {n_bytes} bytes, more than this process's file-size limit ({soft} bytes)",
                       "raise your file-size limit (ulimit -f unlimited) before the run")


def refuse_unencodable(path: str | os.PathLike[str], flag: str = "--out") -> None:
    """One line where ``path`` holds a character no file name can (a lone surrogate, ``"\\ud800"``, reachable from
    Python only): the first ``os.fsencode`` raised a raw UnicodeEncodeError."""
    try:
        os.fsencode(os.fspath(path))
    except UnicodeEncodeError:
        raise MechkitError(f"{flag} {ascii(os.fspath(path))[1:-1][:80]} holds a character no file name can hold",
                           f"choose another {flag}") from None


def check_name_lengths(path: str | os.PathLike[str], flag: str = "--out") -> None:
    """Refuse (one line) a path with a component too long for the file system once mechkit adds its
    temporary suffix, before any work rather than at the last rename; ``flag`` names the option."""
    refuse_unencodable(path, flag)
    refuse_missing_cwd()
    for part in Path(path).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX - SUFFIX_ROOM:
            raise MechkitError(f"the name {part[:40]}… in {flag} is {size} bytes long; the file system allows "
                               f"{NAME_MAX} and mechkit needs {SUFFIX_ROOM} more for its temporary copies",
                               f"choose a name of at most {NAME_MAX - SUFFIX_ROOM} bytes")
    whole = len(os.fsencode(os.path.abspath(path)))  # the writers use the absolute, resolved path
    if whole > PATH_MAX - SUFFIX_ROOM - INNER_ROOM:
        raise MechkitError(f"{flag} {str(path)[:40]}… is {whole} bytes long as a full path; Linux allows {PATH_MAX} "
                           f"and mechkit needs {SUFFIX_ROOM + INNER_ROOM} more for the files it writes there",
                           f"choose a path of at most {PATH_MAX - SUFFIX_ROOM - INNER_ROOM} bytes")


def os_error_of(err: BaseException, path: str | os.PathLike[str] | None = None) -> OSError | None:
    """``err`` as an :class:`OSError` naming ``path`` where it is one underneath: an OSError without a file
    name (a ``write`` on a full disk), or safetensors' ``SafetensorError`` wrapping one ("I/O error: No space
    left on device (os error 28)"), which is no OSError at all and reached users as a traceback."""
    import re

    if isinstance(err, OSError):
        if err.filename is None and path is not None and err.errno is not None:
            return OSError(err.errno, err.strerror or os.strerror(err.errno), os.fspath(path))
        return err
    if type(err).__name__ == "SafetensorError":
        found = re.search(r"\(os error (\d+)\)", str(err))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code), None if path is None else os.fspath(path))
    return None


def refuse_missing_cwd() -> None:
    """One line where the working directory was deleted under the shell (every path check would raise
    FileNotFoundError from ``getcwd``, a traceback, even for an absolute --out)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise MechkitError("the working directory no longer exists (it was deleted or moved after you entered it)",
                           "cd to an existing directory and run the command again") from None
