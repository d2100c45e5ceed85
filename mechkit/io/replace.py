"""Replace the files a run writes in a user's directory, as one set, all or nothing, and nothing else.

``--force`` over an existing ``--out`` must not touch what is not mechkit's: a user's notes, an input
vector, another tool's files. So a forced write never swaps or empties the directory. It builds the
new files in a hidden temporary directory beside it (:func:`mechkit.io.temp_dir_beside`), then
installs them under a *journal*, a hidden file beside the directory naming every file of the set:

1. the journal is written (atomically);
2. the old files of the set (the new names, plus the names the previous mechkit write listed in the
   directory's manifest ``.mechkit-files``) are moved aside into the temporary directory, the *key* file
   (``report.json``, a model's ``config.json``) first, so no key ever sits beside another run's files;
3. the new files are moved in, the key file last;
4. the journal is removed: this one ``unlink`` is the commit. The files set aside are then deleted.

A process killed anywhere in 2-3 leaves the journal; the next writer of the directory (under its lock,
:func:`mechkit.io.outlock.out_lock`) or ``mechkit cache clear`` rolls the set back to the old one whole
(:func:`recover`). Files whose names are not in either set are never moved, read or deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, plain_name, recover

MANIFEST = ".mechkit-files"  # inside a directory mechkit wrote: the names it wrote there (JSON list)
KEY_FILES = ("report.json", "config.json")  # the file that says "this set is whole": out first, in last


def owned_names(out: Path) -> list[str]:
    """The names the last mechkit write made in ``out``: its manifest, else a report's own list (``report.json``,
    ``report.html`` and its ``artifacts``); none where neither is there."""
    names: object = []
    with contextlib.suppress(OSError, ValueError):
        names = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    if not names:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            report = json.loads((out / "report.json").read_text(encoding="utf-8"))
            names = ["report.json", "report.html", *report.get("artifacts", [])]
    return [n for n in names if isinstance(n, str) and plain_name(n)] if isinstance(names, list) else []


def _ordered(names: Sequence[str]) -> list[str]:
    """``names`` with the key file last (it goes in last and comes out first)."""
    keys = [n for n in KEY_FILES if n in names]
    return [n for n in names if n not in keys] + keys


def install_set(tmp: Path, out: Path, names: Sequence[str], manifest: bool = True) -> None:
    """Move ``names`` from ``tmp`` into the existing directory ``out`` as one set (see the module doc), with
    a manifest listing them when ``manifest``; the old files of the set end up in ``tmp/.previous`` and
    ``tmp`` is removed afterwards by the caller."""
    recover(out)
    new = [n for n in dict.fromkeys(names) if n != MANIFEST]
    stale = [n for n in owned_names(out) if n not in new and n != MANIFEST]
    if manifest:
        _write_manifest(tmp, new)
        new.append(MANIFEST)
    elif (out / MANIFEST).exists():
        stale.append(MANIFEST)  # it would list another set
    new = _ordered(new)
    backup = tmp / ".previous"
    backup.mkdir()
    journal = journal_path(out)
    from mechkit.io.atomic import write_atomic

    write_atomic(journal, json.dumps({"tmp": tmp.name, "install": new, "remove": stale}))
    try:
        for name in reversed(_ordered([*new, *stale])):  # key file first
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, backup / name)
        for name in new:  # key file last
            os.replace(tmp / name, out / name)
    except BaseException:
        recover(out)
        raise
    journal.unlink()  # the commit
    with contextlib.suppress(OSError):
        _fsync_dir(out.parent)


@contextlib.contextmanager
def replacing_dir(target: str | os.PathLike[str], force: bool = False, manifest: bool = True) -> Iterator[Path]:
    """Build a user's output directory in a temporary directory; on success it becomes ``target``.

    A new or empty ``target`` appears in one rename (:func:`mechkit.io.atomic_dir`). An existing,
    non-empty one (only with ``force``) gets the new files as one set (:func:`install_set`): the
    files this write and the previous mechkit write made are replaced, every other file is kept.
    On any error (Ctrl-C included) ``target`` is left as it was and the temporary directory removed.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (out / "notes.txt").write_text("mine")
    >>> with replacing_dir(out, force=True) as tmp:
    ...     _ = (tmp / "config.json").write_text("{}")
    >>> sorted(p.name for p in out.iterdir())
    ['.mechkit-files', 'config.json', 'notes.txt']
    """
    from mechkit.io.atomic import atomic_dir, temp_dir_beside

    target = Path(os.path.realpath(target))  # a symlinked --out: the directory it names, not the link
    recover(target)
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # an empty directory: the whole new one goes in with one rename
    if not target.is_dir():
        with atomic_dir(target, replace=False) as tmp:
            yield tmp
            if manifest:
                _write_manifest(tmp, [p.name for p in tmp.iterdir()])
        return
    if not force:
        raise MechkitError(f"{target} already exists and is not an empty directory",
                           "pass --force to replace it or choose another --out")
    tmp = temp_dir_beside(target)
    try:
        yield tmp
        install_set(tmp, target, sorted(p.name for p in tmp.iterdir()), manifest=manifest)
    finally:
        if not journal_path(target).exists():  # else it holds the old files the journal's roll-back needs
            shutil.rmtree(tmp, ignore_errors=True)


def _write_manifest(tmp: Path, names: Sequence[str]) -> None:
    (tmp / MANIFEST).write_text(json.dumps(sorted({*names, MANIFEST})), encoding="utf-8")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
