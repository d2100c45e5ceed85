"""Red-team pass 28 (a): a plugin's returned ``Path`` wrecked what was not the plugin's, fixed.

F1: a folder past the 100 000-entry walk bound passed unchecked; a FIFO past it hung the report's fsync and a
link past it was moved in. F2: a hard link to the user's private key in a returned folder was chmod'ed 0644.
F3: a bind mount inside a returned folder was moved in live and chmod'ed through. F4: the home directory
reached through a bind mount of its parent passed (resolved paths differ) and was moved into the report, then
deleted. F5: a returned mount point was refused only by the writer, after the work, naming ``--out``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import PluginError
from tests.conftest import returning_files

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                                reason="bind mounts need root and mount(8); the logic is also tested without them")


def _refused(files, tmp_path) -> str:
    with pytest.raises(PluginError) as err:
        mk.run(returning_files(files, "rt28a"), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    return str(err.value)


def _fake_mounts(monkeypatch, tmp_path: Path, *points: Path) -> None:
    """Make mechkit see bind mounts at ``points`` (same disk: ``os.path.ismount`` says no)."""
    import mechkit.io.read as read_mod

    info = tmp_path / "mountinfo"
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    lines += [f"{40 + i} 22 8:1 /home/u/d{i} {os.path.realpath(p)} rw - ext4 /dev/sda1 rw" for i, p in enumerate(points)]
    info.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(info))


def _bind(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "--bind", str(source), str(target)]).returncode:
        pytest.skip("mount --bind failed here")


# --- F1: the walk bound ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("past", ["fifo", "link", "nothing"])
def test_a_folder_past_the_walk_bound_is_refused_not_checked_in_part(tmp_path, monkeypatch, past):
    import mechkit.io.returned as returned

    monkeypatch.setattr(returned, "WALK_LIMIT", 20)
    prep = tmp_path / "prep"
    (prep / "b").mkdir(parents=True)
    for i in range(21):
        (prep / "b" / f"f{i}").write_text("x")
    if past == "fifo":
        os.mkfifo(prep / "b" / "zz-fifo")
    elif past == "link":
        os.symlink("/", prep / "b" / "zz-link")
    said = _refused({"m": prep}, tmp_path)
    assert "a folder holding more than 20 entries, too many to check" in said or (  # found before the bound
        past != "nothing" and f"which holds {prep / 'b' / ('zz-' + past)}, which is a" in said), said
    assert len(list((prep / "b").iterdir())) == 21 + (past != "nothing")  # left where it was


def test_a_folder_within_the_bound_moves_in(tmp_path, monkeypatch):
    import mechkit.io.returned as returned

    monkeypatch.setattr(returned, "WALK_LIMIT", 20)
    prep = tmp_path / "prep"
    (prep / "b").mkdir(parents=True)
    for i in range(19):
        (prep / "b" / f"f{i}").write_text(str(i))
    run = mk.run(returning_files({"m": prep}, "rt28a"), out=tmp_path / "out")
    assert sorted(p.name for p in (run.out_dir / "m" / "b").iterdir()) == sorted(f"f{i}" for i in range(19))


def test_the_reports_fsync_never_blocks_on_a_fifo(tmp_path):
    from mechkit.io.atomic import umask_modes

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "w.bin").write_bytes(b"w")
    os.mkfifo(tmp_path / "d" / "fifo")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (umask_modes(tmp_path / "d", fsync=True), done.set()), daemon=True)
    worker.start()
    worker.join(20)
    if not done.is_set():  # free it, then fail
        os.close(os.open(tmp_path / "d" / "fifo", os.O_WRONLY | os.O_NONBLOCK))
    assert done.is_set()


# --- F2: hard links ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("returned", ["folder", "file"])
def test_a_hard_link_to_a_users_file_is_refused_and_the_file_keeps_its_mode(tmp_path, monkeypatch, returned):
    home = tmp_path / "home"
    home.mkdir()
    key = home / "id_rsa"
    key.write_text("KEY")
    os.chmod(key, 0o600)
    prep = tmp_path / "prep"
    prep.mkdir()
    os.link(key, prep / "model.bin")
    monkeypatch.setattr(os, "umask", os.umask)  # the run's umask is the process's
    said = _refused({"m": prep if returned == "folder" else prep / "model.bin"}, tmp_path)
    assert "1 other hard link(s), another name of the same data" in said
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and key.read_text() == "KEY"
    assert (prep / "model.bin").exists()


def test_the_writer_never_chmods_a_hard_linked_file(tmp_path):
    from mechkit.io.atomic import umask_modes

    (tmp_path / "d").mkdir()
    key = tmp_path / "key"
    key.write_text("KEY")
    os.chmod(key, 0o600)
    os.link(key, tmp_path / "d" / "w.bin")
    (tmp_path / "d" / "own.bin").write_text("mine")
    os.chmod(tmp_path / "d" / "own.bin", 0o600)
    umask_modes(tmp_path / "d")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "own.bin").st_mode) != 0o600  # its own file: given the umask's


# --- F3 / F5: mount points ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [".", "h", "a/b/h"])
def test_a_returned_folder_that_is_or_holds_a_mount_point_is_refused_before_the_writer(tmp_path, monkeypatch, where):
    prep = tmp_path / "prep"
    (prep / where).mkdir(parents=True, exist_ok=True)
    (prep / where / "thesis.txt").write_text("precious")
    _fake_mounts(monkeypatch, tmp_path, prep / where)
    said = _refused({"m": prep}, tmp_path)
    assert "which is a mount point" in said and "--out" not in said.split(":")[0]
    assert (prep / where / "thesis.txt").read_text() == "precious"


@needs_root
def test_a_real_bind_mount_of_home_inside_a_returned_folder_is_refused_and_home_untouched(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    key = home / "id_rsa"
    key.write_text("KEY")
    os.chmod(key, 0o600)
    monkeypatch.setenv("HOME", str(home))
    prep = tmp_path / "prep"
    _bind(home, prep / "h")
    try:
        said = _refused({"m": prep}, tmp_path)
    finally:
        subprocess.run(["umount", str(prep / "h")], check=True)
    assert "which is a mount point" in said
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


@needs_root
def test_a_returned_mount_point_is_refused_before_the_work_ends_naming_the_path(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.txt").write_text("precious")
    _bind(user, tmp_path / "alias")
    try:
        said = _refused({"m": tmp_path / "alias"}, tmp_path)
    finally:
        subprocess.run(["umount", str(tmp_path / "alias")], check=True)
    assert f"the path {tmp_path / 'alias'}, which is a mount point" in said
    assert (user / "thesis.txt").read_text() == "precious"


# --- F4: identity, not resolved paths ---------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("returned,what", [("alias/home", "is your home directory"),
                                           ("alias", "holds your home directory"),
                                           ("alias/work", "is the working directory")])
def test_home_or_cwd_reached_through_a_bind_alias_is_refused_and_kept(tmp_path, monkeypatch, returned, what):
    real = tmp_path / "real"
    (real / "home").mkdir(parents=True)
    (real / "work").mkdir()
    (real / "home" / "thesis.txt").write_text("precious")
    monkeypatch.setenv("HOME", str(real / "home"))
    monkeypatch.chdir(real / "work")
    _bind(real, tmp_path / "alias")
    try:
        said = _refused({"m": tmp_path / returned}, tmp_path)
    finally:
        subprocess.run(["umount", str(tmp_path / "alias")], check=True)
    assert what in said or (returned == "alias" and "holds" in said), said  # it holds the cache and cwd too
    assert (real / "home" / "thesis.txt").read_text() == "precious"


@needs_root
def test_out_reached_through_a_bind_alias_is_refused(tmp_path):
    real = tmp_path / "real"
    (real / "out").mkdir(parents=True)
    _bind(real, tmp_path / "alias")
    try:
        with pytest.raises(PluginError) as err:
            mk.run(returning_files({"m": tmp_path / "alias" / "out"}, "rt28a"), out=real / "out")
    finally:
        subprocess.run(["umount", str(tmp_path / "alias")], check=True)
    assert "is the report folder --out" in str(err.value)


def test_relation_sees_one_folder_under_two_names_by_device_and_inode(tmp_path, monkeypatch):
    from mechkit.io import returned

    (tmp_path / "a" / "home").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    same = {str(tmp_path / "b"): os.stat(tmp_path / "a")}  # what a bind mount of a at b shows
    real_stat = os.stat
    monkeypatch.setattr(returned.os, "stat", lambda p, *a, **k: same.get(str(p)) or real_stat(p, *a, **k))
    assert returned.relation(tmp_path / "b", tmp_path / "a") == "is"
    assert returned.relation(tmp_path / "b", tmp_path / "a" / "home") == "holds"
    assert returned.relation(tmp_path / "a" / "home", tmp_path / "b") == "is inside"
    assert returned.relation(tmp_path / "a" / "home", tmp_path / "c") is None
    assert returned.relation(tmp_path / "b", tmp_path / "a" / "home" / "not-yet") == "holds"
