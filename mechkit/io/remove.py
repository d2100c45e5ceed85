"""Deleting a folder of mechkit's on its own mount only: ``shutil.rmtree`` descends into a mount point, and a
bind mount of a user's folder inside a cache entry (reachable once a cover over it was unmounted between the
check and the removal) had the user's files deleted through it.
"""

from __future__ import annotations

import contextlib
import os
import stat

from mechkit.io.read import DIR_FLAGS, fd_mount_id, open_listed


def remove_tree(path: str | os.PathLike[str]) -> bool:
    """Delete the folder ``path`` and all it holds on its own mount, never through another; ``True`` where all of it
    went. A folder of another mount inside it (a bind mount of a user's folder, however it came to be reachable:
    a cover unmounted between a check and the removal) is left, with the folders above it, and ``False`` returned:
    ``shutil.rmtree`` deleted the user's files through one. ``path`` itself a mount point now (a bind mount of a
    user's folder at a leftover's name) is left whole. The walk holds each folder's descriptor and removes entries
    by name relative to it, so a folder swapped for a link meanwhile is never followed. A link or a file at
    ``path`` is removed itself."""
    path = os.path.abspath(path)
    return remove_beneath(os.path.dirname(path), os.path.basename(path))


def discard_tree(path: str | os.PathLike[str]) -> None:
    """:func:`remove_tree` where the removal is best effort: a temporary folder of mechkit's own on an error path, a
    set's old files after its commit, an offload folder as its model goes. Nothing is raised; what cannot go
    stays, and nothing is ever deleted through a mount or a link (``shutil.rmtree`` went through a mount a user
    put inside such a folder)."""
    with contextlib.suppress(OSError, ValueError):
        remove_tree(path)


def remove_beneath(root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> bool:
    """Delete ``root/relative`` (a file, a link itself, or a folder as :func:`remove_tree` does), reaching it from
    ``root`` one folder at a time by descriptor, on ``root``'s own mount: ``True`` where it is gone. A folder on
    the way swapped for a link, or a mount found on the way (a cover unmounted since a check), leaves it, and
    ``False`` is returned: a run's end unlinked its checkpoints by full path, through a link put in place of its
    scratch folder or a mount a cover had hidden, and deleted the user's files there."""
    parts = [p for p in os.fspath(relative).split(os.sep) if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{relative!r} is not a path inside {root!r}")
    try:
        fd = os.open(root, DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))  # root is the caller's, links and all
    except FileNotFoundError:
        return True
    try:
        device, mount = os.fstat(fd).st_dev, fd_mount_id(fd)
        for part in parts[:-1]:
            try:
                step = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return True
            except OSError:  # a link (ELOOP) or a file (ENOTDIR) where a folder was: never followed
                return False
            os.close(fd)
            fd = step
            if os.fstat(fd).st_dev != device or fd_mount_id(fd) != mount:
                return False
        return _remove_entry(fd, parts[-1], device, mount)
    finally:
        os.close(fd)


def _remove_entry(fd: int, name: str, device: int, mount: int | None) -> bool:
    """Remove the entry ``name`` of the folder open as ``fd``: a file or link itself, a folder of the same mount
    with what it holds; whether it is gone."""
    try:
        seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(seen.st_mode):
        try:
            os.unlink(name, dir_fd=fd)  # a file bind-mounted over the name: EBUSY, and it stays
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True
    if seen.st_dev != device:
        return False
    child = open_listed(fd, name, seen, mount)
    if child is None:  # a link or a mount point now (a bind mount of the same disk too): never entered; or gone
        return _gone(fd, name)
    try:
        whole = _remove_below(child, device, mount)
    finally:
        os.close(child)
    if whole:
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return whole


def _gone(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return False


def _remove_below(fd: int, device: int, mount: int | None) -> bool:
    """:func:`remove_tree` of the entries of the folder open as ``fd``; whether all of them went."""
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    whole = True
    for name in names:
        whole = _remove_entry(fd, name, device, mount) and whole
    return whole


__all__ = ["remove_beneath", "remove_tree"]
