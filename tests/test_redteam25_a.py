"""Red-team pass 25, helper A's failures, each fixed in general.

A run refused after its plugin prepared a file (``prune --save-model``'s pruned model in ``$TMPDIR``) left it
there, still locked by the live process (a notebook's kernel), which no ``cache clear`` could remove: a whole
model per try. A damaged journal beside a killed run's prepared folder failed every later ``prune --save-model``
after its work and ``cache clear leftovers`` whole, while ``cache list`` counted it as removable. A plugin's
``Path`` of a file on another file system than ``--out`` was called "removed before it was moved in", and a
rerun failed the same way.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from tests.conftest import returning_files, temp_dir_in

MODEL = {"model.safetensors": "w" * 100, "config.json": "{}"}


def _prepared_left(where: Path) -> list[str]:
    """The prepared folders in ``where`` and the ones this process still holds a lock on."""
    from mechkit.io import leftovers

    held = [k for k in leftovers._PREPARED_LOCKS if Path(k).parent == where]  # noqa: SLF001 - the test's look
    return sorted(p.name for p in where.iterdir() if p.name.startswith("mechkit-pruned-")) + held


class _Figure:
    """A figure whose saving fails the way a full disk or Ctrl-C does, after the plugin prepared its files."""

    def __init__(self, err: BaseException) -> None:
        self.err = err

    def savefig(self, *_args, **_kwargs):
        raise self.err


def _preparing(end: str, returned: dict | None = None):
    """A plugin that prepares a model folder in ``$TMPDIR`` as prune does, then ends the run by ``end``."""
    from mechkit.io.leftovers import make_prepared_dir

    class P(mk.Plugin):
        name = f"rt25a-{end}"
        version = "0.1"
        summary = "prepares a model, then the run ends"
        needs_model = end == "changed"

        def run(self, ctx):
            path = make_prepared_dir()
            for name, text in MODEL.items():
                (path / name).write_text(text)
            if end == "raises":
                raise RuntimeError("the plugin failed after its save")
            if end == "changed":  # a weight left edited: the unchanged check refuses the run
                import torch

                with torch.no_grad():
                    next(ctx.model.model.parameters()).add_(1.0)
            figures = {}
            if end in ("full", "interrupt"):
                figures = {"f": _Figure(OSError(errno.ENOSPC, "No space left on device") if end == "full"
                                        else KeyboardInterrupt())}
            return mk.Result(results={"a": 1}, figures=figures, files={"model": path, **(returned or {})})

    return P


@pytest.mark.parametrize("end, raised", [
    ("full", MechkitError),  # the report's write fails (a full --out)
    ("interrupt", KeyboardInterrupt),  # Ctrl-C in the writer
    ("raises", RuntimeError),  # the plugin fails between its save and its return
    ("changed", PluginError),  # the unchanged check refuses
    ("bad-file", PluginError),  # check_result refuses another of its files
])
def test_a_refused_run_leaves_no_prepared_model_behind_nor_held(end, raised, tmp_path, monkeypatch):
    where = temp_dir_in(tmp_path, monkeypatch)
    extra = {"gone": tmp_path / "missing.bin"} if end == "bad-file" else None
    fds = _open_under(tmp_path, where)
    for _ in range(2):  # every try: none accumulate
        with pytest.raises(raised):
            mk.run(_preparing(end, extra), model="tiny:llama", out=tmp_path / "out")
    assert _prepared_left(where) == []
    assert not (tmp_path / "out" / "report.json").exists()
    assert _open_under(tmp_path, where) == fds  # no lock left open


def _open_under(*places) -> list[str]:
    """The files this process holds open under ``places`` (a lock, a prepared folder): counted by what they are, not
    by how many descriptors the process has, which a thread an earlier test left (a Ray client's sockets) changes."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(target.startswith(str(Path(p).resolve())) for p in places if p is not None):
            held.append(target)
    return sorted(held)


def test_an_unwritten_run_and_a_written_one_end_with_their_prepared_model_gone(tmp_path, monkeypatch):
    where = temp_dir_in(tmp_path, monkeypatch)
    run = mk.run(_preparing("unwritten"), model="tiny:llama", write=False)
    assert run.out_dir is None and _prepared_left(where) == []
    mk.run(_preparing("written"), model="tiny:llama", out=tmp_path / "out")
    assert (tmp_path / "out" / "model" / "model.safetensors").exists() and _prepared_left(where) == []


def test_prune_save_model_refused_by_its_report_write_leaves_nothing_intemp_dir_in(tmp_path, monkeypatch):
    import mechkit.report as report

    where = temp_dir_in(tmp_path, monkeypatch)

    def full(out, *_args, **_kwargs):  # --out on a full 20 KB tmpfs
        raise MechkitError(f"cannot write {out}: no space left on the device", "free some space there")

    monkeypatch.setattr(report, "write_report", full)
    for _ in range(2):
        with pytest.raises(MechkitError, match="no space left"):
            mk.run("prune", model="tiny:llama", out=tmp_path / "small" / "o", guide="magnitude", sparsity="0.2",
                   save_model=True)
    assert _prepared_left(where) == []


# G2: a journal no roll-back can read is skipped, said in one line, and never counted ----------------------------

DAMAGED = [
    "not json",
    "[1, 2]",  # JSON, but no record
    json.dumps({"tmp": ".mechkit-pruned-999994-abcdabcd.tmp-1-0a1b2c3d"}),  # no "install"
    json.dumps({"tmp": "../elsewhere", "install": [], "remove": []}),  # names no folder mechkit makes
]


def _dead_with_journal(where: Path, text: str, pid: int = 999994) -> tuple[Path, Path]:
    folder = where / f"mechkit-pruned-{pid}-abcdabcd"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    journal = where / f".{folder.name}.mechkit-replace"
    journal.write_text(text)
    return folder, journal


@pytest.mark.parametrize("text", DAMAGED)
def test_a_damaged_journal_in_tmpdir_never_blocks_the_next_save(text, tmp_path, monkeypatch, capsys):
    from mechkit.io.leftovers import make_prepared_dir, release_prepared, stale_prepared

    where = temp_dir_in(tmp_path, monkeypatch)
    folder, journal = _dead_with_journal(where, text)
    assert journal not in stale_prepared(where)  # cache list does not count what clear will not remove
    made = make_prepared_dir()  # prune --save-model's: it failed after the work
    release_prepared(made)
    assert not folder.exists() and journal.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and str(journal) in err[0] and "delete" in err[0]


@pytest.mark.parametrize("text", DAMAGED)
def test_cache_clear_leftovers_skips_a_damaged_journal_and_clears_the_rest(text, tmp_path, monkeypatch, capsys):
    from mechkit.io.disk_cache import LEFTOVERS, clear_cache, list_cache
    from mechkit.io.leftovers import clean_leftovers

    where = temp_dir_in(tmp_path, monkeypatch)
    _, journal = _dead_with_journal(where, text)
    other = where / "mechkit-pruned-999995-abcdabcd"  # another killed run's model
    other.mkdir()
    (other / "config.json").write_text("{}")
    root = tmp_path / "cache"
    (root / "gguf").mkdir(parents=True)
    mine = root / "gguf" / ".m.mechkit-replace"  # a damaged journal in the cache too
    mine.write_text(text.replace("mechkit-pruned-999994-abcdabcd", "m"))
    lock = root / "gguf" / ".n.mechkit-lock"  # a stale lock beside it
    lock.write_text("1")
    row = next(e for e in list_cache(root) if e.name == LEFTOVERS)
    assert row.size == len("1") + len("{}") * 2  # the journals are not counted as removable
    removed = clear_cache([LEFTOVERS], root=root)
    assert removed and not other.exists() and not lock.exists()
    assert journal.exists() and mine.exists()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 2 and any(str(journal) in line for line in err) and any(str(mine) in line for line in err)
    with pytest.raises(MechkitError, match="journal"):  # a writer of that very folder is still refused, at once
        clean_leftovers(root / "gguf", "m", locked=True)


# G3: a Path of a file is moved in across file systems; one neither file nor folder is refused early -------------


def _returning(files):
    return returning_files(files, "rt25a-files")


def _cross_device(monkeypatch, src: Path) -> list[tuple[str, bool]]:
    """``os.rename`` of ``src`` fails as across file systems; each file fsync'ed, with whether the source was
    still there then."""
    real_rename, real_fsync, synced = os.rename, os.fsync, []

    def rename(a, b, *args, **kwargs):
        if Path(a) == src:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
        return real_rename(a, b, *args, **kwargs)

    def fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), src.exists()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.parametrize("kind", ["file", "binary", "folder"])
def test_a_prepared_path_on_another_file_system_is_copied_synced_then_removed(kind, tmp_path, monkeypatch):
    src = tmp_path / ("victim.txt" if kind != "folder" else "vectors")
    if kind == "folder":
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "a.bin").write_bytes(b"\x00\x01" * 50)
    else:
        src.write_bytes(b"hello" if kind == "file" else bytes(range(256)) * 40)
    expect = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()} \
        if kind == "folder" else src.read_bytes()
    synced = _cross_device(monkeypatch, src)
    mk.run(_returning({"f.txt": src}), out=tmp_path / "out")
    got = tmp_path / "out" / "f.txt"
    if kind == "folder":
        assert {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*")
                if p.is_file() and p.name != ".mechkit-files"} == expect  # its list, written since pass 31
    else:
        assert got.read_bytes() == expect
    first = {}  # each copied file's first sync (the writer syncs its files again before its rename)
    for path, there in synced:
        first.setdefault(path, there)
    copied = "/f.txt/sub/a.bin" if kind == "folder" else "/f.txt"
    copies = [there for path, there in first.items() if ".out.tmp-" in path and path.endswith(copied)]
    assert not src.exists() and copies == [True]  # the copy synced while the source was still there


def test_a_file_in_dev_shm_is_moved_into_the_report(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no /dev/shm on another file system here")
    src = shm / f"rt25a-{os.getpid()}.txt"
    src.write_text("victim")
    try:
        mk.run(_returning({"f.txt": src}), out=tmp_path / "out")
    finally:
        leftover = src.exists()
        src.unlink(missing_ok=True)
    assert (tmp_path / "out" / "f.txt").read_text() == "victim" and not leftover


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / kind
    if kind == "missing":
        return path
    if kind == "link":
        (tmp_path / "target.txt").write_text("x")
        path.symlink_to(tmp_path / "target.txt")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    return path


@pytest.mark.parametrize("kind, words", [("missing", "missing"), ("link", "a symbolic link"), ("fifo", "a FIFO"),
                                         ("socket", "a socket")])
def test_a_path_neither_file_nor_folder_is_refused_before_the_writer(kind, words, tmp_path, monkeypatch):
    where = temp_dir_in(tmp_path, monkeypatch)
    bad = _special(tmp_path, kind)
    out = tmp_path / "out"
    keep = os.open(bad, os.O_RDWR | os.O_NONBLOCK) if kind == "fifo" else None  # a writer: an open never hangs
    try:
        with pytest.raises(PluginError, match=f"files\\['f'\\] as the path .*which is {words}.*, not a regular file") \
                as err:
            mk.run(_preparing("bad", {"f": bad}), model="tiny:llama", out=out)
    finally:
        if keep is not None:
            os.close(keep)
    assert "\n" not in str(err.value) and not (out / "report.json").exists()
    assert _prepared_left(where) == []  # the plugin's other, good one is let go too
    if kind == "link":
        assert (tmp_path / "target.txt").exists()  # what a link names is never followed nor removed


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_path_outside_the_temporary_directory_is_left_where_it_is_when_the_run_is_refused(kind, tmp_path,
                                                                                           monkeypatch):
    temp_dir_in(tmp_path, monkeypatch)  # $TMPDIR is tmp_path/t: the user's path below is outside it
    mine = tmp_path / "user" / "notes"
    if kind == "file":
        mine.parent.mkdir()
        mine.write_text("mine")
    else:
        mine.mkdir(parents=True)
        (mine / "a.txt").write_text("mine")
    out = tmp_path / "out"
    with pytest.raises(PluginError, match="a symbolic link"):  # refused for its other file, after the plugin ran
        mk.run(_returning({"mine": mine, "bad": _special(tmp_path, "link")}), model="tiny:llama", out=out)
    assert mine.exists() and not (out / "report.json").exists()
