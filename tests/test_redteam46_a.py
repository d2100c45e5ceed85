"""Red-team pass 46 (a), fixed.

F1 (data loss): the roll-back of a ``--force`` write killed half-way deleted, by full path with
``shutil.rmtree``, each name the killed write had moved in: a file the user then put inside its half-installed
folder went with it, and so did a user's folder bind-mounted there. The journal now records what each folder it
installs holds; a roll-back refuses, touching nothing, where a folder holds anything else, and removes the rest
by descriptors on its own mount only. F2 (wrong fix, silently wrong): ``cache clear`` stopped at a cache entry it
could not rename aside (an immutable folder) with "change its permissions", which an immutable flag ignores; the
entries removed before it went unsaid and those after it untried. It is now kept and said with its cause, and
the clear goes on. Also: a killed run's lock of a folder inside an ``--out`` no longer stays after a ``--force``
rewrite of that ``--out``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess

import pytest
from rich.console import Console

import mechkit as mk
import mechkit.io.disk_cache as dc
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, recover
from tests.killed_write import killed_write
from tests.mounts import NEEDS_MOUNTS, in_namespace


def _killed(tmp_path, old_journal=False):
    return killed_write(tmp_path, "after-model", old_journal=old_journal)


def test_a_killed_write_still_rolls_back_whole(tmp_path):
    out = _killed(tmp_path)
    assert (out / "model" / "config.json").read_text() == '{"new": 1}'  # the killed write's, half-installed
    assert recover(out)
    assert (out / "a.txt").read_text() == "1" and (out / "model" / "config.json").read_text() == "{}"
    assert not journal_path(out).exists() and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("where", ["model/NOTES.md", "model/sub/deep.txt"])
def test_a_file_put_in_a_half_installed_folder_is_never_rolled_back_with_it(tmp_path, where):
    out = _killed(tmp_path)
    (out / where).parent.mkdir(exist_ok=True)
    (out / where).write_text("mine")
    log = io.StringIO()
    with pytest.raises(MechkitError, match="which that write did not put there") as err:
        mk.run("inspect", model="tiny:llama", out=out, force=True, console=Console(file=log))
    assert (out / where).read_text() == "mine" and journal_path(out).exists()  # nothing touched
    assert f"move {'those' if '/sub/' in where else 'it'} out of {out}" in err.value.fix
    shutil.move(str(out / where.split("/")[0] / where.split("/")[1]), tmp_path / "kept")  # the fix, as said
    assert recover(out) and (out / "a.txt").read_text() == "1" and (out / "model" / "config.json").read_text() == "{}"


def test_a_file_put_where_a_folder_was_moved_in_is_the_users(tmp_path):
    out = _killed(tmp_path)
    shutil.rmtree(out / "model")
    (out / "model").write_text("my model notes")
    with pytest.raises(MechkitError, match="now a file, which that write did not put there"):
        recover(out)
    assert (out / "model").read_text() == "my model notes"


@NEEDS_MOUNTS
@pytest.mark.parametrize("old_journal", [False, True])
def test_a_folder_bind_mounted_in_a_half_installed_folder_is_never_emptied(tmp_path, old_journal):
    _killed(tmp_path, old_journal=old_journal)
    said = in_namespace(tmp_path, '''
from mechkit.errors import MechkitError
from mechkit.io.journal import recover
user = B / "user"; user.mkdir(); (user / "keep.txt").write_text("precious")
out = B / "out"; (out / "model" / "sub").mkdir(); mount("--bind", str(user), str(out / "model" / "sub"))
try:
    recover(out); print("ROLLED BACK")
except MechkitError as err:
    print("REFUSED", err)
print("USER", sorted(os.listdir(user)))
''')
    assert "REFUSED" in said and "USER ['keep.txt']" in said, said
    assert ("which that write did not put there" if not old_journal else "holds a mount point") in said, said
    assert (tmp_path / "user" / "keep.txt").read_text() == "precious"


NEEDS_CHATTR = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None,
                                  reason="an immutable folder needs root and chattr (+i), which this machine lacks")


def _immutable(path, on=True):
    done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    if on and done.returncode:
        pytest.skip("chattr +i is refused on this file system")


def _runs(tmp_path, keys):
    for key in keys:
        run = tmp_path / "cache" / "runs" / key
        run.mkdir(parents=True)
        dc.mark_run_dir(run)
        (run / f"{key}.json").write_text("{}" * 50)
    return tmp_path / "cache" / "runs"


@NEEDS_CHATTR
def test_an_entry_that_cannot_be_moved_aside_is_kept_and_said_and_the_others_go(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    runs = _runs(tmp_path, ["0" * 16, "1" * 16, "f" * 16])
    _immutable(runs / ("1" * 16))
    try:
        removed = dc.clear_cache(["runs"])
    finally:
        _immutable(runs / ("1" * 16), on=False)
    said = capsys.readouterr().err
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) == ["1" * 16]
    assert f"kept {runs / ('1' * 16)}: it could not be removed" in said and "chattr -i" in said, said
    (name, freed), = removed
    assert name == "runs" and freed >= 2 * 100, removed  # the two removed, counted; the kept one not


@NEEDS_CHATTR
def test_an_immutable_group_keeps_every_entry_said_and_the_clear_exits_cleanly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    runs = _runs(tmp_path, ["0" * 16, "1" * 16])
    _immutable(runs)
    try:
        removed = dc.clear_cache(all_entries=True)
    finally:
        _immutable(runs, on=False)
    said = capsys.readouterr().err
    assert said.count("it could not be removed") == 2 and "immutable" in said, said
    assert all(size == 0 for _, size in removed), removed
    assert len([p for p in runs.iterdir() if not p.name.startswith(".")]) == 2
    dc.clear_cache(all_entries=True)  # the flag cleared, as said: the clear finishes
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]


def test_a_killed_runs_lock_of_a_folder_inside_goes_with_a_force_rewrite(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    mk.run("inspect", model="tiny:llama", out=out, console=Console(file=io.StringIO()))
    dead = out / ".model.mechkit-lock"
    dead.write_text("999999\n")  # a killed run writing --out out/model: nobody holds its flock
    mine = out / ".notes.mechkit-lock.txt"
    mine.write_text("not a lock")
    mk.run("inspect", model="tiny:llama", out=out, force=True, console=Console(file=io.StringIO()))
    assert not dead.exists() and mine.read_text() == "not a lock"
