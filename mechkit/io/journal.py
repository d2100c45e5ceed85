"""The journal of a set of files being installed into a directory, and the roll-back after a kill.

:mod:`mechkit.io.replace` writes the journal before it moves anything; :func:`recover` reads it and puts
the old set back. It lives apart so that the cleaning of leftovers (:mod:`mechkit.io.leftovers`), which
rolls back journals it finds, needs nothing from the writers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.read import read_plain

JOURNAL_LIMIT = 2**20  # a journal lists a few dozen names: anything larger is no journal mechkit wrote


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


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


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


def _read(out: Path) -> tuple[Path, list[str], list[str]] | None:
    """The journal's temporary directory, the names it installs and all the names it touches; ``None`` where
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
    return tmp, install, names


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
    tmp, install, names = read
    if tmp.is_dir() and not tmp.is_symlink():
        backup = tmp / ".previous"
        for name in install:  # moved in already: ours, from the killed write
            if not (tmp / name).exists() and ((out / name).exists() or (out / name).is_symlink()):
                remove_path(out / name)
        for name in names:
            if (backup / name).exists() or (backup / name).is_symlink():
                os.replace(backup / name, out / name)
        shutil.rmtree(tmp, ignore_errors=True)
    journal_path(out).unlink(missing_ok=True)
    return True
