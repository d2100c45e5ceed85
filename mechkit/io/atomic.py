"""Atomic files and directories: a reader never sees a half-written one.

Everything is written under a unique temporary name in the target's own directory (same
filesystem, so a rename is atomic), flushed to disk, then renamed over the target in one step.
Unique names mean two writers never share a temporary file; whoever renames last wins, whole.
Files and directories get the umask's permissions (``tempfile`` would make them 0600 / 0700).

On Linux a directory goes into place with ``renameat2``: ``RENAME_NOREPLACE`` (a directory another
writer made meanwhile, even an empty one, is never taken over) and ``RENAME_EXCHANGE`` (the old
directory is swapped out in one step, so no crash leaves the target missing). Elsewhere two renames
are used; a crash between them leaves the old directory whole as ``.<name>.old-*`` beside the target.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.read import DIR_FLAGS, FILE_FLAGS, fd_mount_id, open_listed
from mechkit.io.remove import discard_tree

_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100


def _token() -> str:
    return os.urandom(4).hex()  # not secrets, which pulls in hashlib and hmac at import time


@functools.cache
def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc without it (old glibc, some musl)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` for a writer that wants a file name (e.g.
    ``safetensors.torch.save_file``); on success it is flushed and renamed over ``path``, on any
    error it is removed and ``path`` is left as it was.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "w.bin"
    >>> with atomic_file(p) as tmp:
    ...     _ = tmp.write_bytes(b"weights")
    >>> p.read_bytes(), sorted(q.name for q in p.parent.iterdir())
    (b'weights', ['w.bin'])
    """
    path = _file_target(path)
    from mechkit.io.leftovers import clean_leftovers

    clean_leftovers(path.parent, path.name)  # what a killed write of the same file left behind
    while True:  # the pid lets a later write tell a killed writer's leftover (mechkit.io.leftovers)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{_token()}")
        try:
            with open(tmp, "xb"):  # reserves the name; honours the umask, unlike tempfile.mkstemp (0600)
                break
        except FileExistsError:
            continue
    mode = tmp.stat().st_mode & 0o777  # the umask's, from our own creation of the name
    try:
        yield tmp
        _fsync(tmp)
        _umask_mode(tmp, mode)  # a writer that recreated the file (safetensors does: 0600) gets it back
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        _raise_naming(err, path)
        raise
    _fsync(path.parent, directory=True)


def _raise_naming(err: BaseException, path: Path) -> None:
    """Re-raise an environment error of a write to ``path`` as an OSError naming it (a full disk seen by
    ``write`` names no file; safetensors wraps it in its own exception), for the one-line message. An error
    naming mechkit's own temporary copy beside ``path`` (the last rename onto a mount point: EBUSY) names
    ``path`` instead: the user never typed the temporary name and cannot act on it."""
    from mechkit.io.fs_errors import os_error_of

    found = os_error_of(err, path) if isinstance(err, Exception) else None
    if found is not None and found.filename is not None and found.errno is not None:
        named = Path(os.fsdecode(found.filename))
        if named.parent == path.parent and named.name.startswith(f".{path.name}.") and named != path:
            found = OSError(found.errno, found.strerror or os.strerror(found.errno), os.fspath(path))
    if found is not None and found is not err:
        raise found from err


def _file_target(path: object) -> Path:
    """``path`` as a :class:`Path` a file can be renamed onto, else one line naming it and the fix: a save
    given a directory, a folder that does not exist or a non-path would otherwise raise a bare OSError
    or TypeError (and a rename onto a directory fails only after the whole file is written)."""
    target = file_path(path)
    if target.is_dir():
        raise MechkitError(f"{target} is a directory, not a file name", f"name a file inside it, e.g. {target / 'out'}")
    if not target.parent.is_dir():
        raise MechkitError(f"the folder {target.parent} does not exist", f"create it first (mkdir -p {target.parent})")
    refuse_special_file(target)
    return target


def file_path(path: object) -> Path:
    """``path`` as a text :class:`Path` naming a file, else one line: not a path, empty, or ending in ``/``.

    A PathLike whose ``__fspath__`` gives bytes is decoded as the system does (``Path`` raised a raw
    TypeError on it), and ``x/`` is refused: ``Path`` drops the slash, and the save wrote the file ``x``
    where the caller had named a folder.

    >>> file_path(b"runs/page.html").name
    'page.html'
    >>> try:
    ...     file_path("/tmp/")
    ... except MechkitError as err:
    ...     print(err)
    /tmp/ ends with /, which names a folder, not a file — name a file inside it, e.g. /tmp/page.html
    """
    from mechkit.io.patharg import expand_user, folder_fix, folder_tail, names_folder, path_text

    if isinstance(path, bytes | os.PathLike):
        path = path_text(path)
    if isinstance(path, str) and path.startswith("~"):  # as every reader expands it: a save to ~/x had gone to ./~/x
        path = os.fspath(expand_user(path)) + ("/" if path.endswith("/") else "")
    if not isinstance(path, str) or not path:
        raise MechkitError(f"cannot write a file to {path!r}", "pass a file path (a str or pathlib.Path) in a folder that exists")
    if names_folder(path):  # x/ or x/.: Path() drops it, and the save replaced a file x (the user's notes)
        raise MechkitError(f"{path} ends with {folder_tail(path)}, which names a folder, not a file", folder_fix(path))
    return Path(path)


def refuse_special_file(target: Path) -> None:
    """One line where ``target`` is a device, a pipe or a socket: the rename that replaces a file would
    replace it (as root, ``--out /dev/full --force`` left a regular file where the device was)."""
    if os.path.lexists(target) and not target.is_symlink() and not target.is_file() and not target.is_dir():
        raise MechkitError(f"{target} is not a regular file (a device, a pipe or a socket), and writing would "
                           "replace it", "choose a file name for --out")


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically (text is UTF-8); return the path.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> write_atomic(p, '{"a": 1}').read_text()
    '{"a": 1}'
    """
    path = _file_target(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(payload)
    return path


def temp_dir_beside(target: str | os.PathLike[str]) -> Path:
    """A new, empty hidden directory next to ``target`` (same filesystem), for building ``target``.

    ``os.mkdir`` honours the umask: ``tempfile.mkdtemp`` would make it 0700, and a directory renamed
    into place would then be private. The caller removes it.

    >>> import tempfile, pathlib, shutil
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "model"
    >>> tmp = temp_dir_beside(target)
    >>> tmp.parent == target.parent, tmp.name.startswith(".model.tmp-"), list(tmp.iterdir())
    (True, True, [])
    >>> shutil.rmtree(tmp)
    """
    target = Path(target)
    while True:  # the pid lets a later run tell a killed writer's leftover (mechkit.io.leftovers)
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{_token()}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str], replace: bool = False) -> Iterator[Path]:
    """Build a directory in a hidden temporary directory beside ``target``; on success it is flushed
    and becomes ``target`` in one rename, on any error (Ctrl-C included) it is removed.

    An existing ``target`` is swapped out and deleted only when ``replace`` is true; otherwise
    :class:`~mechkit.errors.MechkitError` is raised before the build when it already exists, and at
    the rename when another writer created it meanwhile (one wins whole, the other is told).

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "model"
    >>> with atomic_dir(out) as tmp:
    ...     _ = (tmp / "config.json").write_text("{}")
    >>> sorted(p.name for p in out.iterdir())
    ['config.json']
    """
    target = Path(target)
    if not replace and _exists(target):
        raise MechkitError(f"{target} already exists", "pass --force to replace it or choose another --out")
    target.parent.mkdir(parents=True, exist_ok=True)
    from mechkit.io.leftovers import clean_leftovers

    clean_leftovers(target.parent, target.name)  # what a killed build of the same target left behind
    tmp = temp_dir_beside(target)
    try:
        yield tmp
        umask_modes(tmp, fsync=True)
        _rename_dir(tmp, target, replace)
    except BaseException as err:
        discard_tree(tmp)
        _raise_naming(err, target)
        raise
    _fsync(target.parent, directory=True)


def umask_modes(folder: str | os.PathLike[str], fsync: bool = False) -> None:
    """Give every file under ``folder`` the mode the umask gives a new file (safetensors writes 0600, so a
    saved model was private to its owner) and every folder below it a new folder's, flushing each to disk when
    ``fsync``; links, hard-linked files and anything behind a mount point are left alone.

    The walk holds a descriptor of each folder and opens what is in it relative to that descriptor, never
    following a link: a folder of the tree swapped for a link to a user's folder while it ran (a thread still
    running, a sync tool) had the user's key chmod'ed through it, since a name's last part alone was checked."""
    top = os.open(folder, DIR_FLAGS)
    try:
        _modes_below(top, os.fstat(top), fd_mount_id(top), (file_mode(), dir_mode()), fsync)
    finally:
        os.close(top)


def _modes_below(fd: int, info: os.stat_result, mount: int | None, modes: tuple[int, int], fsync: bool) -> None:
    """:func:`umask_modes` of the folder open as ``fd``: its entries by name relative to it, each opened without
    following a link and taken only where it is still the entry listed (its inode) on the same mount."""
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        is_dir = stat.S_ISDIR(seen.st_mode)
        if not (is_dir or stat.S_ISREG(seen.st_mode)) or (is_dir and seen.st_dev != info.st_dev):
            continue  # a link, a FIFO, a device; a folder of another disk
        child = open_listed(fd, name, seen, mount, DIR_FLAGS if is_dir else FILE_FLAGS)
        if child is None:  # swapped for a link, gone, or behind a mount point since it was listed
            continue
        try:
            now = os.fstat(child)
            if is_dir:  # mkdtemp's 0700 kept a plugin's prepared folder private to its owner
                _fchmod(child, now, modes[1])
                _modes_below(child, now, mount, modes, fsync)
            else:
                if now.st_nlink == 1:  # a hard link's other name is someone's (a user's file the report links to)
                    _fchmod(child, now, modes[0])
                if fsync:
                    os.fsync(child)
        finally:
            os.close(child)
    if fsync:
        with contextlib.suppress(OSError):
            os.fsync(fd)


def _fchmod(fd: int, info: os.stat_result, mode: int) -> None:
    if info.st_mode & 0o777 != mode:
        os.fchmod(fd, mode)


def file_mode() -> int:
    """The mode a new file gets under the umask (read without a race: from /proc where it is shown)."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The mode a new directory gets under the umask: what a folder built by ``tempfile.mkdtemp`` (0700) is
    given before it becomes a user's (``prune --save-model``'s ``model/`` was private to its owner)."""
    return 0o777 & ~_umask()


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _umask_mode(path: Path, mode: int) -> None:
    """Give ``path`` ``mode`` through a descriptor opened without following a link: a file swapped for a link to
    a user's key between the caller's check and here had the key chmod'ed (a thread still running, a sync tool)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link now: not the report's file, left as it is
            return
        raise
    try:
        info = os.fstat(fd)
        regular, folder = stat.S_ISREG(info.st_mode), stat.S_ISDIR(info.st_mode)
        if (folder or (regular and info.st_nlink == 1)) and info.st_mode & 0o777 != mode:
            os.fchmod(fd, mode)  # a second name of someone's file (a hard link made meanwhile) keeps its mode
    finally:
        os.close(fd)


def _rename_dir(tmp: Path, target: Path, replace: bool) -> None:
    if replace and _exists(target):
        _swap_in(tmp, target)
        return
    try:
        if not _renameat2(tmp, target, _RENAME_NOREPLACE):
            if _exists(target):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
            os.replace(tmp, target)  # onto a non-empty directory another writer just made: fails, never merged
    except OSError as err:
        if not _exists(target):
            raise
        if replace:
            _swap_in(tmp, target)
            return
        raise MechkitError(f"{target} was created by another writer meanwhile",
                           "choose another --out, or pass --force to replace it") from err


def _swap_in(tmp: Path, target: Path) -> None:
    """Put ``tmp`` at ``target`` and delete what was there."""
    if _renameat2(tmp, target, _RENAME_EXCHANGE):
        old = tmp  # the exchange left the previous target at the temporary name
    else:
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{_token()}")  # a pid: never a user's name
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
    if old.is_dir() and not old.is_symlink():
        discard_tree(old)
    else:
        old.unlink(missing_ok=True)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Rename with Linux ``renameat2`` flags; False where the libc, kernel or filesystem lacks them."""
    fn = _load_renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush a file's data (or a directory's entries) to disk, so a power cut after the rename
    cannot leave an empty file under the final name. Directories cannot be opened everywhere."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO never blocks
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return
        raise
    try:
        if not directory and not stat.S_ISREG(os.fstat(fd).st_mode):
            return  # no data of a file to flush (a FIFO, a device): nothing the report holds
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)
