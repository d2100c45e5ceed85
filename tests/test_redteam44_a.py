"""Red-team pass 44 (a), fixed.

F1/F2 (data loss, races): a run's end unlinked its checkpoints by full path, so its scratch folder swapped for a
link to a user's folder (no root needed), or a cover over the cache unmounted after the check, had the user's
files deleted. They are now reached from the run's folder by descriptors (``remove_beneath``). F3 (data loss,
race): a leftover's name that had become a bind mount of a user's folder was emptied by ``remove_tree``, which
took the mount it opened as its own; a mount point at the name is now left whole, and said. F4 (wrong fix): a
link a cover held at a hidden mount's name made the hidden mount look live ("unmount it first": "not mounted").
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import mechkit.io.disk_cache as dc
from mechkit.io.remove import remove_beneath
from tests.mounts import NEEDS_MOUNTS, in_namespace


def test_a_scratch_folder_swapped_for_a_link_at_a_runs_end_is_never_followed(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "checkpoint.safetensors").write_text("my own")
    run = tmp_path / "cache" / "runs" / ("a" * 16)
    (run / "finetune").mkdir(parents=True)
    (run / "finetune" / "checkpoint.safetensors").write_bytes(b"x")
    dc.mark_run_dir(run)
    dc.mark_scratch(run, "finetune")
    listed = dc.run_contents

    def then_swap(*args, **kwargs):
        found = listed(*args, **kwargs)
        os.rename(run / "finetune", tmp_path / "moved")
        os.symlink(user, run / "finetune")  # a thread, a sync tool: after the listing, before the removal
        return found

    monkeypatch.setattr(dc, "run_contents", then_swap)
    kept = dc.finish_run_dir(run)
    assert (user / "checkpoint.safetensors").read_text() == "my own"
    assert any(p.name == "checkpoint.safetensors" for p in kept)


def test_remove_beneath_removes_files_and_folders_and_refuses_a_way_out(tmp_path):
    (tmp_path / "r" / "a" / "b").mkdir(parents=True)
    (tmp_path / "r" / "a" / "f").write_text("1")
    (tmp_path / "r" / "a" / "b" / "g").write_text("2")
    assert remove_beneath(tmp_path / "r", "a/f") and not (tmp_path / "r" / "a" / "f").exists()
    assert remove_beneath(tmp_path / "r", "a/b") and not (tmp_path / "r" / "a" / "b").exists()
    assert remove_beneath(tmp_path / "r", "a/missing")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "f").write_text("keep")
    os.symlink(tmp_path / "mine", tmp_path / "r" / "link")
    assert not remove_beneath(tmp_path / "r", "link/f") and (tmp_path / "mine" / "f").read_text() == "keep"
    with pytest.raises(ValueError):
        remove_beneath(tmp_path / "r", "../mine/f")


@NEEDS_MOUNTS
def test_a_cover_unmounted_at_a_runs_end_never_lets_it_delete_through_the_mount_it_hid(tmp_path):
    said = in_namespace(tmp_path, '''
import mechkit.io.disk_cache as dc
user = B / "user"; user.mkdir(); (user / "checkpoint.safetensors").write_text("my own")
runs = B / "cache" / "runs"; run = runs / ("a" * 16); (run / "finetune").mkdir(parents=True)
mount("--bind", str(user), str(run / "finetune"))
mount("-t", "tmpfs", "cover", str(runs))
(run / "finetune").mkdir(parents=True); (run / "finetune" / "checkpoint.safetensors").write_bytes(b"x")
dc.mark_run_dir(run); dc.mark_scratch(run, "finetune")
listed = dc.run_contents
def then_unmount(*args, **kwargs):
    found = listed(*args, **kwargs); subprocess.run(["umount", "-l", str(runs)]); return found
dc.run_contents = then_unmount
dc.finish_run_dir(run)
print("USER", sorted(os.listdir(user)))
''')
    assert "USER ['checkpoint.safetensors']" in said, said


@NEEDS_MOUNTS
def test_a_leftovers_name_that_became_a_bind_mount_is_left_whole_and_said(tmp_path):
    said = in_namespace(tmp_path, '''
import mechkit.io.leftovers as lo
from mechkit.io.remove import remove_tree
user = B / "user"; user.mkdir(); (user / "thesis.txt").write_text("thesis")
(B / "mnt").mkdir(); mount("--bind", str(user), str(B / "mnt"))
print("DIRECT", remove_tree(B / "mnt"), sorted(os.listdir(user)))
g = B / "cache" / "gguf"; g.mkdir(parents=True); t = g / ".x.tmp-999999-deadbeef"; t.mkdir()
mount("--bind", str(user), str(t)); mount("-t", "tmpfs", "cover", str(g))
t.mkdir(); (t / "part").write_text("tmp")
checked = lo.mount_inside
def then_unmount(path, points=None):
    found = checked(path, points)
    if path == t:
        subprocess.run(["umount", "-l", str(g)])
    return found
lo.mount_inside = then_unmount
lo.clean_leftovers(g)
print("SWEPT", sorted(os.listdir(user)))
''')
    assert "DIRECT False ['thesis.txt']" in said and "SWEPT ['thesis.txt']" in said, said
    assert "kept" in said and "never deletes through a mount" in said, said


@NEEDS_MOUNTS
def test_a_link_at_a_hidden_mounts_name_never_makes_it_live(tmp_path):
    said = in_namespace(tmp_path, '''
from mechkit.io.read import mount_points
(B / "user").mkdir(); (B / "other").mkdir()
k = B / "cache" / "runs" / "k"; (k / "finetune").mkdir(parents=True)
mount("--bind", str(B / "user"), str(k / "finetune"))
mount("-t", "tmpfs", "cover", str(B / "cache" / "runs"))
k.mkdir(); os.symlink(B / "other", k / "finetune")
print("LIVE", str(k / "finetune") in mount_points())
''')
    assert "LIVE False" in said, said


def test_a_folder_swapped_for_a_link_after_the_writers_last_check_is_never_unlinked_through(tmp_path, monkeypatch):
    import mechkit as mk
    from mechkit.report import writer

    user = tmp_path / "user"
    user.mkdir()
    src = tmp_path / "ret"
    (src / "a").mkdir(parents=True)
    (src / "a" / "f").write_text("RETURNED")
    (user / "f").write_text("USER'S")
    real_stat, swapped = os.stat, []

    def swap_then_stat(name, *args, dir_fd=None, **kwargs):  # the commit's look at the entry, its folder pinned
        if dir_fd is not None and name == "f" and not swapped and os.readlink(f"/proc/self/fd/{dir_fd}") == str(
                src / "a"):
            os.rename(src / "a", tmp_path / "a_old")
            os.symlink(user, src / "a")
            swapped.append(True)
        return real_stat(name, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(writer.os, "stat", swap_then_stat)

    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt44a-commit", "0.1", "returns a folder", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"ret": src})

    mk.run(Returns, out=tmp_path / "out")
    monkeypatch.undo()
    assert swapped and (user / "f").read_text() == "USER'S"
    assert not (tmp_path / "a_old" / "f").exists()  # the copied file itself went, through its pinned folder
    assert (tmp_path / "out" / "ret" / "a" / "f").read_text() == "RETURNED"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None,
                    reason="an undeletable file needs root and chattr (+i), which this machine lacks")
def test_a_cache_entry_that_cannot_be_removed_is_said_as_kept_and_not_counted_freed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "cache" / "runs" / "0123456789abcdef"
    run.mkdir(parents=True)
    dc.mark_run_dir(run)
    (run / "0123456789abcdef.json").write_text("{}")
    stuck = run / "1123456789abcdef.json"
    stuck.write_text("{}")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode:
        pytest.skip("chattr +i is refused on this file system")
    try:
        removed = dc.clear_cache(["runs"])
    finally:
        for left in (tmp_path / "cache" / "runs").rglob("1123456789abcdef.json"):
            subprocess.run(["chattr", "-i", str(left)])
    said = capsys.readouterr().err
    assert "could not be removed" in said and "mount" not in said, said
    assert not removed or all(size == 0 for _, size in removed), removed
