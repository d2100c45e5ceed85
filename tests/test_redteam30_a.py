"""Red-team pass 30 (a): a plugin's returned paths and the report writer, fixed.

F1: a user's own path a plugin returned was moved into the report's temporary folder (or copied across file
systems, its source removed at once) and lost with that folder when the write then failed (a full disk, a
name too long, Ctrl-C, the final rename). F2: a returned path inside another returned one. F3: an artifact
name longer than the file system allows was refused only when written. F4: ``$TMPDIR`` inside ``--out`` or
the cache was refused after the work. F5: a returned folder holding a file it cannot read. F6: a file whose
device differs from its folder's (overlayfs, xino=off) was called a mount point.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from tests.conftest import returning_files


def _user_file(tmp_path: Path, name: str = "notes.txt") -> Path:
    path = tmp_path / "mine" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("my thesis")
    return path


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mine" / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("A")
    (folder / "sub" / "b.txt").write_text("B")
    return folder


def _intact(path: Path) -> bool:
    if path.is_dir():
        return (path / "a.txt").read_text() == "A" and (path / "sub" / "b.txt").read_text() == "B"
    return path.read_text() == "my thesis"


# --- F1: a user's path survives any failure of the write ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_name_too_long_beside_a_users_path_refuses_first_and_keeps_it(tmp_path, kind):
    mine = _user_file(tmp_path) if kind == "file" else _user_folder(tmp_path)
    with pytest.raises(MechkitError, match="n{20}.*bytes long"):
        mk.run(returning_files({"all": mine, "n" * 300: b"1"}, "rt30a"), out=tmp_path / "out")
    assert _intact(mine)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_full_disk_while_rendering_keeps_a_users_path(tmp_path, monkeypatch, kind):
    import mechkit.report.writer as writer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "render_html", full)
    mine = _user_file(tmp_path) if kind == "file" else _user_folder(tmp_path)
    with pytest.raises(Exception, match="(?i)no space left"):
        mk.run(returning_files({"notes": mine, "big.bin": b"x" * 1024}, "rt30a"), out=tmp_path / "out")
    assert _intact(mine)


@pytest.mark.parametrize("error", [OSError(errno.EIO, "I/O error"), KeyboardInterrupt()])
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_failed_final_rename_into_a_new_out_puts_a_users_path_back(tmp_path, monkeypatch, kind, error):
    import mechkit.io.atomic as atomic

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(atomic, "_rename_dir", fail)
    mine = _user_file(tmp_path) if kind == "file" else _user_folder(tmp_path)
    with pytest.raises(type(error)):
        mk.run(returning_files({"notes": mine}, "rt30a"), out=tmp_path / "out")
    assert _intact(mine)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_failed_install_into_an_existing_out_puts_a_users_path_back(tmp_path, monkeypatch, kind):
    out = tmp_path / "out"
    mk.run(returning_files({"old.txt": "old"}, "rt30a"), out=out)
    before = (out / "report.json").read_text()
    real_replace, failed = os.replace, []

    def replace(src, dst, *args, **kwargs):  # the key file, moved in last, fails once: the user's path is in --out
        if Path(dst) == out / "report.json" and not failed:
            failed.append(1)
            raise OSError(errno.EIO, "I/O error", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    mine = _user_file(tmp_path) if kind == "file" else _user_folder(tmp_path)
    with pytest.raises(OSError):
        mk.run(returning_files({"notes": mine}, "rt30a"), out=out, force=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert failed and _intact(mine)
    assert not (out / "notes").exists() and (out / "report.json").read_text() == before


def test_a_failure_setting_the_previous_set_aside_keeps_both_it_and_a_users_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    previous = tmp_path / "prev"
    previous.mkdir()
    (previous / "w.bin").write_text("previous model")
    mk.run(returning_files({"model": previous}, "rt30a"), out=out)
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):  # the previous model cannot be set aside: the write rolls back
        if Path(src) == out / "model":
            raise OSError(errno.EIO, "I/O error", str(src))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    mine = _user_folder(tmp_path)
    with pytest.raises(OSError):
        mk.run(returning_files({"model": mine}, "rt30a"), out=out, force=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert _intact(mine)
    assert (out / "model" / "w.bin").read_text() == "previous model" and (out / "report.json").is_file()


def _other_fs(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's folder")
    return Path(tempfile.mkdtemp(dir=shm))


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_users_path_copied_across_file_systems_is_removed_only_after_the_commit(tmp_path, monkeypatch, kind):
    import mechkit.io.atomic as atomic

    where = _other_fs(tmp_path)
    try:
        mine = _user_file(where) if kind == "file" else _user_folder(where)

        def fail(*args, **kwargs):
            raise OSError(errno.EIO, "I/O error")

        with monkeypatch.context() as patch:
            patch.setattr(atomic, "_rename_dir", fail)
            with pytest.raises(OSError):
                mk.run(returning_files({"notes": mine}, "rt30a"), out=tmp_path / "out")
        assert _intact(mine)  # the failed write left the source: the copy went with the temporary folder
        run = mk.run(returning_files({"notes": mine}, "rt30a"), out=tmp_path / "out2")
        assert _intact(run.out_dir / "notes") and not os.path.lexists(mine)  # moved in: the source goes after
    finally:
        shutil.rmtree(where, ignore_errors=True)


# --- F2: a returned path inside another -------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["outer-first", "inner-first"])
def test_a_returned_path_inside_another_is_refused_before_anything_moves(tmp_path, order):
    mine = _user_folder(tmp_path)
    pairs = [("all", mine), ("part", mine / "sub")]
    files = dict(pairs if order == "outer-first" else pairs[::-1])
    with pytest.raises(PluginError, match=r"files\['all'\].*holds files\['part'\]"):
        mk.run(returning_files(files, "rt30a"), out=tmp_path / "out")
    assert _intact(mine)
    assert not (tmp_path / "out").exists()


def test_a_returned_file_inside_a_returned_folder_is_refused(tmp_path):
    mine = _user_folder(tmp_path)
    with pytest.raises(PluginError, match="holds"):
        mk.run(returning_files({"all": mine, "b.txt": mine / "sub" / "b.txt"}, "rt30a"), out=tmp_path / "out")
    assert _intact(mine)


# --- F3: an artifact name too long for the file system ----------------------------------------------------------


@pytest.mark.parametrize("name", ["n" * 256, "é" * 128, "f" * 300 + ".bin"])
def test_an_artifact_name_too_long_is_refused_before_anything_naming_it(tmp_path, name):
    from mechkit.report.writer import write_report

    out = tmp_path / "out"
    with pytest.raises(MechkitError) as err:
        write_report(out, {"plugin": "x", "results": {}}, files={name: b"1"})
    assert "artifact name" in str(err.value) and name[:20] in str(err.value) and "--out" not in str(err.value)
    assert not out.exists()


def test_a_figure_name_too_long_is_refused_before_the_run_writes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from mechkit.report.writer import write_report

    with pytest.raises(MechkitError, match="artifact name"):
        write_report(tmp_path / "out", {"plugin": "x", "results": {}}, figures={"h" * 260: Figure()})
    assert not (tmp_path / "out").exists()


# --- F4: $TMPDIR inside --out or the cache ----------------------------------------------------------------------


def _saving_plugin(calls: list):
    class SavesModel(mk.Plugin):
        name = "rt30a-saves"
        version = "0.1"
        summary = "saves a model"
        needs_model = False
        prepared = ("model",)  # prepared in $TMPDIR (pass 31: only such a run is refused for it)

        def run(self, ctx):
            calls.append(1)
            return mk.Result(results={"a": 1})

        @classmethod
        def writes(cls, params):
            return ("model",)

    return SavesModel


@pytest.mark.parametrize("where", ["out", "inside-out", "cache"])
def test_tmpdir_inside_out_or_the_cache_is_refused_before_the_work(tmp_path, monkeypatch, where):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    out = tmp_path / "out"
    tmp = {"out": out, "inside-out": out / "t", "cache": cache / "t"}[where]
    tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    calls: list = []
    with pytest.raises(MechkitError) as err:
        mk.run(_saving_plugin(calls), out=out, force=True)
    assert "TMPDIR" in str(err.value) and "point TMPDIR" in str(err.value) and not calls
    assert not isinstance(err.value, PluginError)
    mk.run(returning_files({"a.txt": "a"}, "rt30a"), out=out, force=True)  # saves nothing there: not refused
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mk.run(_saving_plugin(calls), out=tmp_path / "out2")  # TMPDIR elsewhere: runs
    assert calls




# --- F5: a file that cannot be read -----------------------------------------------------------------------------

CHECK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from mechkit.io.returned import odd_entry
    print(odd_entry(Path(sys.argv[1])))
""")


@pytest.mark.parametrize("what", ["inside", "itself"])
def test_a_file_that_cannot_be_read_is_refused_naming_it(tmp_path, what):
    prep = tmp_path / "prep"
    (prep / "sub").mkdir(parents=True)
    (prep / "w.bin").write_bytes(b"x")
    secret = prep / "sub" / "secret.bin"
    secret.write_bytes(b"data")
    os.chmod(secret, 0)
    os.chmod(tmp_path, 0o755)
    command = [sys.executable, "-c", CHECK, str(prep if what == "inside" else secret)]
    if os.geteuid() == 0:  # root reads any file: drop the capability that lets it
        if not shutil.which("setpriv"):
            pytest.skip("as root, an unreadable file needs setpriv(1) to drop CAP_DAC_*")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
                   "-dac_override,-dac_read_search", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.chmod(secret, 0o644)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "a file that cannot be read" in line and "secret.bin" in line


# --- F6: a file's own device is not a mount point ---------------------------------------------------------------


def _other_device_files(monkeypatch, under: Path) -> None:
    """Make every regular file under ``under`` report another device than its folder (overlayfs, xino=off)."""
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        info = real_lstat(path, *args, **kwargs)
        if stat.S_ISREG(info.st_mode) and str(os.fspath(path)).startswith(str(under)):
            values = list(info[:10])
            values[2] = info.st_dev + 1
            return os.stat_result(values)
        return info

    monkeypatch.setattr(os, "lstat", lstat)


def test_a_file_on_another_device_number_than_its_folder_is_not_a_mount_point(tmp_path, monkeypatch):
    from mechkit.io.returned import odd_entry

    prep = tmp_path / "prep"
    (prep / "sub").mkdir(parents=True)
    (prep / "w.bin").write_bytes(b"x")
    (prep / "sub" / "v.bin").write_bytes(b"y")
    _other_device_files(monkeypatch, prep)
    assert odd_entry(prep) is None
    assert odd_entry(prep / "w.bin") is None


def test_the_chmod_and_sync_still_reach_a_file_on_another_device_number(tmp_path, monkeypatch):
    from mechkit.io.atomic import file_mode, umask_modes

    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    for path in (folder / "w.bin", folder / "sub" / "v.bin"):
        path.write_bytes(b"x")
        os.chmod(path, 0o600)
    _other_device_files(monkeypatch, folder)
    umask_modes(folder, fsync=True)
    for path in (folder / "w.bin", folder / "sub" / "v.bin"):
        assert stat.S_IMODE(os.stat(path).st_mode) == file_mode()
