"""The journal of a set of files being installed into a directory, and the roll-back after a kill.

:mod:`mechkit.io.replace` writes the journal before it moves anything; :func:`recover` reads it and puts
the old set back. It lives apart so that the cleaning of leftovers (:mod:`mechkit.io.leftovers`), which
rolls back journals it finds, needs nothing from the writers.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from mechkit.errors import MechkitError
from mechkit.io.read import read_plain
from mechkit.io.remove import discard_tree, remove_beneath

JOURNAL_LIMIT = 2**20  # a journal lists a few dozen names: anything larger is no journal mechkit wrote
LINK = "\0"  # what ends a link's entry in a folder's walk (tree_files): no file name holds it
MANIFEST = ".mechkit-files"  # inside a directory mechkit wrote: the names it wrote there (JSON list)


def journal_path(out: str | os.PathLike[str]) -> Path:
    """The journal of a set being installed in ``out``: hidden, beside it.

    >>> journal_path("runs/a").as_posix()
    'runs/.a.mechkit-replace'
    """
    out = Path(out)
    return out.parent / f".{out.name}.mechkit-replace"


def plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def own_temp_name(name: object, target: str) -> bool:
    """Whether ``name`` is one :func:`mechkit.io.atomic.temp_dir_beside` gives a directory built for ``target``
    (``.TARGET.tmp-PID-TOKEN``): a journal naming anything else (a crafted or foreign file) would have
    the roll-back delete that folder, a sibling project, whole."""
    return isinstance(name, str) and plain_name(name) and re.fullmatch(
        re.escape(f".{target}.tmp-") + r"\d+-[0-9a-f]{8}", name) is not None


def set_name(name: object) -> bool:
    """A name a journal may list: a plain name in the directory, or ``FOLDER/NAME`` inside one of its folders (an
    owned folder holding a user's file gets its own files replaced one by one, the folder and that file kept).

    >>> set_name("model/config.json"), set_name("report.json"), set_name("../x"), set_name("a/b/c")
    (True, True, False, False)
    """
    return isinstance(name, str) and all(plain_name(part) for part in name.split("/")) and name.count("/") <= 1


def tree_files(folder: Path) -> list[str]:
    """Every entry below ``folder`` but its list, as a path relative to it with its kind: a folder's with a
    trailing ``/``, a link's (to anything) with a trailing NUL (:data:`LINK`, in no file name), links not followed. A user's empty folder or
    link to a folder there was in no list, and went with the folder it sat in; a user's link put where
    mechkit's folder was read as that folder, and went with the rerun. A returned folder holds no links
    (:func:`mechkit.io.returned.odd_entry` refuses them), so a link is always the user's."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for name in [*files, *dirs]:
            path = (rel / name).as_posix()
            kind = LINK if os.path.islink(os.path.join(root, name)) else "/" if name in dirs else ""
            found.append(path + kind)
    return sorted(f for f in found if f != MANIFEST)


def journal_text(tmp: Path, install: list[str], remove: list[str]) -> str:
    """The journal of a set about to be installed from ``tmp``: its temporary folder, the names it installs and
    removes, each entry's inode and what each folder it installs holds (:func:`tree_files`), so a roll-back
    deletes an entry it moved in only while it is that entry and, a folder, holds nothing else (:func:`recover`). A tree too large for a journal is left
    out, and that folder is then rolled back as an older journal's was."""
    trees = {n: tree_files(tmp / n) for n in install if (tmp / n).is_dir() and not (tmp / n).is_symlink()}
    ids = {n: _id(tmp / n) for n in install if os.path.lexists(tmp / n)}  # a rename keeps an entry's inode
    text = json.dumps({"tmp": tmp.name, "install": install, "remove": remove, "trees": trees, "ids": ids})
    if len(text.encode()) > JOURNAL_LIMIT // 2:
        text = json.dumps({"tmp": tmp.name, "install": install, "remove": remove})
    return text


class _Journal(NamedTuple):
    tmp: Path  # the temporary folder: the new set's files not yet moved in, the old ones in .previous
    install: list[str]  # the names it moves in
    names: list[str]  # every name it touches (those it moves in and those it removes)
    trees: dict[str, list[str]] | None  # what each folder it moves in holds; None: an older journal
    ids: dict[str, list[int]] | None  # each entry's identity as built (_id); None: an older journal


def _id(path: Path) -> list[int]:
    """An entry's kind, device, inode and (a file's or link's) modification time: what a rename keeps and a new
    entry at the name does not (a file made where one was just deleted often gets its inode number)."""
    info = os.lstat(path)
    return [stat.S_IFMT(info.st_mode), info.st_dev, info.st_ino, 0 if stat.S_ISDIR(info.st_mode) else info.st_mtime_ns]


def _ids(record: dict) -> dict[str, list[int]] | None:
    ids = record.get("ids")
    if ids is None:
        return None
    if not isinstance(ids, dict) or not all(isinstance(k, str) and isinstance(v, list) and len(v) == 4
                                            and all(type(x) is int for x in v) for k, v in ids.items()):
        raise ValueError("its record of the entries it installs is damaged")
    return ids


def _trees(record: dict) -> dict[str, list[str]] | None:
    trees = record.get("trees")
    if trees is None:
        return None
    if not isinstance(trees, dict) or not all(isinstance(k, str) and isinstance(v, list)
                                              and all(isinstance(f, str) for f in v) for k, v in trees.items()):
        raise ValueError("its record of the folders it installs is damaged")
    return trees


def journal_problem(out: str | os.PathLike[str]) -> MechkitError | None:
    """Why :func:`recover` cannot roll back ``out``'s journal (unreadable, or naming no temporary directory
    mechkit makes), or ``None`` where it can (or there is none): asked without acting, so a sweep of leftovers
    (``cache list``, ``cache clear``, the next save's cleaning) skips such a journal, saying so, instead of
    counting it as removable and then failing whole on it."""
    try:
        _read(Path(out))
    except MechkitError as err:
        return err
    return None


def _read(out: Path) -> _Journal | None:
    """What the journal of ``out`` records (:class:`_Journal`); ``None`` where
    there is no journal; one :class:`MechkitError` line where it cannot be used. It is read without following a
    link, without blocking and only as a regular file of at most :data:`JOURNAL_LIMIT` bytes (a FIFO under a
    journal's name hung ``cache list`` and every save for ever), and a deeply nested one is damaged, not a
    RecursionError traceback."""
    journal = journal_path(out)
    try:
        record = json.loads(read_plain(journal, JOURNAL_LIMIT).decode("utf-8"))
        tmp = out.parent / record["tmp"]
        install = [n for n in record["install"] if set_name(n)]
        names = install + [n for n in record["remove"] if set_name(n)]
        trees, ids = _trees(record), _ids(record)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else err
        raise MechkitError(f"cannot read the interrupted write's journal {journal}: {why}",
                           f"move aside the newest files in {out} by hand, then delete {journal}"
                           if out.exists() else f"delete {journal} ({out} is gone: nothing is left to roll back "
                           "into)") from None
    if not own_temp_name(record["tmp"], out.name):
        raise MechkitError(f"the journal {journal} names {str(record['tmp'])[:60]!r}, which is not a temporary "
                           f"directory mechkit makes for {out.name}: it is no journal of a mechkit write, and "
                           "mechkit rolls nothing back from it", f"delete {journal} (nothing was moved)")
    return _Journal(tmp, install, names, trees, ids)


def recover(out: str | os.PathLike[str]) -> bool:
    """Roll back a set a killed writer left half-installed in ``out``; True when there was one.

    Call it holding ``out``'s lock. A journal whose temporary directory is gone (the write committed, or
    was already rolled back) is just removed. One that cannot be read is one :class:`MechkitError` line
    (:func:`journal_problem` asks the same without acting).
    """
    out = Path(out)
    read = _read(out)
    if read is None:
        return False
    tmp, install, names, trees, ids = read
    if tmp.is_dir() and not tmp.is_symlink():
        backup = tmp / ".previous"
        moved = [n for n in install if not os.path.lexists(tmp / n) and os.path.lexists(out / n)]
        _refuse_changed(out, moved, trees, ids)  # before anything moves: the user's files are never the roll-back's
        _refuse_in_the_way(out, backup, names, moved)
        for name in moved:  # moved in already: ours, from the killed write
            if not remove_beneath(out, name):  # never through a mount or a link put there since
                raise MechkitError(f"cannot roll back the write killed in {out}: {out / name}, which it had moved "
                                   "in, holds a mount point or a file the system refused to delete",
                                   f"unmount it or make it deletable, then rerun (its old files wait in {backup})")
        for name in names:
            if os.path.lexists(backup / name):
                try:
                    os.replace(backup / name, out / name)
                except OSError as err:  # a name taken since the check: the rest waits, and the journal stays
                    raise MechkitError(f"cannot roll back the write killed in {out}: putting back {out / name} "
                                       f"failed ({err.strerror or type(err).__name__})",
                                       f"move aside what is at {out / name}, then rerun (its old files wait in "
                                       f"{backup})") from None
        discard_tree(tmp)
    journal_path(out).unlink(missing_ok=True)
    return True


def _refuse_in_the_way(out: Path, backup: Path, names: list[str], moved: list[str]) -> None:
    """Refuse (one line) to roll back where a name the old set goes back to is taken by something the killed
    write did not move in: a file or folder the user made there since the kill. The roll-back had replaced such a
    file with the old one, or failed half-way on a folder and then let the sweep delete the old set with its
    temporary folder."""
    taken = [n for n in names if os.path.lexists(backup / n) and os.path.lexists(out / n) and n not in moved]
    if taken:
        more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
        raise MechkitError(f"cannot roll back the write killed in {out}: {out / taken[0]}{more}, which that write "
                           "did not put there, stands where its old files go back",
                           f"move {'those' if more else 'it'} out of {out}, then rerun (the old files wait in "
                           f"{backup})")


def _refuse_changed(out: Path, moved: list[str], trees: dict[str, list[str]] | None,
                    ids: dict[str, list[int]] | None) -> None:
    """Refuse (one line) to roll back where a name the killed write moved in no longer holds only what it moved:
    a file or link a user put at its name, a file put inside its half-installed folder, a folder bind-mounted
    there. The roll-back had deleted each with the rest, through the mount too. ``trees`` ``None``: a journal
    older than its record of trees, whose folders :func:`recover` removes on their own mount only."""
    if trees is None:
        return
    for name in moved:
        path = out / name
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        extra = sorted(set(tree_files(path)) - set(trees[name])) if is_dir and name in trees else []
        other = ids is not None and name in ids and _id(path) != ids[name]  # not the entry it moved in
        if is_dir != (name in trees) or extra or other:
            what = f"{path / extra[0].rstrip(LINK)}" + (f" and {len(extra) - 1} more" if len(extra) > 1 else "") \
                if extra else f"{path}" + ("" if other and is_dir == (name in trees) else
                                           f", now a {'link' if os.path.islink(path) else 'folder' if is_dir else 'file'}")
            raise MechkitError(f"cannot roll back the write killed in {out}: it would delete {what}, which that "
                               "write did not put there",
                               f"move {'those' if len(extra) > 1 else 'it'} out of {out}, then rerun")
