"""Deleting a folder of mechkit's on its own mount only: ``shutil.rmtree`` descends into a mount point, and a
bind mount of a user's folder inside a cache entry (reachable once a cover over it was unmounted between the
check and the removal) had the user's files deleted through it.
"""

from __future__ import annotations

import errno
import os
import stat

from mechkit.io.read import fd_mount_id

_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_NONBLOCK", 0))


def remove_tree(path: str | os.PathLike[str]) -> bool:
    """Delete the folder ``path`` and all it holds on its own mount, never through another; ``True`` where all of it
    went. A folder of another mount inside it (a bind mount of a user's folder, however it came to be reachable:
    a cover unmounted between a check and the removal) is left, with the folders above it, and ``False`` returned:
    ``shutil.rmtree`` deleted the user's files through one. The walk holds each folder's descriptor and removes
    entries by name relative to it, so a folder swapped for a link meanwhile is never followed. A link or a file
    at ``path`` is removed itself."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(path)  # a link or a file: itself, never what it points to
        return True
    try:
        whole = _remove_below(top, os.fstat(top).st_dev, fd_mount_id(top))
    finally:
        os.close(top)
    if whole:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return whole


def _remove_below(fd: int, device: int, mount: int | None) -> bool:
    """:func:`remove_tree` of the entries of the folder open as ``fd``; whether all of them went."""
    whole = True
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(seen.st_mode):
            try:
                os.unlink(name, dir_fd=fd)  # a file bind-mounted over the name: EBUSY, and it stays
            except FileNotFoundError:
                pass
            except OSError:
                whole = False
            continue
        if seen.st_dev != device:
            whole = False
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):  # swapped for a link, or gone
                whole = whole and err.errno == errno.ENOENT
                continue
            raise
        try:
            now = os.fstat(child)
            if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or fd_mount_id(child) != mount:
                whole = False  # behind a mount point (a bind mount of the same disk too): never entered
                continue
            whole = _remove_below(child, device, mount) and whole
        finally:
            os.close(child)
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:
            whole = False
    return whole


__all__ = ["remove_tree"]
