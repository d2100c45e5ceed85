"""The journal of a set of files being installed into a directory, and the roll-back after a kill.

:mod:`mechkit.io.replace` writes the journal before it moves anything; :func:`recover` reads it and puts
the old set back. It lives apart so that the cleaning of leftovers (:mod:`mechkit.io.leftovers`), which
rolls back journals it finds, needs nothing from the writers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from mechkit.errors import MechkitError
from mechkit.io.read import read_plain
from mechkit.io.remove import discard_tree, remove_beneath

JOURNAL_LIMIT = 2**24  # a set's entries, about 106 bytes each (short names); half of it is the most recorded
TOO_MANY = "too many to list"  # a journal's entries where the set held more than a journal holds
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
    removes, and each entry it installs with what lies below a folder, each by its :func:`_signature`, so a
    roll-back deletes only what is still what it moved in (:func:`recover`). Entries too many for a journal are
    :data:`TOO_MANY`: a roll-back then deletes nothing it moved in, and says what to move aside."""
    entries: dict[str, list] = {}
    for name in install:
        if os.path.lexists(tmp / name):
            entries |= _entries(tmp, name)
    text = json.dumps({"tmp": tmp.name, "install": install, "remove": remove, "entries": entries})
    if len(text.encode()) > JOURNAL_LIMIT // 2:  # it had been an older journal's, whose roll-back checks nothing
        text = json.dumps({"tmp": tmp.name, "install": install, "remove": remove, "entries": TOO_MANY})
    return text


class _Journal(NamedTuple):
    tmp: Path  # the temporary folder: the new set's files not yet moved in, the old ones in .previous
    install: list[str]  # the names it moves in
    names: list[str]  # every name it touches (those it moves in and those it removes)
    entries: dict[str, list] | str | None  # each entry moved in, and below, by signature; TOO_MANY; None: older


SMALL_FILE = 1 << 20  # a file up to this size is known by its content; a larger one by its size and time


def _signature(path: Path) -> list:
    """What an entry the write moved in must still be for a roll-back to delete it: a folder (what it holds is
    listed entry by entry), a link and what it names, a file by its content (up to :data:`SMALL_FILE` bytes) or
    else its size and modification time. A copy (``cp -a``) or a ``touch`` of a small file keeps it; a file, link
    or folder the user put at the name, or a file they changed, does not."""
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        return ["folder"]
    if stat.S_ISLNK(info.st_mode):
        return ["link", os.readlink(path)]
    if not stat.S_ISREG(info.st_mode):
        return ["special", stat.S_IFMT(info.st_mode)]
    if info.st_size > SMALL_FILE:
        return ["file", info.st_size, info.st_mtime_ns]
    try:
        return ["file", info.st_size, hashlib.sha256(read_plain(path, SMALL_FILE)).hexdigest()]
    except OSError:  # changed under us: no match
        return ["file", info.st_size, None]


def _entries(base: Path, name: str) -> dict[str, list]:
    """``name`` in ``base`` and, a folder, every entry below it (links not followed; a mount inside is walked, so
    what it shows is no entry the write made), each by its :func:`_signature`."""
    found = {name: _signature(base / name)}
    if found[name] == ["folder"]:
        for root, dirs, files in os.walk(base / name):
            for entry in [*dirs, *files]:
                path = Path(root, entry)
                found[path.relative_to(base).as_posix()] = _signature(path)
    return found


def _entries_of(record: dict) -> dict[str, list] | str | None:
    entries = record.get("entries")
    if entries is None or entries == TOO_MANY:
        return entries
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, list) for k, v in entries.items()):
        raise ValueError("its record of the entries it installs is damaged")
    return entries


def journal_problem(out: str | os.PathLike[str]) -> MechkitError | None:
    """Why :func:`recover` cannot roll back ``out``'s journal (unreadable, naming no temporary directory mechkit
    makes, or a name it would delete or put back now holding what the write did not put there), or ``None`` where
    it can (or there is none): asked without acting, so a sweep of leftovers
    (``cache list``, ``cache clear``, the next save's cleaning) skips such a journal, saying so, instead of
    counting it as removable and then failing whole on it."""
    try:
        _plan(Path(out))
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
        entries = _entries_of(record)
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
    return _Journal(tmp, install, names, entries)


def recover(out: str | os.PathLike[str]) -> bool:
    """Roll back a set a killed writer left half-installed in ``out``; True when there was one.

    Call it holding ``out``'s lock. A journal whose temporary directory is gone (the write committed, or
    was already rolled back) is just removed. One that cannot be read is one :class:`MechkitError` line
    (:func:`journal_problem` asks the same without acting).
    """
    out = Path(out)
    plan = _plan(out)
    if plan is None:
        return False
    (tmp, _, names, _), moved = plan
    if moved is not None:
        backup = tmp / ".previous"
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


def _plan(out: Path) -> tuple[_Journal, list[str] | None] | None:
    """``out``'s journal and the names its killed write moved in (``None``: its temporary folder is gone, nothing
    to put back), refused in one line where a roll-back would delete or replace what that write did not put
    there; ``None`` where there is no journal."""
    read = _read(out)
    if read is None:
        return None
    if not read.tmp.is_dir() or read.tmp.is_symlink():
        return read, None
    _refuse_swapped_folder(out, read.names)  # first: every name below is looked up through that folder
    moved = [n for n in read.install if not os.path.lexists(read.tmp / n) and os.path.lexists(out / n)]
    _refuse_changed(out, moved, read.entries)  # before anything moves: the user's files are never the roll-back's
    _refuse_in_the_way(out, read.tmp / ".previous", read.names, moved)
    return read, moved


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


def _refuse_changed(out: Path, moved: list[str], entries: dict[str, list] | str | None) -> None:
    """Refuse (one line, naming them all) to roll back where a name the killed write moved in no longer holds just
    what it moved: a file or link the user put at its name, a file they put inside its half-installed folder or
    changed there, a folder bind-mounted there. The roll-back had deleted each with the rest, through the mount
    too. ``entries`` ``None``: an older journal, whose entries :func:`recover` removes on their own mount only."""
    if entries is None:
        return
    if entries == TOO_MANY:
        if moved:
            raise MechkitError(f"cannot roll back the write killed in {out}: it had moved in {out / moved[0]}"
                               + (f" and {len(moved) - 1} more" if len(moved) > 1 else "") + ", whose entries were "
                               "too many for its journal to list, so the roll-back cannot tell them from yours",
                               f"move {'those' if len(moved) > 1 else 'it'} out of {out} (keep what is yours), "
                               "then rerun")
        return
    theirs = []
    for name in moved:
        now = _entries(out, name)
        theirs += [k for k in now if entries.get(k) != now[k]]
    if theirs:
        named = [f"{out / k}" + (f", now a {_signature(out / k)[0]}" if k in moved and
                                 entries.get(k, ["?"])[0] != _signature(out / k)[0] else "") for k in sorted(theirs)]
        listed = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
        raise MechkitError(f"cannot roll back the write killed in {out}: it would delete {listed}, which that write "
                           "did not put there", f"move {'those' if len(named) > 1 else 'it'} out of {out}, then rerun")


def _refuse_swapped_folder(out: Path, names: list[str]) -> None:
    """Refuse (one line) where the folder holding a ``FOLDER/NAME`` the killed write touched is now a link or a
    file: its entries were read through the link and matched, and the roll-back then refused to delete through it
    with "holds a mount point", which sent the user looking for a mount (or put an old file back through it)."""
    for name in names:
        folder = name.partition("/")[0]
        if "/" in name and os.path.lexists(out / folder) and (os.path.islink(out / folder)
                                                              or not (out / folder).is_dir()):
            kind = "link" if os.path.islink(out / folder) else "file"
            raise MechkitError(f"cannot roll back the write killed in {out}: {out / folder}, the folder holding "
                               f"{name.partition('/')[2]} of that write, is now a {kind}",
                               f"move that {kind} out of {out} and make {out / folder} a folder again, then rerun")
