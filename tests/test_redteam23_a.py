"""Red-team pass 23, helper A's failures, each fixed in general.

A run's end and ``cache clear`` deleted through a bind mount inside a run's folder (``os.path.ismount`` misses
one of the same disk, and ``shutil.rmtree`` crosses mounts), and deleted every ``checkpoint.safetensors`` in any
folder below a scratch folder, or in a folder the marker never recorded; a directory under a step file's name
was deleted as a "damaged step"; a FIFO under the marker's or a step's name hung the run for good; a killed
``prune --save-model`` left its whole pruned model in ``$TMPDIR`` for good, on no ``cache list`` row.

The mounts are faked by pointing :data:`mechkit.io.read.MOUNTINFO` at a file listing them (as the kernel's
``/proc/self/mountinfo`` would), so these tests need no root; one test with a real bind mount runs as root.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from mechkit.errors import MechkitError
from tests.conftest import put_files, run_folder

KEY = "0123456789abcdef"
TEMP = ".checkpoint.safetensors.tmp-999999-0a1b2c3d"  # a killed writer's (pid 999999 is not alive)
CKPT = "checkpoint.safetensors"




def _fake_mounts(monkeypatch, tmp_path: Path, *points: Path) -> None:
    """Make mechkit see bind mounts at ``points`` (same disk: ``os.path.ismount`` says no)."""
    import mechkit.io.read as read_mod

    info = tmp_path / "mountinfo"
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    lines += [f"{40 + i} 22 8:1 /home/user/data{i} {os.path.realpath(p).replace(' ', chr(92) + '040')} rw - ext4 "
              "/dev/sda1 rw" for i, p in enumerate(points)]
    info.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(info))


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()}


# --- F1: a finished run never deletes through a mount point in its folder ----------------------------------


@pytest.mark.parametrize("mount", ["finetune", "finetunes/ft-1", "finetunes", "."])
def test_a_finished_run_never_deletes_through_a_bind_mount(tmp_path, monkeypatch, mount):
    from mechkit.io.disk_cache import finish_run_dir

    folder = run_folder(tmp_path, "finetune", "finetunes")
    users = {f"{mount}/{CKPT}": "user's weights", f"{mount}/sub/{CKPT}": "more", f"{mount}/{TEMP}": "theirs"}
    put_files(folder, {k.removeprefix("./"): v for k, v in users.items()})
    _fake_mounts(monkeypatch, tmp_path, folder / mount)
    kept = finish_run_dir(folder)
    assert kept
    for name, text in users.items():
        assert (folder / name).read_text() == text


def test_a_mount_point_is_read_from_the_kernels_list(tmp_path, monkeypatch):
    from mechkit.io.leftovers import mount_inside
    from mechkit.io.read import mount_points

    spaced = tmp_path / "my runs"
    (spaced / "a").mkdir(parents=True)
    _fake_mounts(monkeypatch, tmp_path, spaced / "a")
    assert str((spaced / "a").resolve()) in mount_points()  # \040 undone
    assert mount_inside(spaced) == str((spaced / "a").resolve())
    assert mount_inside(spaced / "a") == str((spaced / "a").resolve())
    assert mount_inside(tmp_path / "elsewhere") is None


# --- F2: only a scratch folder's own files and unit folders are a run's --------------------------------------


@pytest.mark.parametrize("users", [
    {f"finetune/mine/{CKPT}": "mine"}, {f"finetune/only/{CKPT}": "only"},
    {f"finetunes/ft-1/deeper/{CKPT}": "deep"}, {f"finetunes/notes/{CKPT}": "notes"},
    {f"finetune/mine/{CKPT}": "a", f"finetune/only/x/{CKPT}": "b"}])
def test_a_finished_run_keeps_a_users_folder_inside_a_scratch_folder(tmp_path, users):
    from mechkit.io.disk_cache import RUN_MARKER, finish_run_dir

    folder = run_folder(tmp_path, "finetune", "finetunes")
    put_files(folder, {f"finetune/{CKPT}": "w", f"finetunes/ft-1/{CKPT}": "w", f"finetunes/{TEMP}": "x"})
    put_files(folder, users)
    assert finish_run_dir(folder)
    assert _files(folder) == users  # the run's own files gone, every one of the user's kept
    assert not (folder / RUN_MARKER).exists()


# --- F3: `cache clear` and `cache list` go by the marker's scratch list, as a run's end does -----------------


@pytest.mark.parametrize("users", [
    {f"mine/{CKPT}": "mine"}, {f"mine/sub/{CKPT}": "deep"}, {f"finetune/mine/{CKPT}": "nested"},
    {f"finetune2/{CKPT}": "unrecorded"}])
@pytest.mark.parametrize("names", [["runs"], ["--all"]])
def test_cache_clear_keeps_a_folder_the_marker_does_not_record(tmp_path, monkeypatch, users, names):
    from click.testing import CliRunner

    from mechkit.cli.main import cli
    from mechkit.io.disk_cache import FOREIGN, finish_run_dir, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = run_folder(tmp_path, "finetune")
    put_files(folder, {f"finetune/{CKPT}": "w"})
    put_files(folder, users)
    assert [e.name for e in list_cache(tmp_path)] == [FOREIGN]  # not "1 run(s)"
    CliRunner().invoke(cli, ["cache", "clear", *names])
    assert {k: v for k, v in _files(folder).items() if k in users} == users
    finish_run_dir(folder)  # and a run's end agrees
    assert _files(folder) == users


def test_a_run_folder_of_only_its_recorded_scratch_is_still_cleared(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import clear_cache, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = run_folder(tmp_path, "finetune", "checkpoints")
    put_files(folder, {f"finetune/{CKPT}": "w", f"checkpoints/ft-{'a' * 16}/{CKPT}": "w", f"checkpoints/{TEMP}": "x"})
    assert [e.name for e in list_cache(tmp_path)][0] == "runs"
    clear_cache(["runs"], root=tmp_path)
    assert not folder.exists()


# --- F4: `cache clear` never deletes through a mount point -------------------------------------------------


@pytest.mark.parametrize("names", [["runs"], ["--all"], [f"runs/{KEY}"], [KEY]])
def test_cache_clear_never_deletes_through_a_bind_mount_in_arun_folder(tmp_path, monkeypatch, names):
    from click.testing import CliRunner

    from mechkit.cli.main import cli
    from mechkit.io.disk_cache import FOREIGN, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = run_folder(tmp_path, "finetune", "finetune2")
    put_files(folder, {f"finetune2/{CKPT}": "user's weights"})
    _fake_mounts(monkeypatch, tmp_path, folder / "finetune2")
    assert [e.name for e in list_cache(tmp_path)] == [FOREIGN]  # counted as not mechkit's
    result = CliRunner().invoke(cli, ["cache", "clear", *names])
    assert (folder / "finetune2" / CKPT).read_text() == "user's weights"
    assert not list((tmp_path / "runs").glob(".*"))  # not renamed aside either
    if names[0].startswith(("runs/", KEY)):
        assert result.exit_code == 2 and "mount point" in result.output, result.output


@pytest.mark.parametrize("group,entry", [("gguf", "model-0123456789abcdef"), ("toy", "induction-deadbeef")])
@pytest.mark.parametrize("named", [False, True])
def test_cache_clear_keeps_a_model_entry_with_a_mount_inside(tmp_path, monkeypatch, capsys, group, entry, named):
    from mechkit.io.disk_cache import clear_cache

    folder = tmp_path / group / entry
    put_files(folder, {"config.json": "{}", "model.safetensors": "w", "sub/model.safetensors": "user's"})
    _fake_mounts(monkeypatch, tmp_path, folder / "sub")
    if named:
        with pytest.raises(MechkitError, match="mount point"):
            clear_cache([f"{group}/{entry}"], root=tmp_path)
    else:
        clear_cache([], all_entries=True, root=tmp_path)
        assert "mount point" in capsys.readouterr().err
    assert (folder / "sub" / "model.safetensors").read_text() == "user's"


@pytest.mark.parametrize("aside", [f"runs/.{KEY}.old-999999-0a1b2c3d", ".runs.old-999999-0a1b2c3d"])
def test_a_set_aside_folder_holding_a_mount_is_no_leftover(tmp_path, monkeypatch, aside):
    from mechkit.io.disk_cache import LEFTOVERS, clear_cache, list_cache

    put_files(tmp_path / aside, {f"finetune2/{CKPT}": "user's weights"})
    (tmp_path / "runs").mkdir(exist_ok=True)
    _fake_mounts(monkeypatch, tmp_path, tmp_path / aside / "finetune2")
    assert LEFTOVERS not in [e.name for e in list_cache(tmp_path)]
    clear_cache([], all_entries=True, root=tmp_path)
    clear_cache([LEFTOVERS], root=tmp_path)
    assert (tmp_path / aside / "finetune2" / CKPT).read_text() == "user's weights"


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                                reason="bind mounts need root and mount(8); the logic is also tested without them")


@needs_root
def test_a_real_bind_mount_in_a_run_folder_survives_its_end_and_cache_clear(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import clear_cache, finish_run_dir

    folder = run_folder(tmp_path, "finetune")
    user = tmp_path / "userdir"
    put_files(user, {f"sub/{CKPT}": "user's", CKPT: "user's too"})
    (folder / "finetune").mkdir()
    if subprocess.run(["mount", "--bind", str(user), str(folder / "finetune")]).returncode:
        pytest.skip("mount --bind failed here")
    try:
        finish_run_dir(folder)
        clear_cache([], all_entries=True, root=tmp_path)
        clear_cache(["leftovers"], root=tmp_path)
    finally:
        subprocess.run(["umount", str(folder / "finetune")], check=True)
    assert _files(user) == {f"sub/{CKPT}": "user's", CKPT: "user's too"}


# --- F5/F6: what is not a plain file under a step's or the marker's name is never read, replaced or deleted --


def _finishes(fn, fifos: list[Path], seconds: float = 20) -> object:
    """``fn()``'s value, failing (not hanging) where it blocks on a FIFO: its other end is opened to free it."""
    box: dict = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # re-raised in the test's own thread
            box["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    for fifo in fifos:  # a reader or writer blocked in open() is released, so the test process ends
        for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags))
    thread.join(5)
    assert not hung, "blocked on a FIFO"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _ctx(resume: Path):
    from mechkit.plugin import RunContext

    log = io.StringIO()
    return RunContext(model=None, params={}, seed=0, console=Console(file=log, width=400), resume_dir=resume), log


@pytest.mark.parametrize("what", ["dir", "fifo", "symlink"])
def test_what_is_not_a_file_under_a_steps_name_is_left_alone(tmp_path, what):
    from mechkit.io.disk_cache import mark_run_dir

    resume = tmp_path / "runs" / KEY
    mark_run_dir(resume)
    ctx, log = _ctx(resume)
    path = ctx.step_path("first")
    if what == "dir":
        put_files(path, {"notes.txt": "mine"})
    elif what == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "target.json").write_text('{"key": "first", "value": 7}')
        path.symlink_to(tmp_path / "target.json")
    assert _finishes(lambda: ctx.step("first", lambda: 3), [path]) == 3
    lines = [line for line in log.getvalue().splitlines() if "warning" in line]
    assert len(lines) == 1 and str(path) in lines[0] and "left alone" in lines[0]
    if what == "dir":
        assert (path / "notes.txt").read_text() == "mine"
    elif what == "fifo":
        assert path.is_fifo()
    else:
        assert path.is_symlink() and (tmp_path / "target.json").read_text() == '{"key": "first", "value": 7}'


def test_a_fifo_marker_neither_hangs_a_run_nor_the_cache_commands(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import FOREIGN, finish_run_dir, list_cache, mark_run_dir, mark_scratch
    from mechkit.io.disk_cache import scratch_names as names

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    resume = tmp_path / "runs" / KEY
    resume.mkdir(parents=True)
    marker = resume / "mechkit-run.json"
    os.mkfifo(marker)
    with pytest.raises(OSError, match="FIFO"):
        _finishes(lambda: mark_run_dir(resume), [marker])
    with pytest.raises(OSError, match="FIFO"):
        _finishes(lambda: mark_scratch(resume, "finetune"), [marker])
    assert _finishes(lambda: names(resume), [marker]) == set()
    ctx, log = _ctx(resume)
    assert _finishes(lambda: ctx.step("first", lambda: 3), [marker]) == 3
    assert "cannot keep finished steps" in log.getvalue() and "FIFO" in log.getvalue()
    assert [e.name for e in _finishes(lambda: list_cache(tmp_path), [marker])] == [FOREIGN]
    assert _finishes(lambda: finish_run_dir(resume), [marker]) == [marker]
    assert marker.is_fifo()


# --- F10: a killed run's prepared folder in $TMPDIR is a leftover -------------------------------------------


def _tmpdir(tmp_path: Path, monkeypatch) -> Path:
    import tempfile

    where = tmp_path / "t"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def _prepared(where: Path, name: str, files: dict[str, str] | None = None) -> Path:
    folder = where / name
    put_files(folder, files or {"model.safetensors": "w" * 100, "config.json": "{}", ".mechkit-files": "[]"})
    return folder


@pytest.mark.parametrize("name", ["mechkit-pruned-999999-0a1b2c3d", "mechkit-pruned-999998-00000000"])
def test_a_killed_runs_prepared_folder_is_listed_and_cleared(tmp_path, monkeypatch, name):
    from mechkit.io.disk_cache import LEFTOVERS, clear_cache, list_cache

    where = _tmpdir(tmp_path, monkeypatch)
    folder = _prepared(where, name)
    lock = where / f".{name}.mechkit-lock"
    lock.write_text("999999\n")
    half = where / f".{name}.tmp-999999-0a1b2c3d"
    put_files(half, {"model.safetensors": "half"})
    cache = tmp_path / "cache"
    rows = {e.name: e for e in list_cache(cache)}
    assert LEFTOVERS in rows and "$TMPDIR" in rows[LEFTOVERS].source and rows[LEFTOVERS].size >= 100
    removed = clear_cache([LEFTOVERS], root=cache)
    assert removed and not folder.exists() and not lock.exists() and not half.exists()


def test_the_next_save_removes_a_killed_runs_prepared_folder_and_names_its_own(tmp_path, monkeypatch):
    from mechkit.pruning import study as study_mod

    where = _tmpdir(tmp_path, monkeypatch)
    dead = _prepared(where, "mechkit-pruned-999999-0a1b2c3d")
    old = _prepared(where, "mechkit-pruned-abc_12xy")  # tempfile.mkdtemp's name, from an older mechkit
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    monkeypatch.setattr(study_mod, "save_pruned", lambda pruned, out: Path(out))
    self = type("S", (), {"pruned": lambda self, row: None})()
    path = study_mod.PruneStudy.save(self, {})
    assert path.parent == where and path.name.startswith(f"mechkit-pruned-{os.getpid()}-")
    assert not dead.exists() and not old.exists()


def test_a_live_or_foreign_prepared_folder_is_never_removed(tmp_path, monkeypatch):
    import fcntl

    from mechkit.io.disk_cache import LEFTOVERS, clear_cache, list_cache
    from mechkit.io.leftovers import make_prepared_dir

    where = _tmpdir(tmp_path, monkeypatch)
    live = _prepared(where, f"mechkit-pruned-{os.getpid()}-0a1b2c3d")  # this process's
    held = _prepared(where, "mechkit-pruned-999999-11111111")  # its writer holds its lock (another pid namespace)
    lock = where / ".mechkit-pruned-999999-11111111.mechkit-lock"
    lock.write_text("1\n")
    users = _prepared(where, "mechkit-pruned-999999-22222222", {"model.safetensors": "w", "notes.txt": "mine"})
    young = _prepared(where, "mechkit-pruned-abc_12xy")  # no pid, less than a day old: maybe a live older mechkit
    other = _prepared(where, "mechkit-prunedX-999999-33333333")
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert LEFTOVERS not in [e.name for e in list_cache(tmp_path / "cache")]
        clear_cache([LEFTOVERS], root=tmp_path / "cache")
        made = make_prepared_dir()
    finally:
        os.close(fd)
    assert all(p.exists() for p in (live, held, lock, users, young, other, made))
    assert (users / "notes.txt").read_text() == "mine"


def test_a_killed_run_not_yet_reaped_is_no_live_run(tmp_path, monkeypatch):
    """A zombie (killed, its parent not yet waiting for it) holds no files and no locks: its folder is stale."""
    from mechkit.io.leftovers import stale_prepared

    where = _tmpdir(tmp_path, monkeypatch)
    child = subprocess.Popen(["true"])
    try:
        for _ in range(200):  # until it has exited, unreaped
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.05)
        folder = _prepared(where, f"mechkit-pruned-{child.pid}-0a1b2c3d")
        assert stale_prepared(where) == [folder]
    finally:
        child.wait()
