"""Red-team pass 48, fixed.

F1 (silently wrong): loading ``OUT/model`` after a ``--force`` write of ``OUT`` was killed read the killed write's
uncommitted model: the roll-back before a read looked for a journal beside the folder read only, and ``OUT``'s
sits beside ``OUT``. The folders above are asked too. F3 (data loss): a file or link the user put, after the kill,
at a name the killed write had moved in was deleted by the roll-back; the journal now records each entry's inode,
and a roll-back refuses, touching nothing, where a name holds another entry.
"""

from __future__ import annotations

import os

import pytest

from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, recover
from mechkit.io.outlock import settle_interrupted
from tests.killed_write import killed_write


def test_reading_a_folder_inside_a_half_installed_set_rolls_the_set_back_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = killed_write(tmp_path, "after-model")
    assert (out / "model" / "config.json").read_text() == '{"new": 1}'  # the killed write's, uncommitted
    settle_interrupted(out / "model")  # what mk.load_model(OUT/model) does first
    assert (out / "model" / "config.json").read_text() == "{}" and (out / "a.txt").read_text() == "1"
    assert not journal_path(out).exists()


@pytest.mark.parametrize("put", ["file", "link", "folder"])
def test_an_entry_the_user_put_at_a_moved_in_name_is_never_rolled_back(tmp_path, put):
    out = killed_write(tmp_path, "after-model")
    target = tmp_path / "mine.png"
    target.write_text("my figure")
    (out / "a.txt").unlink()  # the killed write's a.txt, moved in: the user replaces it
    if put == "file":
        (out / "a.txt").write_text("my own")
    elif put == "link":
        (out / "a.txt").symlink_to(target)
    else:
        (out / "a.txt").mkdir()
    with pytest.raises(MechkitError, match="which that write did not put there"):
        recover(out)
    assert os.path.lexists(out / "a.txt") and target.read_text() == "my figure" and journal_path(out).exists()
    if put == "file":
        assert (out / "a.txt").read_text() == "my own"


def test_the_same_folder_renamed_away_and_back_still_rolls_back(tmp_path):
    out = killed_write(tmp_path, "after-model")
    os.rename(out / "model", tmp_path / "elsewhere")
    os.rename(tmp_path / "elsewhere", out / "model")  # the very entry the write moved in
    assert recover(out) and (out / "model" / "config.json").read_text() == "{}"
