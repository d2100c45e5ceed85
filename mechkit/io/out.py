"""The ``--out`` check every command runs before any work: right kind, not clobbering, writable."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Literal

from mechkit.errors import MechkitError
from mechkit.io.read import is_mount_point, live_place, mount_points


def check_out(path: str | os.PathLike[str], force: bool = False, kind: Literal["dir", "file"] = "dir",
              inputs: tuple[str | os.PathLike[str], ...] = ()) -> Path:
    """``path`` as a Path if a ``kind`` can be written there, else a one-line :class:`MechkitError`.

    Refused: a file where a directory is wanted and a directory where a file is wanted (also with
    ``force``), a non-empty directory or an existing file without ``force``, and a location whose
    nearest existing parent is not a writable directory (probed by making and removing a hidden
    directory there, so a read-only location fails before any work). An empty directory is fine.
    Refused too, as the real directory they name (symlinks and ``..`` resolved): the working directory,
    the home directory, the root and their ancestors (``--out .``), a place inside mechkit's own cache
    (:func:`mechkit.io.disk_cache.cache_root`), an ``--out`` that is or holds one of ``inputs``, and an
    existing file inside an input directory (``--force`` would replace the weights the run reads).

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> check_out(root / "new" / "run") == root / "new" / "run"
    True
    >>> _ = (root / "v.safetensors").write_bytes(b"x")
    >>> for kind in ("file", "dir"):
    ...     try:
    ...         check_out(root / "v.safetensors", kind=kind)
    ...     except MechkitError as err:
    ...         print(str(err).replace(str(root), "DIR"))
    DIR/v.safetensors already exists — pass --force to overwrite it or choose another --out
    DIR/v.safetensors is a file, not a directory — choose a directory name for --out
    """
    if kind not in ("dir", "file"):
        raise ValueError(f"kind must be 'dir' or 'file', not {kind!r}")
    from mechkit.io.patharg import path_text

    path = path_text(path) or path  # a PathLike giving bytes: Path() raised a raw TypeError on it
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        raise MechkitError(f"--out {str(path)!r} holds a control character (a newline, a tab…)",
                           "choose a path without them")
    from mechkit.io.fs_errors import check_name_lengths, refuse_missing_cwd

    refuse_missing_cwd()
    refuse_non_utf8(path)
    from mechkit.io.patharg import folder_fix, folder_tail, names_folder

    if kind == "file" and names_folder(os.fspath(path)):  # x/ or x/.: Path() drops it, and a file x was replaced
        raise MechkitError(f"--out {os.fspath(path)} ends with {folder_tail(os.fspath(path))}, which names a "
                           "directory, and this --out is a file", folder_fix(os.fspath(path), "--out ", "name.safetensors"))
    path = Path(path)

    check_name_lengths(path)
    refuse_unresolvable(path)
    refuse_protected(path, kind)
    try:
        if kind == "dir":
            if path.exists() and not path.is_dir():
                raise MechkitError(f"{path} is a file, not a directory", "choose a directory name for --out")
            if path.is_dir() and not force and any(path.iterdir()):
                refuse_protected(path, kind, inputs)  # an input: --force would be refused too, so say that
                raise MechkitError(f"{path} already exists and is not an empty directory",
                                   "pass --force to replace it or choose another --out")
        else:
            if path.is_dir():
                raise MechkitError(f"{path} is a directory, not a file", "pass a file name for --out")
            from mechkit.io.atomic import refuse_special_file

            refuse_special_file(path)  # a device or a pipe is never replaced, whatever --force says
            if path.exists() and not force:
                refuse_protected(path, kind, inputs)
                raise MechkitError(f"{path} already exists", "pass --force to overwrite it or choose another --out")
    except OSError as err:  # e.g. a directory that cannot be listed
        raise MechkitError(f"cannot inspect {path}: {err.strerror or type(err).__name__}",
                           "choose another --out") from err
    refuse_protected(path, kind, inputs)  # after the kind checks: "a file, not a directory" says more
    refuse_mount_point(path)
    refuse_dot_dot_past_missing(path, kind)
    if kind == "dir" and force:
        refuse_mounted_inside(path)
    _probe_writable(path)
    from mechkit.io.locks import refuse_in_use

    refuse_in_use(path)  # known now, not after the work: the lock of a file writer is taken when it saves
    return path


def refuse_non_utf8(path: str | os.PathLike[str]) -> None:
    """One line where ``path`` (or the directory it is relative to) holds bytes that are not UTF-8: mechkit
    wrote a task vector or a model there, then safetensors and the tokenizer could not open the path (a
    traceback after the work, and a vector that ``taskvec info`` could never read back)."""
    for text, where in ((os.fspath(path), f"--out {os.fsdecode(path)!a}"),
                        (os.path.abspath(path), "the working directory of --out")):
        try:
            os.fsdecode(text).encode("utf-8")
        except UnicodeEncodeError:
            raise MechkitError(f"{where} holds bytes that are not UTF-8, and the files mechkit writes there "
                               "(safetensors, tokenizers) cannot be opened by such a path",
                               "choose an --out whose whole path is UTF-8") from None


def refuse_unresolvable(path: Path) -> None:
    """One line where ``path`` cannot be looked up because of a symlink loop (``ln -s loop loop``): every
    check then sees "no such directory", and the run failed only at its last rename, saying "pass --force",
    which fails the same way."""
    import errno

    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise MechkitError(f"--out {path} is a symlink loop (a link that leads back to itself)",
                               "remove the link or choose another --out") from None


def refuse_dot_dot_past_missing(path: Path, kind: Literal["dir", "file"] = "dir", flag: str = "--out") -> None:
    """One line where ``path`` goes back (``..``) out of a name that is no folder (``U/nosuch/../data``): the
    system stops at ``nosuch``, so every check of what is there found nothing, and the write, which resolves the
    path as text, replaced ``U/data``'s report or the user's own files without ``--force``. Asked after the
    checks that resolve the path (an input, the working directory, a mount point), which say more."""
    parts = Path(path).parts
    for i, part in enumerate(parts[1:], 1):
        if part == ".." and not os.path.isdir(Path(*parts[:i])):
            meant = Path(os.path.realpath(path))  # links resolved as the system does, the rest as text
            if kind == "file" and meant.is_dir():
                meant = meant / "name.safetensors"
            raise MechkitError(f"{flag} {path} goes back (..) out of {Path(*parts[:i])}, which is no folder, so the "
                               "system cannot follow it and mechkit cannot check what is there",
                               f"choose another {flag}, without the .. ({meant}, where it leads, is a file)"
                               if kind == "dir" and os.path.lexists(meant) and not meant.is_dir() else
                               f"name the place without the .. ({flag} {meant})" if kind == "dir" else
                               f"name the file without the .. (e.g. {flag} {meant})")


def refuse_mount_point(path: Path) -> None:
    """One line where ``path`` is a mount point (a disk, a tmpfs, a bind mount): a run goes into place by
    renaming a directory built beside it, which the kernel refuses for a mount point (EBUSY) or across file
    systems (EXDEV), so it failed only after all the work; and a bind mount is another path to a directory,
    whose lock (kept beside it) would not be the same lock. A file bind-mounted over the name
    (``mount --bind data vf.safetensors``) is refused the same way: a task vector is put in place by
    renaming a new file over it, and that too failed only after the work, naming a temporary path."""
    real = _real(path)
    if real == Path(real.anchor):
        return
    mounted = is_mount_point(real)  # as the system resolves the name now: a listed mount a later one hides is none
    if not (mounted if mounted is not None else os.path.ismount(real) or str(real) in mount_points()):
        return
    if real.is_dir():
        inside = path / "run"
        try:
            refuse_protected(inside)  # a mount of a folder in the cache or an input: inside it is no place either
            fix = f"choose a directory inside it, e.g. --out {shlex.quote(str(inside))}"
        except MechkitError:
            fix = "choose another --out, outside this mount"
        raise MechkitError(f"--out {path} is a mount point ({real}); a run is put in place by renaming a "
                           "directory, which a mount point cannot be", fix)
    if os.path.lexists(real):
        raise MechkitError(f"--out {path} is a file mounted over that name ({real}); mechkit writes a file by "
                           "renaming a new one over the name, which a mount point cannot be",
                           "choose another file name for --out, or unmount it first")


def refuse_mounted_inside(path: Path) -> None:
    """One line where a file or folder ``--force`` would replace inside the directory ``path`` (the last run's
    files, its report) is a mount point, or holds one anywhere below it: the new set goes in by renames, which
    the kernel refuses at a mount point, so the run failed only after all its work, telling the user to choose
    "another file name for --out"; and a file bind-mounted inside an owned folder (``pr/model/config.json``)
    was moved aside with the folder into a hidden temporary folder that stayed behind."""
    from mechkit.io.replace import MANIFEST, owned_names

    points = mount_points()
    if not points or not path.is_dir():
        return
    for name in dict.fromkeys([*owned_names(path), "report.json", "report.html", MANIFEST]):
        target = _real(path / name)
        below = sorted(p for p in points if Path(p).is_relative_to(target) and p != str(target)) \
            if not (path / name).is_symlink() else []  # a mount inside an owned folder: moved aside with it
        if below:
            raise MechkitError(f"--out {path} holds {name}, which --force would replace, and {below[0]} inside it is "
                               "a mount point, which a rename cannot move away safely",
                               f"unmount {shlex.quote(below[0])} first, or choose another --out")
        if str(target) in points:
            raise MechkitError(f"--out {path} holds {name}, which --force would replace, and it is a mount point "
                               f"({target}), which a rename cannot replace", f"unmount {shlex.quote(str(target))} "
                               "first, or choose another --out")


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def _within(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or inside it, by name (``realpath``) or by identity: a bind mount
    (``mount --bind a b``) is a second name for a directory that no symlink resolution reveals, so
    ``b/x`` inside ``a`` was missed and ``--out`` reached the cache, the working directory or an input
    under the other name. Identity is ``(st_dev, st_ino)``, which a bind mount shares with its source:
    ``root``'s identity among those of ``path`` and its existing ancestors (one ``stat`` each); and where a
    bind mount shows a folder inside ``root`` (``mount --bind cache/runs rb``), both paths' places on their
    device (:func:`mount_place`)."""
    if path == root or root in path.parents:
        return True
    root_id = _identity(root)
    if root_id is not None and any(_identity(p) == root_id for p in (path, *path.parents)):
        return True
    here, there = live_place(path), live_place(root)  # a bind mount of a folder *inside* root: not root's identity
    return here is not None and there is not None and here[0] == there[0] and (
        here[1] == there[1] or there[1] in here[1].parents)


def _identity(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the directory ``path``; ``None`` where it is missing, unreadable or a file (a
    hard link to a file is no second name of a place: replacing one name leaves the other's content)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    import stat

    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _same(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one place: the same real path, or the same existing directory (a bind mount)."""
    return a == b or (_identity(a) is not None and _identity(a) == _identity(b))


def refuse_protected(path: str | os.PathLike[str], kind: str = "dir",
                     inputs: tuple[str | os.PathLike[str], ...] = ()) -> None:
    """One line where ``--out`` names, under any spelling, a directory mechkit must never write into as a
    whole (see :func:`check_out`); before any work, whatever ``--force`` says.

    >>> import os
    >>> try:
    ...     refuse_protected(os.getcwd() + "/sub/..")
    ... except MechkitError as err:
    ...     print(str(err).split(" — ")[1])
    choose a new directory for --out, e.g. --out ./run
    """
    from mechkit.io.disk_cache import cache_root

    if str(path).startswith("~"):
        raise MechkitError(f"--out {path} starts with ~, which no shell expanded (it would be a folder named ~)",
                           f"write the full path, e.g. {os.path.join(os.path.expanduser('~'), 'runs', 'name')}")
    real = _real(path)
    if kind == "dir":
        for name, place in (("the working directory", Path.cwd()), ("your home directory", Path.home())):
            place = _real(place)
            if _within(place, real):
                what = name if _same(real, place) else f"a parent of {name}"
                raise MechkitError(f"--out {path} is {what} ({real}); mechkit will not write a run over it",
                                   "choose a new directory for --out, e.g. --out ./run")
    cache = _real(cache_root())
    if _within(real, cache):
        raise MechkitError(f"--out {path} is inside mechkit's cache ({cache}), which `mechkit cache clear` deletes",
                           "choose an --out outside the cache")
    if kind == "dir" and _within(cache, real):
        raise MechkitError(f"--out {path} holds mechkit's cache ({cache}); mechkit will not write a run over it",
                           "choose an --out beside the cache, not above it")
    for item in inputs:
        source = _real(item)
        if _within(source, real):
            raise MechkitError(f"--out {path} {'is' if _same(source, real) else 'holds'} the input {item}, "
                               "which the run reads", "choose another --out")
        if kind == "file" and source.is_dir() and _within(real, source) and os.path.lexists(real):
            raise MechkitError(f"--out {path} is a file inside the input {item}, which the run reads (its "
                               "weights, config or tokenizer)", "choose another --out, outside that directory")


def _probe_writable(path: Path) -> None:
    """Make and remove a hidden directory in the nearest existing parent of ``path`` (where the
    missing parents or the temporary copy will be created): the one test that sees read-only
    mounts, ACLs and full disks alike."""
    parent = path.absolute().parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise MechkitError(f"{parent} is not a directory, so {path} cannot be created", "choose another --out")
    probe = parent / f".mechkit-probe-{os.urandom(4).hex()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise MechkitError(f"cannot write in {parent}: {err.strerror or type(err).__name__}",
                           "choose an --out in a writable directory") from err


def refuse_tmpdir_inside(out: str | os.PathLike[str], label: str = "--out") -> None:
    """One line where the temporary directory (``$TMPDIR``) is ``out`` or inside it, or inside mechkit's cache,
    for a run that saves files there before its report moves them in (``prune --save-model``): the saved model
    would lie inside the report it is moved into, or in the cache that ``cache clear`` deletes, and the run was
    refused only after all its work, blaming the plugin. Checked before the model loads."""
    import tempfile

    from mechkit.io.disk_cache import cache_root

    tmp = _real(tempfile.gettempdir())
    for what, place in ((f"{label} {out}", _real(out)), ("mechkit's cache", _real(cache_root()))):
        if _within(tmp, place):
            raise MechkitError(f"the temporary directory TMPDIR ({tmp}) is inside {what} ({place}), where this run "
                               "prepares what it saves before moving it into the report",
                               "point TMPDIR at a folder outside --out and mechkit's cache, e.g. TMPDIR=/tmp")
