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


def test_nothing_is_removed_through_a_folder_that_changed_after_the_copy(tmp_path):
    from mechkit.report.writer import _Moves, _signature

    user = tmp_path / "user"
    user.mkdir()
    (user / "f").write_text("USER")
    src = tmp_path / "ret"
    (src / "a").mkdir(parents=True)
    (src / "a" / "f").write_text("USER")
    moves = _Moves()
    moves.folder(src)
    moves.folder(src / "a")
    moves.taken.append((src / "a" / "f", _signature(src / "a" / "f")))
    shutil.rmtree(src / "a")
    os.symlink(user, src / "a")
    moves.taken[0] = (src / "a" / "f", _signature(user / "f"))  # the very file, reached through the link
    moves.commit()
    assert (user / "f").read_text() == "USER"


def test_the_umask_mode_is_never_given_through_a_link_or_to_a_second_name(tmp_path):
    from mechkit.io.atomic import _umask_mode

    key = tmp_path / "key"
    key.write_text("PRIVATE")
    os.chmod(key, 0o600)
    (tmp_path / "link").symlink_to(key)
    os.link(key, tmp_path / "second")
    _umask_mode(tmp_path / "link", 0o644)  # a report file swapped for a link meanwhile
    _umask_mode(tmp_path / "second", 0o644)  # a hard link made meanwhile
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "plain").write_text("x")
    os.chmod(tmp_path / "plain", 0o600)
    _umask_mode(tmp_path / "plain", 0o644)
    assert oct((tmp_path / "plain").stat().st_mode & 0o777) == "0o644"
