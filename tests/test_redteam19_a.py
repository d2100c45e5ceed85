"""Red-team pass 19 (helper a): the ``--out`` checks compared real path strings, and a bind mount is a second
name for a directory that no symlink resolution reveals. Through one, ``--out`` went inside mechkit's cache
(then ``cache clear --all`` deleted the run), replaced a run's input (fine-tuned weights, a detect report, a
``-v`` vector) and wrote into the working directory — all refused under the direct spelling. A task-vector
``--out`` file that is itself a mount point was refused only after the work, naming a temporary path and a
directory's fix. And in Python, a full disk (or a file-size limit) reached ``mk.run`` and
``AttentionView.save`` callers as a raw ``OSError``, where the CLI printed one line (failures 1-3, 10, 11).

The bind-mount and tmpfs tests need root (CI runs as root) and skip with the reason otherwise; the
file-size-limit tests run anywhere.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io import atomic_file, check_out
from mechkit.io.fs_errors import describe
from tests.conftest import file_size_limit

ROOT = pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="a mount needs root on Linux")


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@contextlib.contextmanager
def mounted(*args: str):
    """``mount ARGS`` for the block (skips where mounting is not permitted), unmounted after."""
    point = args[-1]
    done = subprocess.run(["mount", *args], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield Path(point)
    finally:
        subprocess.run(["umount", point], check=False)


# --- failures 1-3: a bind mount is the same place ----------------------------------------------------------


@ROOT
def test_out_inside_the_cache_through_a_bind_mount_is_refused(tmp_path, monkeypatch):
    cache, alias = tmp_path / "cache", tmp_path / "C"
    (cache / "toy").mkdir(parents=True)
    alias.mkdir()
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    with mounted("--bind", str(cache), str(alias)):
        for out in (alias / "toy" / "induction-deadbeef", alias / "toy", alias / "new" / "deeper" / "run"):
            with pytest.raises(MechkitError, match="inside mechkit's cache"):
                check_out(out, force=True)
            with pytest.raises(MechkitError, match="inside mechkit's cache"):
                check_out(out / "v.safetensors", force=True, kind="file")
        with pytest.raises(MechkitError, match="inside mechkit's cache"):
            mk.run("inspect", model="tiny:llama", out=str(alias / "toy" / "induction-deadbeef"))
    assert not (cache / "toy" / "induction-deadbeef").exists()


@ROOT
def test_out_holding_the_cache_through_a_bind_mount_is_refused(tmp_path, monkeypatch):
    home, alias = tmp_path / "home", tmp_path / "alias"
    (home / "sub" / "cache").mkdir(parents=True)
    alias.mkdir()
    monkeypatch.setenv("MECHKIT_CACHE", str(home / "sub" / "cache"))
    with mounted("--bind", str(home), str(alias)), pytest.raises(MechkitError, match="holds mechkit's cache"):
        check_out(alias / "sub", force=True)


@ROOT
def test_out_that_is_or_holds_an_input_through_a_bind_mount_is_refused(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    (a / "ft2").mkdir(parents=True)
    (a / "ft2" / "model.safetensors").write_bytes(b"weights")
    (a / "sub").mkdir()
    (a / "sub" / "v.safetensors").write_bytes(b"vector")
    (a / "d").mkdir()
    (a / "d" / "report.json").write_text("{}")
    b.mkdir()
    with mounted("--bind", str(a), str(b)):
        cases = [(b / "ft2", a / "ft2", "is the input"),  # finetune --model A/ft2 --out B/ft2 --force
                 (a / "d", b / "d", "is the input"),  # attention --from B/d --out A/d --force
                 (b / "sub", a / "sub" / "v.safetensors", "holds the input"),  # taskvec apply -v A/sub/v
                 (b / "sub", a / "sub", "is the input")]
        for out, source, said in cases:
            with pytest.raises(MechkitError, match=said):
                check_out(out, force=True, inputs=(source,))
        with pytest.raises(MechkitError, match="inside the input"):  # --force would replace its weights
            check_out(b / "ft2" / "model.safetensors", force=True, kind="file", inputs=(a / "ft2",))
        assert check_out(b / "other", force=True, inputs=(a / "ft2",)) == b / "other"  # a sibling is fine
    assert (a / "ft2" / "model.safetensors").read_bytes() == b"weights"


@ROOT
def test_a_run_is_refused_over_its_own_input_through_a_bind_mount(tmp_path, llama):
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    mk.run("attention", model=llama, out=str(a / "d"))
    before = (a / "d" / "report.json").read_bytes()
    with mounted("--bind", str(a), str(b)), pytest.raises(MechkitError, match="the input"):
        mk.run("attention", model=llama, out=str(a / "d"), force=True, from_report=str(b / "d"))
    assert (a / "d" / "report.json").read_bytes() == before


@ROOT
def test_the_working_directory_through_a_bind_mount_is_refused(tmp_path, monkeypatch):
    a, b = tmp_path / "A", tmp_path / "B"
    (a / "sub").mkdir(parents=True)
    (a / "sub" / "notes.txt").write_text("mine")
    b.mkdir()
    monkeypatch.chdir(a / "sub")
    with mounted("--bind", str(a), str(b)):
        with pytest.raises(MechkitError, match="is the working directory"):
            check_out(b / "sub", force=True)
        with pytest.raises(MechkitError, match="working directory"):
            mk.run("inspect", model="tiny:llama", out=str(b / "sub"), force=True)
    assert (a / "sub" / "notes.txt").read_text() == "mine"


def test_unrelated_directories_are_not_the_same_place(tmp_path, monkeypatch):
    """No mount: identity adds no refusal for distinct directories (only a bind mount shares one)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "x").mkdir(parents=True)
    (tmp_path / "b" / "x" / "f").write_text("y")
    monkeypatch.chdir(tmp_path / "a")
    assert check_out(tmp_path / "b" / "x", force=True, inputs=(tmp_path / "a",)) == tmp_path / "b" / "x"


# --- failure 10: a file --out that is a mount point --------------------------------------------------------


@ROOT
def test_a_file_out_that_is_a_mount_point_is_refused_before_the_work(tmp_path):
    data, vf = tmp_path / "ufile", tmp_path / "vf.safetensors"
    data.write_text("userdata\n")
    vf.touch()
    with mounted("--bind", str(data), str(vf)):
        with pytest.raises(MechkitError, match="mount") as err:
            check_out(vf, force=True, kind="file")
        assert str(vf) in str(err.value) and "inside" not in err.value.fix and "--out" in err.value.fix
        with pytest.raises(OSError) as late, atomic_file(vf) as tmp:  # the last resort, at the rename
            tmp.write_bytes(b"vector")
        line = describe(late.value)
        assert line is not None and str(vf) in str(line) and ".tmp-" not in str(line)
        assert "MOUNT/run" not in line.fix and "file name" in line.fix
    assert data.read_text() == "userdata\n"


def test_a_mount_error_on_a_file_gives_a_file_fix(tmp_path):
    target = tmp_path / "vf.safetensors"
    target.write_bytes(b"x")
    for code in (errno.EBUSY, errno.EXDEV):
        line = describe(OSError(code, os.strerror(code), str(target)))
        assert str(target) in str(line) and "MOUNT/run" not in line.fix and "file name" in line.fix
        line = describe(OSError(code, os.strerror(code), str(tmp_path)))  # a directory: its fix stays
        assert "inside the mount" in line.fix


# --- failure 11: a full disk in Python is one MechkitError -------------------------------------------------


def test_mk_run_on_a_file_size_limit_raises_the_cli_line(tmp_path, llama):
    out = tmp_path / "run"
    with file_size_limit(2048), pytest.raises(MechkitError) as err:
        mk.run("inspect", model=llama, out=str(out))
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.EFBIG
    assert str(out) in str(err.value) and "file-size limit" in str(err.value)
    assert not out.exists()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    cli = subprocess.run(["bash", "-c", f'ulimit -f 2; exec "{sys.executable}" -m mechkit.cli.main inspect '
                          f'--model tiny:llama --out "{out}"'], capture_output=True, text=True, env=env)
    assert cli.returncode == 2
    assert cli.stderr.strip().splitlines()[-1] == f"mechkit: error: {err.value}"


def test_attention_view_save_on_a_file_size_limit_is_one_line(tmp_path, llama):
    view = mk.show_attention(llama, "hello world", heads="0.0")
    for target in (tmp_path / "att.html", tmp_path / "page.html"):
        with file_size_limit(512), pytest.raises(MechkitError, match="file-size limit") as err:
            view.save(target)
        assert isinstance(err.value.__cause__, OSError) and str(target) in str(err.value)
        assert not target.exists() and list(tmp_path.iterdir()) == []


@ROOT
def test_a_full_tmpfs_is_one_line_in_python(tmp_path, llama):
    disk = tmp_path / "full"
    disk.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)):
        (disk / "filler").write_bytes(b"\0" * 4096 * 3)
        with pytest.raises(MechkitError, match="no space left") as err:
            mk.run("inspect", model=llama, out=str(disk / "run"))
        assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.ENOSPC
        view = mk.show_attention(llama, "hello world", heads="0.0")
        with pytest.raises(MechkitError, match="no space left"):
            view.save(disk / "att.html")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
