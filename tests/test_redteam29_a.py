"""Red-team pass 29 (a): what pass 28's check of a returned ``Path`` still let through, fixed.

F1: a file bind-mounted inside a returned folder (the user's 0600 key) was moved into the report as a live
mount and chmod'ed 0644. F2: a returned file that is itself a bind mount was refused only by the writer, after
the work, naming ``--out``. F3: a report written into an existing ``--out`` (empty, or ``--force``) was never
synced and its returned files kept their modes (a new ``--out`` got both). F4: a returned folder holding a
folder it cannot list was copied in part across file systems, reported whole, and its source half-deleted.
Minor: a prepared folder made by ``mkdtemp`` stayed 0700 inside the report.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import PluginError
from tests.conftest import returning_files

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                                reason="bind mounts need root and mount(8); the logic is also tested without them")


def _fake_mounts(monkeypatch, tmp_path: Path, *points: Path) -> None:
    """Make mechkit see bind mounts at ``points`` (a file's too: same disk, ``os.path.ismount`` says no)."""
    import mechkit.io.read as read_mod

    info = tmp_path / "mountinfo"
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    lines += [f"{40 + i} 22 8:1 /home/u/f{i} {os.path.realpath(p)} rw - ext4 /dev/sda1 rw" for i, p in enumerate(points)]
    info.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(info))


def _refused(files, tmp_path) -> str:
    with pytest.raises(PluginError) as err:
        mk.run(returning_files(files, "rt29a"), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    return str(err.value)


def _key(tmp_path: Path) -> Path:
    key = tmp_path / "id_rsa"
    key.write_text("SECRET")
    os.chmod(key, 0o600)
    return key


# --- F1 / F2: a file that is a mount point ----------------------------------------------------------------------


def test_a_file_mount_inside_a_returned_folder_is_refused(tmp_path, monkeypatch):
    prep = tmp_path / "prep"
    prep.mkdir()
    (prep / "w.bin").write_bytes(b"x")
    (prep / "key").write_text("")
    _fake_mounts(monkeypatch, tmp_path, prep / "key")
    said = _refused({"model": prep}, tmp_path)
    assert f"which holds {prep / 'key'}, which is a mount point" in said


def test_a_returned_file_that_is_a_mount_point_is_refused_naming_it_not_out(tmp_path, monkeypatch):
    f = tmp_path / "prep_file"
    f.write_text("")
    _fake_mounts(monkeypatch, tmp_path, f)
    said = _refused({"k.bin": f}, tmp_path)
    assert f"the path {f}, which is a mount point" in said and "--out" not in said


@needs_root
@pytest.mark.parametrize("inside", [True, False])
def test_a_real_file_bind_mount_is_refused_before_the_writer_and_the_key_keeps_its_mode(tmp_path, inside):
    key = _key(tmp_path)
    prep = tmp_path / "prep"
    prep.mkdir()
    target = prep / "key" if inside else tmp_path / "prep_file"
    target.write_text("")
    if subprocess.run(["mount", "--bind", str(key), str(target)]).returncode:
        pytest.skip("mount --bind failed here")
    try:
        said = _refused({"model": prep} if inside else {"k.bin": target}, tmp_path)
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert "which is a mount point" in said
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and key.read_text() == "SECRET"


def test_the_writer_never_chmods_a_file_behind_a_mount(tmp_path, monkeypatch):
    from mechkit.io import atomic, read

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mounted").write_text("theirs")
    os.chmod(tmp_path / "d" / "mounted", 0o600)
    real = read.fd_mount_id  # the file's own mount as the kernel would show a file bind-mounted over the name
    monkeypatch.setattr(read, "fd_mount_id", lambda fd: -1 if os.readlink(f"/proc/self/fd/{fd}").endswith(
        "/mounted") else real(fd))
    atomic.umask_modes(tmp_path / "d")
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "mounted").st_mode) == 0o600


# --- F3: an existing --out gets modes and syncs as a new one does -------------------------------------------------


@pytest.mark.parametrize("existing", ["empty", "force"])
def test_a_report_into_an_existing_out_is_synced_and_given_the_umasks_modes(tmp_path, monkeypatch, existing):
    from mechkit.io.atomic import file_mode

    out = tmp_path / "out"
    out.mkdir()
    if existing == "force":
        mk.run(returning_files({"note.txt": "old"}, "rt29a"), out=out)
    prep = tmp_path / "prep"
    prep.mkdir()
    (prep / "w.safetensors").write_bytes(b"w")
    os.chmod(prep / "w.safetensors", 0o600)
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    mk.run(returning_files({"model": prep}, "rt29a"), out=out, force=existing == "force")
    assert stat.S_IMODE(os.stat(out / "model" / "w.safetensors").st_mode) == file_mode()
    names = {Path(p).name for p in synced}
    assert {"report.json", "report.html", "w.safetensors"} <= names, sorted(names)
    assert str(out) in synced  # the folder whose entries the renames changed


def test_a_prepared_mkdtemp_folder_gets_a_new_folders_mode_in_the_report(tmp_path):
    import tempfile

    from mechkit.io.atomic import dir_mode

    prep = Path(tempfile.mkdtemp(dir=tmp_path))
    (prep / "sub").mkdir(mode=0o700)
    (prep / "sub" / "w.bin").write_bytes(b"w")
    run = mk.run(returning_files({"model": prep}, "rt29a"), out=tmp_path / "out")
    for folder in (run.out_dir / "model", run.out_dir / "model" / "sub"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == dir_mode()


# --- F4: a folder that cannot be listed -------------------------------------------------------------------------

CHECK = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from mechkit.io.returned import odd_entry
    from mechkit.report.writer import _tree
    t = Path(sys.argv[1])
    print(odd_entry(t))
    try:
        _tree(t)
        print("TREE-OK")
    except PermissionError:
        print("TREE-RAISED")
""")


def test_a_folder_that_cannot_be_listed_is_refused_and_never_copied_in_part(tmp_path):
    prep = tmp_path / "prep"
    (prep / "sub").mkdir(parents=True)
    (prep / "w.bin").write_bytes(b"x")
    (prep / "sub" / "inner.bin").write_bytes(b"data")
    os.chmod(prep / "sub", 0o311)
    os.chmod(tmp_path, 0o755)
    command = [sys.executable, "-c", CHECK, str(prep)]
    if os.geteuid() == 0:  # root reads any folder: drop the capability that lets it
        if not shutil.which("setpriv"):
            pytest.skip("as root, an unreadable folder needs setpriv(1) to drop CAP_DAC_*")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
                   "-dac_override,-dac_read_search", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.chmod(prep / "sub", 0o755)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()[-2:]
    assert "a folder that cannot be read" in first and "sub" in first
    assert second == "TREE-RAISED"
