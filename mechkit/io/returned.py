"""What a plugin may return as a ``Path`` for its report: a file or folder it prepared, moved in whole.

The writer renames a returned path into the report (copies it, then removes the source, across file systems)
and gives each file the umask's mode. Anything that is not the plugin's own plain tree is wrecked by that: a
FIFO hung the report's fsync, a hard link to the user's ``~/.ssh`` key was made world-readable, a bind mount of
the home directory was chmod'ed through, and the home directory reached through a bind alias of its parent was
moved into the report and deleted (a comparison of resolved paths does not see through a bind mount). So a
returned path is checked here, before the writer, by what the file system says: its kind, its links, its mount
points, and its identity (device and inode) against the places no report may take.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mechkit.io.replace import MANIFEST

WALK_LIMIT = 100_000  # entries a returned folder may hold: past it, it is refused, not checked in part


def path_kind(path: Path) -> str:
    """What ``path`` is, not following a link: "file", "directory", or the words for anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing (removed since it was prepared: by the plugin, or a cleaner of the temporary folder)"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return next((words for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                                           (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                                           (stat.S_ISBLK, "a block device")) if test(mode)), "no file")


def odd_entry(path: Path, limit: int | None = None) -> tuple[Path, str] | None:
    """``(path, words)`` for the first thing at or under ``path`` the writer may not move as the plugin's own:
    anything but a regular file or a directory, a file with another hard link (its other name is someone's),
    a mount point, of a folder or a file (a removal or chmod would go through it), a file or folder it cannot
    read (what it holds would be checked and copied in part; the copy failed naming the report's folder), or a folder past ``limit`` entries (default
    :data:`WALK_LIMIT`: what lies past the bound is unchecked); else None."""
    from mechkit.io.read import mount_points

    limit = WALK_LIMIT if limit is None else limit
    points = mount_points()
    real = os.path.realpath(path)
    top = _own(path, points, None, real)
    if top is not None or path_kind(path) != "directory":
        return top
    from mechkit.io.leftovers import made_here

    device, prepared = os.lstat(path).st_dev, made_here(path)
    count = 0
    unreadable: list[OSError] = []
    for root, dirs, files in os.walk(path, onerror=unreadable.append):  # links are not followed
        if unreadable:  # a folder it cannot list: checked (and copied) only in part
            err = unreadable[0]
            return Path(err.filename or root), f"a folder that cannot be read ({err.strerror})"
        real_root = os.path.join(real, os.path.relpath(root, path))  # no link below: each entry's real path
        for name in dirs + files:
            count += 1
            if count > limit:
                return path, f"a folder holding more than {limit} entries, too many to check"
            entry = Path(root) / name
            found = _own(entry, points, device, os.path.normpath(os.path.join(real_root, name))) \
                or _listed(entry, name, prepared)
            if found is not None:
                return found
    if unreadable:
        err = unreadable[0]
        return Path(err.filename or path), f"a folder that cannot be read ({err.strerror})"
    return None


def _listed(path: Path, name: str, prepared: bool) -> tuple[Path, str] | None:
    """A name inside a returned folder the report's list of that folder cannot hold as it is (a ``--force`` rerun
    then took the file for the user's and left it beside the next run's): one with a backslash or a lone
    surrogate, or the list's own name in a folder mechkit did not prepare (a user's file of that name was
    overwritten, or a copied list of another set trusted)."""
    if "\\" in name or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return path, "a name with a backslash or an undecodable byte, which the report's list of the folder cannot hold"
    if name == MANIFEST and not prepared:
        return path, f"a file named {MANIFEST}, the name of the list mechkit keeps of a folder's files"
    return None


def _own(path: Path, points: frozenset[str], device: int | None, real: str) -> tuple[Path, str] | None:
    kind = path_kind(path)
    if kind not in ("file", "directory"):
        return path, kind
    info = os.lstat(path)
    if real in points or (kind == "directory" and (
            (device is not None and info.st_dev != device) or os.path.ismount(path))):
        # a file bind-mounted over another is in the mount list; its device alone says nothing (overlayfs
        # with xino=off gives a file another device than its folder: every file was "a mount point")
        return path, "a mount point"
    if kind == "file" and info.st_nlink > 1:
        return path, f"a file with {info.st_nlink - 1} other hard link(s), another name of the same data"
    return _unreadable(path, kind)


def _unreadable(path: Path, kind: str) -> tuple[Path, str] | None:
    """``(path, words)`` where this process cannot read ``path`` (a file it cannot open, a folder it cannot
    list): its copy across file systems failed half-way, naming the report's temporary folder, not the file."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    if kind == "directory":
        flags |= getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        return path, f"a {'folder' if kind == 'directory' else 'file'} that cannot be read ({err.strerror})"
    os.close(fd)
    if kind == "directory" and not os.access(path, os.R_OK | os.X_OK):
        return path, "a folder that cannot be read (permission denied)"
    return None


def relation(path: Path, place: Path) -> str | None:
    """How ``path`` stands to ``place``: "is", "holds" or "is inside", else None. Compared by resolved path and
    by device and inode (a bind mount shows one folder under two paths), ``place`` by its nearest existing
    folder where it is not made yet (an ``--out`` to be created)."""
    real, where = Path(os.path.realpath(path)), Path(os.path.realpath(place))
    if real == where:
        return "is"
    if real in where.parents:
        return "holds"
    if where in real.parents:
        return "is inside"
    if not os.path.exists(real):
        return None
    mine, theirs, made = _identities(real), _identities(where), os.path.exists(where)
    if made and theirs and mine[0] == theirs[0]:
        return "is"
    if mine[0] in (theirs[1:] if made else theirs):
        return "holds"
    if made and theirs and theirs[0] in mine[1:]:
        return "is inside"
    return None


def _identities(path: Path) -> list[tuple[int, int]]:
    """``(device, inode)`` of ``path`` (where it exists) and of each existing folder above it, nearest first."""
    found = []
    for p in (path, *path.parents):
        try:
            info = os.stat(p)
        except OSError:
            continue
        found.append((info.st_dev, info.st_ino))
    return found


def protected(out: Path | None, inputs: tuple = ()) -> list[tuple[str, Path, bool]]:
    """``(words, place, whole)`` for each place a returned path must not take: ``--out``, mechkit's cache and the
    run's inputs (its ``--model`` folder: returned by a plugin, it was moved into the report and gone), where a
    path inside is refused too (``whole``); the temporary, working and home directories, where only a path that
    is or holds one is (a file of the plugin's own there is fine). One list for ``mk.run`` and the public
    :func:`mechkit.report.write_report`: the latter moved the working directory into a report."""
    import tempfile

    from mechkit.io.disk_cache import cache_root

    places = [("the report folder --out", out, True)] if out is not None else []
    places += [("mechkit's cache", cache_root(), True)]
    places += [(f"an input of the run ({p})", Path(os.path.expanduser(p)), True) for p in inputs
               if isinstance(p, (str, Path))]  # "~/md" is the home's md, as the loader reads it
    places += [("the temporary directory", Path(tempfile.gettempdir()), False),
               ("the working directory", Path(os.getcwd()), False),
               ("your home directory", Path(os.path.expanduser("~")), False)]
    return [(what, Path(os.path.realpath(place)), whole) for what, place, whole in places]


def place_problem(value: Path, places: list[tuple[str, Path, bool]]) -> str | None:
    """How ``value`` stands to the nearest place of :func:`protected` it may not take (``"is the working
    directory (/home/u)"``), else None."""
    found = [(how, what, place) for what, place, whole in places
             if (how := relation(value, place)) is not None and (whole or how != "is inside")]
    found.sort(key=lambda f: ("is", "holds", "is inside").index(f[0]))  # the nearest named first
    return f"{found[0][0]} {found[0][1]} ({found[0][2]})" if found else None


_CHECKED: dict[int, tuple] = {}


def mark_checked(files: dict) -> None:
    """Say that ``mk.run`` has checked the returned paths of ``files`` (:func:`odd_entry`, the protected places
    with the run's inputs), so that the writer it hands them to does not walk each folder again."""
    _CHECKED[id(files)] = (files, tuple(files.items()))


def was_checked(files: object) -> bool:
    """Whether ``files`` is the very mapping :func:`mark_checked` marked, unchanged since; the mark is used once
    (a direct ``write_report`` call, or a dict changed since, is checked in full)."""
    found = _CHECKED.pop(id(files), None)
    return found is not None and found[0] is files and isinstance(files, dict) and tuple(files.items()) == found[1]
