"""Red-team pass 39 (a): a folder of a user's returned tree swapped for a link to another folder of the user's
while the report was written (a plugin's thread, a sync tool) made the copy, then the removal after the commit,
reach the user's files through it: one was copied into the report and deleted from its own folder. Each copied
file's folders are now checked against what was copied, and nothing is removed through a folder that changed."""

from __future__ import annotations

import os
import shutil

import pytest

import mechkit as mk
from mechkit.errors import MechkitError


def test_a_folder_swapped_for_a_link_while_it_is_copied_is_refused_and_nothing_is_removed(tmp_path, monkeypatch):
    from mechkit.report import writer

    user = tmp_path / "user" / "a"
    user.mkdir(parents=True)
    (user / "zzz").write_text("USER PRECIOUS")
    src = tmp_path / "ret"
    (src / "a").mkdir(parents=True)
    (src / "a" / "aaa").write_text("first")
    (src / "a" / "zzz").write_text("plugin's own")
    real_copy = shutil.copy2
    swapped: list = []

    def copy_then_swap(path, target, **kwargs):
        if not swapped and os.path.basename(path) == "zzz":  # after its checks, as its bytes are read
            os.rename(src / "a", tmp_path / "a_old")
            os.symlink(user, src / "a")
            swapped.append(True)
        return real_copy(path, target, **kwargs)

    monkeypatch.setattr(writer.shutil, "copy2", copy_then_swap)

    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt39a-swap", "0.1", "returns a folder", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"ret": src})

    with pytest.raises(MechkitError, match="changed while"):
        mk.run(Returns, out=tmp_path / "out")
    assert swapped and (user / "zzz").read_text() == "USER PRECIOUS"
    assert not (tmp_path / "out").exists()


def test_nothing_is_removed_through_a_folder_that_changed_after_the_copy(tmp_path, monkeypatch):
    import mechkit.report.writer as writer

    user = tmp_path / "user"
    user.mkdir()
    src = tmp_path / "ret"
    (src / "a").mkdir(parents=True)
    (src / "a" / "f").write_text("RETURNED")
    commit = writer._Moves.commit

    def swap_then_commit(moves):  # the report is in place; the returned tree's folder is swapped before removal
        os.rename(src / "a", user / "a")
        os.symlink(user / "a", src / "a")
        commit(moves)

    monkeypatch.setattr(writer._Moves, "commit", swap_then_commit)

    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt39a-commit", "0.1", "returns a folder", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"ret": src})

    mk.run(Returns, out=tmp_path / "out")
    assert (user / "a" / "f").read_text() == "RETURNED"  # the very file copied, reached through the link: kept
    assert (tmp_path / "out" / "ret" / "a" / "f").read_text() == "RETURNED"


def test_the_umask_mode_is_never_given_through_a_link_or_to_a_second_name(tmp_path):
    from mechkit.io.atomic import umask_modes

    key = tmp_path / "key"
    key.write_text("PRIVATE")
    os.chmod(key, 0o600)
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "link").symlink_to(key)
    os.link(key, folder / "second")
    (folder / "plain").write_text("x")
    os.chmod(folder / "plain", 0o600)
    umask_modes(folder)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert (folder / "plain").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
