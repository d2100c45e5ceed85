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

import contextlib
import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a symlink, FIFO, device or socket) of at most
    ``limit`` bytes; else ``None``. Never blocks and never follows a link."""
    try:
        return read_plain(path, limit)
    except (OSError, ValueError):  # ValueError: a name no file can have (a NUL, a lone surrogate from JSON)
        return None


def read_plain(path: str | os.PathLike[str], limit: int) -> bytes:
    """:func:`read_regular`, raising where it returns ``None``: an :class:`OSError` whose ``strerror`` says why
    (the open's own error, "not a regular file (a FIFO)", "larger than N bytes"), for a caller that names the
    problem in its one line (a damaged resume step)."""
    fd = os.open(Path(path), _FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_KINDS.get(stat.S_IFMT(info.st_mode), 'special')})",
                          os.fspath(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while read
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What sits at ``path`` where it is there and is no regular file (``"a directory"``, ``"a FIFO"``, ``"a
    symlink"`` …), from ``lstat`` alone (nothing is opened, so a FIFO never blocks); ``None`` for a regular file
    or nothing. A writer checks it before it replaces or deletes a name of its own: what is not a plain file
    there is never mechkit's, and never deleted.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> not_regular(d), not_regular(d / "missing")
    ('a directory', None)
    """
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "a special file")


MOUNTINFO = "/proc/self/mountinfo"  # the kernel's list of this process's mounts (Linux)


def mount_points() -> frozenset[str]:
    """Every mount point the kernel lists for this process (``/proc/self/mountinfo``'s 5th field, octal escapes
    undone); empty where the file is absent (not Linux). ``os.path.ismount`` compares a directory with its parent,
    so it misses a bind mount of a directory of the same disk (``mount --bind userdir runs/K/finetune``): a cache
    clear through it deleted the user's files, and such an ``--out`` took a lock of its own beside the real one.
    A mount a later one covers is still listed, but it is no mount point of any name (its name reaches the cover):
    where the system says which mount a name reaches (:func:`mount_id`), it is left out. Its "unmount it first"
    was a fix ``umount`` answered with "not mounted"."""
    rows = _mount_rows()
    order = {mid: n for n, (mid, *_) in enumerate(rows)}
    points = {mid: Path(p) for mid, _, _, p, _ in rows}
    live: set[str] = set()
    for point in {p for _, _, _, p, _ in rows}:
        here = [order[mid] for mid, _, _, p, _ in rows if p == point]
        at = Path(point)
        if not any(order[mid] > max(here) and Path(p) in at.parents for mid, _, _, p, _ in rows):
            live.add(point)  # no later mount over a folder above it: nothing to open (a hung NFS mount, say)
            continue
        reached = mount_id(_existing(at))  # a name the cover does not hold: the folder above it
        cover = points.get(reached) if reached is not None else None
        hidden = cover is not None and order[reached] > max(here) and Path(point) != cover and \
            cover in Path(point).parents  # a later mount over a folder above: the kernel lists this one still
        if not hidden:
            live.add(point)
    return frozenset(live)


def mounts() -> list[tuple[str, str, str]]:
    """``(device, root, mount point)`` of each mount in ``/proc/self/mountinfo``, in its order (a later mount
    at one point hides an earlier one): ``root`` is the directory of the device's file system that the mount
    shows (``/`` for a whole file system, the source directory of a bind mount). Read here, below every module
    of :mod:`mechkit.io`, for ``--out``'s checks and the removers of the cache and of leftovers alike. A mount
    hidden under a later one is still listed: where that matters, :func:`live_place` asks which one is live."""
    return [(device, root, point) for _, device, root, point, _ in _mount_rows()]


def _mount_rows() -> list[tuple[int, str, str, str, bool]]:
    """``(mount id, device, root, mount point, read-only)`` of each mount the kernel lists, in its order."""
    import re

    data = read_regular(MOUNTINFO, 64 * 2**20)
    if data is None:
        return []
    octal = re.compile(r"\\([0-7]{3})")  # a space in a path is written \040

    def plain(text: str) -> str:
        return octal.sub(lambda m: chr(int(m.group(1), 8)), text)

    fields = [line.split(" ") for line in data.decode("utf-8", "surrogateescape").splitlines()]
    return [(int(f[0]), f[2], plain(f[3]), plain(f[4]), len(f) > 5 and "ro" in f[5].split(","))
            for f in fields if len(f) > 4 and f[0].isdigit()]


DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0))  # a folder, never through a link; a FIFO never blocks the open
FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def open_listed(fd: int, name: str, seen: os.stat_result, mount: int | None, flags: int = DIR_FLAGS) -> int | None:
    """The entry ``name`` of the folder open as ``fd``, opened relative to it without following a link, where it
    is still the entry listed (``seen``: its device and inode) on the mount ``mount``; else ``None``. The one rule
    of the walks that change or remove what they find (modes, removals): a folder swapped for a link, or a mount
    reachable since the listing (a bind mount of the same disk too), is never entered."""
    try:
        child = os.open(name, flags, dir_fd=fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):  # a link now, or gone
            return None
        raise
    now = os.fstat(child)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or fd_mount_id(child) != mount:
        os.close(child)
        return None
    return child


def fd_mount_id(fd: int) -> int | None:
    """Which mount the open file ``fd`` is on (``/proc/self/fdinfo``'s ``mnt_id``, which tells a bind mount of
    the same disk apart from its folder); ``None`` where that is not shown (not Linux: a folder of another disk
    is still told by its device)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return None


def mount_id(path: str | os.PathLike[str]) -> int | None:
    """The id of the mount ``path`` is on as the system resolves it now (``/proc/self/fdinfo``'s ``mnt_id`` of a
    descriptor opened on it), else ``None`` (missing, or not Linux). A mount hidden under a later one is listed
    still; this is the one a name reaches. A link at ``path`` is on the mount that holds the link, not its
    target's: a link a cover held at a hidden mount's name made that mount look live ("unmount it first")."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_PATH", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        return fd_mount_id(fd)
    finally:
        os.close(fd)


def is_mount_point(path: Path) -> bool | None:
    """Whether the real path ``path`` is a mount point as the system resolves it now (its mount is not its
    parent's: a bind mount of a folder of the same disk too); ``None`` where that cannot be told (not Linux). A
    mount the kernel still lists under a later one covering it is no mount point of any name."""
    here, above = mount_id(path), mount_id(path.parent)
    return None if here is None or above is None else here != above


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if os.path.lexists(p)), Path(path.anchor))


def live_place(path: Path) -> tuple[str, Path] | None:
    """Where the real path ``path`` is on its device, through the mount its name reaches now (not one a later
    mount hides): ``(device, path within the device's file system)``; else by the mount list alone
    (:func:`mount_place`), ``None`` where no mount is known."""
    rows = _mount_rows()
    found = _existing(path)
    mid = mount_id(found)
    row = next((r for r in rows if r[0] == mid), None)
    if row is None:
        return mount_place(path, [(d, r, p) for _, d, r, p, _ in rows])
    _, device, root, point, _ = row
    try:
        inner = path.relative_to(point)
    except ValueError:  # a point this namespace names otherwise: the list by names alone
        return mount_place(path, [(d, r, p) for _, d, r, p, _ in rows])
    return device, Path(os.path.normpath(Path(root) / inner))


def mount_place(path: Path, mounts: list[tuple[str, str, str]]) -> tuple[str, Path] | None:
    """Where ``path`` (a real path) is on its device by the mount list alone: ``(device, path within the device's
    file system)``, through the deepest mount that holds it. Two names of one place (a bind mount of a directory,
    of its parent or of a folder inside it) give one place; ``None`` where no mount is known (not Linux)."""
    best = None
    for device, root, point in mounts:
        at = Path(point)
        if (path == at or at in path.parents) and (best is None or len(at.parts) >= len(best[2].parts)):
            best = (device, root, at)
    if best is None:
        return None
    device, root, at = best
    return device, Path(os.path.normpath(Path(root) / path.relative_to(at)))


def canonical_place(path: Path) -> Path:
    """One name for the real path ``path`` whatever bind mount reaches it: ``c/sub`` where ``c`` is
    ``mount --bind a/r c`` is ``a/r/sub``. Locks and journals are named by it, so two names of one directory share
    one lock (a run writing ``c/sub`` went on inside ``a/r`` that another run held).

    The name goes through the mount of that device showing the most of its file system (the shortest root), among
    those through which the place is reachable now: a mount hidden under a later one, still listed, is passed
    over (its name leads elsewhere; a lock was taken beside another folder), and so are a read-only mount where
    another is writable (a container's volume beside the whole disk mounted read-only: no lock could be made
    there) and a name too long for a lock beside it. Which name that is depends on the place alone, never on the
    name given. ``path`` itself where no other is known (not Linux).

    >>> canonical_place(Path("/")) == Path("/")
    True
    """
    place = live_place(path)
    if place is None:
        return path
    device, inner = place
    found = _existing(path)
    known = _identity(found)
    held = Path(os.path.normpath(Path(inner) / os.path.relpath(found, path))) if found != path else inner
    showing = [(n, root, point, read_only) for n, (_, dev, root, point, read_only) in enumerate(_mount_rows())
               if dev == device and (inner == Path(root) or Path(root) in inner.parents)]
    writable = [row for row in showing if not row[3]] or showing
    rows = sorted((len(Path(root).parts), n, root, point) for n, root, point, _ in writable)
    for _, _, root, point in rows:
        name = Path(os.path.normpath(Path(point) / inner.relative_to(root)))
        if len(os.fsencode(str(name))) > _LONGEST_NAME:  # a lock beside it could not be named (ENAMETOOLONG)
            continue
        if held == Path(root) or Path(root) in held.parents:
            there = Path(os.path.normpath(Path(point) / held.relative_to(root)))
            if known is not None and _identity(there) == known:  # reachable by this name now, not hidden
                return name
    return path


_LONGEST_NAME = 3800  # bytes of a place's name, leaving room below PATH_MAX (4096) for its lock's and journal's


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def read_regular_text(path: str | os.PathLike[str], limit: int = 32 * 2**20) -> str | None:
    """:func:`read_regular` decoded as UTF-8; ``None`` where it is not a plain file or not UTF-8."""
    data = read_regular(path, limit)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None
