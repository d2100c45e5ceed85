"""Red-team pass 26, helper A's failures, each fixed in general.

A plugin returning a ``Path`` that holds ``--out`` had the writer's rename into itself fail as a raw OSError and
the whole folder (the user's files in it) deleted; one outside ``$TMPDIR`` whose copy onto a full disk failed was
deleted too; the same ``Path`` returned twice was called "removed by a cleaner". A journal nested too deeply was a
RecursionError traceback, and a FIFO under a journal's name hung ``cache list`` and every save for ever.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from tests.conftest import returning_files

NESTED = "[" * 200000 + "]" * 200000


def _tmpdir(tmp_path: Path, monkeypatch) -> Path:
    import tempfile

    where = tmp_path / "t"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where



def _returning(files):
    return returning_files(files, "rt26a-files")


class Hung(BaseException):
    """Raised by :func:`_within`'s alarm: no ``except OSError`` (a TimeoutError is one) or ``except Exception``
    of the code under test swallows it."""


def _within(seconds: float, fn):
    """``fn()``, failing the test (instead of hanging it) where it blocks longer than ``seconds``."""
    def alarm(*_):
        raise Hung(f"still blocked after {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _user_folder(path: Path) -> Path:
    (path / "keep").mkdir(parents=True)
    (path / "keep" / "user.txt").write_text("precious")
    return path


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` but the temporary directory ``t`` (the writer's own folders come and go there)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.relative_to(root).parts[0] != "t")


# D1 + D3: a Path that is --out, holds it, is inside it or the cache, or is returned twice: refused early ---------

@pytest.mark.parametrize("scratch", [True, False], ids=["in-tmpdir", "outside-tmpdir"])
@pytest.mark.parametrize("where", ["parent", "grandparent", "out", "inside-out"])
def test_a_path_holding_or_inside_out_is_refused_and_left_intact(where, scratch, tmp_path, monkeypatch):
    if not scratch:
        _tmpdir(tmp_path, monkeypatch)  # the temporary directory elsewhere: the user's folder is outside it
    home = _user_folder(tmp_path / "home" / "proj")
    out = home / "out"
    if where in ("out", "inside-out"):
        mk.run(_returning({"x.txt": "old"}), out=out)  # an earlier report there
        _user_folder(out / "inner")
    path = {"parent": home, "grandparent": home.parent, "out": out, "inside-out": out / "inner"}[where]
    before = _tree(tmp_path)
    with pytest.raises(PluginError, match="--out") as info:
        mk.run(_returning({"m": path}), out=out, force=True)
    assert str(path) in str(info.value) and "\n" not in info.value.problem
    assert _tree(tmp_path) == before and (home / "keep" / "user.txt").read_text() == "precious"


@pytest.mark.parametrize("where", ["root", "inside", "parent"])
def test_a_path_in_or_holding_mechkits_cache_is_refused_and_left_intact(where, tmp_path, monkeypatch):
    root = tmp_path / "c" / "cache"
    monkeypatch.setenv("MECHKIT_CACHE", str(root))
    (root / "gguf").mkdir(parents=True)
    (root / "gguf" / "m.gguf").write_text("model")
    path = {"root": root, "inside": root / "gguf", "parent": root.parent}[where]
    with pytest.raises(PluginError, match="cache"):
        mk.run(_returning({"m": path}), out=tmp_path / "out")
    assert (root / "gguf" / "m.gguf").read_text() == "model" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["file", "folder", "alias"])
def test_a_path_returned_twice_is_refused_before_the_writer(kind, tmp_path, monkeypatch):
    where = _tmpdir(tmp_path, monkeypatch)
    src = where / "prepared"
    if kind == "folder":
        src.mkdir()
        (src / "a").write_text("a")
    else:
        src.write_text("a")
    other = where / "." / "prepared" if kind == "alias" else src
    with pytest.raises(PluginError, match="twice"):
        mk.run(_returning({"a": src, "b": other}), out=tmp_path / "out")
    assert not (tmp_path / "out").exists() and src.exists()  # not mechkit's own prepared folder: left (pass 27)


# D2: a copy that fails removes the source only from the temporary directory ----------------------------------------

def _full_disk(monkeypatch, src: Path) -> None:
    """The rename of ``src`` fails as across file systems, and each copy writes part of its file, then fails as
    a full disk."""
    real_rename = os.rename

    def rename(a, b, *args, **kwargs):
        if Path(a) == src:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
        return real_rename(a, b, *args, **kwargs)

    def copy2(a, b, **_kwargs):
        Path(b).write_bytes(Path(a).read_bytes()[:3])
        raise OSError(errno.ENOSPC, "No space left on device", str(a))

    def link(a, b, *args, **kwargs):  # a user's path is linked, not renamed (pass 30): across devices it cannot be
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(shutil, "copy2", copy2)


@pytest.mark.parametrize("kind", ["file", "folder"])
@pytest.mark.parametrize("scratch", [True, False], ids=["in-tmpdir", "outside-tmpdir"])
def test_a_failed_copy_keeps_a_source_outside_tmpdir_intact(scratch, kind, tmp_path, monkeypatch):
    where = _tmpdir(tmp_path, monkeypatch)
    src = (where if scratch else tmp_path / "mine") / "data"
    if kind == "folder":
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "a.bin").write_bytes(b"precious data")
    else:
        src.parent.mkdir(exist_ok=True)
        src.write_bytes(b"precious data")
    _full_disk(monkeypatch, src)
    with pytest.raises(MechkitError, match="(?i)space"):
        mk.run(_returning({"d": src}), out=tmp_path / "out")
    assert src.exists()  # a path mechkit did not prepare is never removed, in $TMPDIR or not (pass 27)
    if not scratch:
        got = (src / "sub" / "a.bin") if kind == "folder" else src
        assert got.read_bytes() == b"precious data"
    assert not (tmp_path / "out").exists()


# D4 + D5: a journal nested too deeply, or no regular file, is damaged: skipped in sweeps, refused for --out -------

def _journal(folder: Path, name: str, kind: str) -> Path:
    journal = folder / f".{name}.mechkit-replace"
    if kind == "nested":
        journal.write_text(NESTED)
    elif kind == "fifo":
        os.mkfifo(journal)
    else:  # another user's FIFO ($TMPDIR is shared)
        os.mkfifo(journal)
        os.chown(journal, 65534, 65534)
    return journal


def _unblock(journal: Path) -> None:
    """Let a reader still blocked on FIFO ``journal`` (old code) go: open it for writing and close it."""
    if journal.is_fifo():
        with contextlib.suppress(OSError):
            os.close(os.open(journal, os.O_WRONLY | os.O_NONBLOCK))


KINDS = ["nested", "fifo", "foreign-fifo"]


def _kind(kind: str) -> None:
    if kind == "foreign-fifo" and os.geteuid() != 0:
        pytest.skip("making another user's FIFO needs root")


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_journal_in_tmpdir_is_skipped_by_list_and_clear(kind, tmp_path, monkeypatch, capsys):
    from mechkit.io.disk_cache import LEFTOVERS, clear_cache, list_cache
    from mechkit.io.leftovers import stale_prepared

    _kind(kind)
    where = _tmpdir(tmp_path, monkeypatch)
    journal = _journal(where, "mechkit-pruned-999999-deadbeef", kind)
    root = tmp_path / "cache"
    root.mkdir()
    try:
        assert _within(10, lambda: stale_prepared(where)) == []
        _within(10, lambda: list_cache(root))
        _within(10, lambda: clear_cache([LEFTOVERS], root=root))
    finally:
        _unblock(journal)
    assert os.path.lexists(journal)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    if kind == "foreign-fifo":
        assert err == []  # another user's: not even opened
    else:
        assert len(err) == 1 and "warning" in err[0] and str(journal) in err[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_journal_in_tmpdir_never_fails_or_hangs_the_next_save(kind, tmp_path, monkeypatch, capsys):
    from mechkit.io.leftovers import make_prepared_dir, release_prepared

    _kind(kind)
    where = _tmpdir(tmp_path, monkeypatch)
    journal = _journal(where, "mechkit-pruned-999999-deadbeef", kind)
    try:
        made = _within(10, make_prepared_dir)  # prune --save-model's (it cleans killed runs' leftovers)
        _within(10, lambda: release_prepared(made))
    finally:
        _unblock(journal)
    assert os.path.lexists(journal)


@pytest.mark.parametrize("kind", ["nested", "fifo"])
def test_a_damaged_journal_beside_out_is_refused_in_one_line(kind, tmp_path):
    journal = _journal(tmp_path, "out", kind)
    try:
        with pytest.raises(MechkitError, match="journal") as info:
            _within(10, lambda: mk.run(_returning({"x.txt": "a"}), out=tmp_path / "out"))
    finally:
        _unblock(journal)
    assert str(journal) in str(info.value) and "\n" not in info.value.problem and info.value.fix
    assert os.path.lexists(journal)


@pytest.mark.parametrize("kind", ["nested", "fifo"])
def test_journal_problem_names_a_damaged_journal_without_blocking(kind, tmp_path):
    from mechkit.io.journal import journal_problem

    journal = _journal(tmp_path, "out", kind)
    try:
        problem = _within(10, lambda: journal_problem(tmp_path / "out"))
    finally:
        _unblock(journal)
    assert isinstance(problem, MechkitError) and str(journal) in problem.problem


# --- pass 27: a returned path mechkit did not prepare is never removed; shared folders and special files inside --


def test_a_users_folder_in_tmpdir_returned_by_a_plugin_survives_an_unwritten_run(tmp_path, monkeypatch):
    where = _tmpdir(tmp_path, monkeypatch)
    mine = where / "my_project"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    mk.run(_returning({"x": mine}), write=False)
    assert (mine / "thesis.txt").read_text() == "precious"


@pytest.mark.parametrize("which", ["tmpdir", "cwd"])
def test_the_temporary_or_working_directory_returned_is_refused(which, tmp_path, monkeypatch):
    where = _tmpdir(tmp_path, monkeypatch)
    (where / "someone_else.txt").write_text("other")
    work = where / "proj"
    work.mkdir()
    (work / "notes.txt").write_text("data")
    monkeypatch.chdir(work)
    target = where if which == "tmpdir" else Path(".")
    with pytest.raises(PluginError, match="temporary directory|working directory"):
        mk.run(_returning({"x": target}), out=tmp_path / "out")
    assert (where / "someone_else.txt").exists() and (work / "notes.txt").exists()


def test_a_fifo_inside_a_returned_folder_is_refused_before_the_writer(tmp_path, monkeypatch):
    where = _tmpdir(tmp_path, monkeypatch)
    folder = where / "prep"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    os.mkfifo(folder / "pipe")
    with pytest.raises(PluginError, match="a FIFO"):
        mk.run(_returning({"x": folder}), out=tmp_path / "out")
    assert not (tmp_path / "out" / "report.json").exists()
