"""Red-team pass 50, fixed.

F1 (data loss): a set with more entries than a journal held (about 2,000 long names) had its journal written
without them, and its roll-back then deleted what the killed write moved in, a user's file put inside with it.
A journal now holds 16 MiB, and a set too large even for that is marked so: its roll-back deletes nothing it
moved in, and says what to move aside.
"""

from __future__ import annotations

import json

import pytest

import mechkit.io.journal as journal
from mechkit.errors import MechkitError
from mechkit.io.journal import TOO_MANY, journal_path, journal_text, recover
from tests.killed_write import killed_write


def test_a_set_too_large_to_list_is_marked_so(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    for i in range(20):
        (tmp_path / "model" / f"{'x' * 50}{i}.txt").write_text("n")
    assert json.loads(journal_text(tmp_path, ["model"], []))["entries"]["model"] == ["folder"]
    monkeypatch.setattr(journal, "JOURNAL_LIMIT", 1000)
    assert json.loads(journal_text(tmp_path, ["model"], []))["entries"] == TOO_MANY


def test_a_roll_back_of_a_set_too_large_to_list_deletes_nothing_it_moved_in(tmp_path):
    out = killed_write(tmp_path, "after-model")
    record = json.loads(journal_path(out).read_text())
    journal_path(out).write_text(json.dumps({**record, "entries": TOO_MANY}))  # as a 20,000-file set's is
    (out / "model" / "my_notes.txt").write_text("precious")
    with pytest.raises(MechkitError, match="too many for its journal to list") as err:
        recover(out)
    assert (out / "model" / "my_notes.txt").read_text() == "precious"
    assert err.value.fix == f"move those out of {out} (keep what is yours), then rerun"
    (tmp_path / "aside").mkdir()
    for name in ("model", "a.txt"):  # the fix, as said
        (out / name).rename(tmp_path / "aside" / name)
    assert recover(out) and (out / "a.txt").read_text() == "1" and (out / "model" / "config.json").read_text() == "{}"
