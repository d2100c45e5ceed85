"""Red-team pass 31 (a): what it found in the report writer, fixed.

F1: a user's returned path, hard-linked into the report (pass 30), was removed whole after the commit, taking
what the user wrote or replaced there meanwhile. F2: a kill between the commit and that removal left the report's
file one inode with the user's (a later edit of theirs changed the report). Both: a user's path is now copied,
and of its source only what was copied, unchanged since, is removed. F3: a ``--force`` rerun of a plugin returning
a folder kept the first run's files beside the second's, and refused its own subfolder: a returned folder now
lists its files. F4: with no ``--out``, ``$TMPDIR`` inside the cache was refused only after the work, naming a
prepared folder as ``--out``. F5: finetune, which prepares nothing in ``$TMPDIR``, was refused for it. F6: an
artifact or figure name that is no text, holds a NUL or a lone surrogate was a raw exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import returning_files

# --- F1 / F2 ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_what_the_user_writes_into_a_returned_path_during_the_write_is_kept(tmp_path, monkeypatch, kind):
    import mechkit.io.atomic as atomic

    mine = tmp_path / "mine"
    if kind == "folder":
        mine.mkdir()
        (mine / "a.txt").write_text("A-old")
    else:
        mine.write_text("v1")
    real = atomic._rename_dir

    def racing(tmp, target, replace):  # the user writes while the report is synced and renamed in
        if kind == "folder":
            (mine / "new.txt").write_text("written meanwhile")
            (mine / ".a.swp").write_text("A-new")
            os.replace(mine / ".a.swp", mine / "a.txt")
        else:
            (tmp_path / "swap").write_text("v2")
            os.replace(tmp_path / "swap", mine)  # an editor's save by rename
        return real(tmp, target, replace)

    monkeypatch.setattr(atomic, "_rename_dir", racing)
    run = mk.run(returning_files({"m": mine}, "rt31a"), out=tmp_path / "out")
    if kind == "folder":
        assert (mine / "new.txt").read_text() == "written meanwhile" and (mine / "a.txt").read_text() == "A-new"
        assert (run.out_dir / "m" / "a.txt").read_text() == "A-old"
    else:
        assert mine.read_text() == "v2" and (run.out_dir / "m").read_text() == "v1"


def test_an_unchanged_returned_folder_is_gone_after_the_commit(tmp_path):
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "w.bin").write_bytes(b"w")
    run = mk.run(returning_files({"m": mine}, "rt31a"), out=tmp_path / "out")
    assert not mine.exists() and (run.out_dir / "m" / "sub" / "w.bin").read_bytes() == b"w"


KILL_BEFORE_COMMIT = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import mechkit as mk
    import mechkit.report.writer as writer
    from tests.conftest import returning_files
    writer._Moves.commit = lambda self: os.kill(os.getpid(), 9)
    mk.run(returning_files({"notes.txt": Path(sys.argv[1])}, "rt31a"), out=Path(sys.argv[2]))
""")


def test_a_kill_after_the_report_is_in_place_leaves_two_independent_copies(tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("my thesis")
    os.chmod(mine, 0o600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", KILL_BEFORE_COMMIT, str(mine), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, cwd=str(Path(__file__).parent.parent), timeout=300)
    assert done.returncode == -9, done.stderr
    copy = tmp_path / "out" / "notes.txt"
    assert mine.read_text() == "my thesis" and copy.read_text() == "my thesis"
    assert not os.path.samefile(mine, copy) and copy.stat().st_nlink == 1 and (mine.stat().st_mode & 0o777) == 0o600
    with open(mine, "a") as f:
        f.write(" + edit")
    assert copy.read_text() == "my thesis"
    again = mk.run(returning_files({"notes.txt": mine}, "rt31a"), out=tmp_path / "out", force=True)
    assert (again.out_dir / "notes.txt").read_text() == "my thesis + edit"


# --- F3 -------------------------------------------------------------------------------------------------------------


def _folder(path: Path, tag: str, sub: bool = False, extra: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / "a.txt").write_text(f"a@{tag}")
    if sub:
        (path / "sub").mkdir()
        (path / "sub" / "b.txt").write_text(f"b@{tag}")
    if extra:
        (path / "old_only.txt").write_text(f"old@{tag}")
    return path


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*")
            if p.is_file() and p.name != ".mechkit-files"}


@pytest.mark.parametrize("sub", [False, True])
def test_a_force_rerun_replaces_a_returned_folder_as_a_set(tmp_path, sub):
    out = tmp_path / "out"
    mk.run(returning_files({"folder": _folder(tmp_path / "f1", "run1", sub, extra=True)}, "rt31a"), out=out)
    mk.run(returning_files({"folder": _folder(tmp_path / "f2", "run2", sub)}, "rt31a"), out=out, force=True)
    expected = {"a.txt": "a@run2", **({"sub/b.txt": "b@run2"} if sub else {})}
    assert _files(out / "folder") == expected


def test_a_users_note_in_a_returned_folder_stays_and_the_old_runs_files_go(tmp_path):
    out = tmp_path / "out"
    mk.run(returning_files({"folder": _folder(tmp_path / "f1", "run1", extra=True)}, "rt31a"), out=out)
    (out / "folder" / "NOTES.md").write_text("mine")
    mk.run(returning_files({"folder": _folder(tmp_path / "f2", "run2")}, "rt31a"), out=out, force=True)
    assert _files(out / "folder") == {"a.txt": "a@run2", "NOTES.md": "mine"}


# --- F4 / F5 -------------------------------------------------------------------------------------------------------


def test_tmpdir_inside_the_cache_is_refused_before_the_load_with_no_out(tmp_path, monkeypatch):
    import mechkit.model.loading as loading

    inside = tmp_path / "cache" / "t"
    inside.mkdir(parents=True)
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(inside))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(MechkitError) as err:
        mk.run("prune", model="tiny:llama", save_model=True)
    assert "the temporary directory TMPDIR" in str(err.value) and "inside mechkit's cache" in str(err.value)
    assert "--out" not in str(err.value).split(" — ")[0]


def test_only_a_plugin_that_prepares_in_tmpdir_is_refused_for_it():
    from mechkit.registry import get

    prune, finetune = get("prune"), get("finetune")
    assert set(prune.writes({"save_model": True})) & set(prune.prepared)
    assert not set(finetune.writes({})) & set(finetune.prepared)


def test_a_plugin_that_saves_files_but_prepares_none_runs_with_tmpdir_inside_the_cache(tmp_path, monkeypatch):
    inside = tmp_path / "cache" / "t"
    inside.mkdir(parents=True)
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(inside))

    class Saves(mk.Plugin):
        name, version, summary, needs_model = "rt31a-saves", "0.1", "s", False

        @classmethod
        def writes(cls, params):
            return ("config.json",)

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"config.json": "{}"})

    run = mk.run(Saves, out=tmp_path / "out")
    assert (run.out_dir / "config.json").read_text() == "{}"


# --- F6 -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [1, "a\x00b", "a\udcffb.txt", None])
@pytest.mark.parametrize("where", ["files", "figures"])
def test_an_artifact_name_that_is_no_file_name_is_one_line(tmp_path, key, where):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    class Names(mk.Plugin):
        name, version, summary, needs_model = "rt31a-names", "0.1", "n", False

        def run(self, ctx):
            value = {key: Figure()} if where == "figures" else {key: b"x"}
            return mk.Result(results={"a": 1}, **{where: value})

    with pytest.raises(MechkitError) as err:
        mk.run(Names, out=tmp_path / "out")
    assert "\n" not in str(err.value) and "is not a file name" in str(err.value)
    assert not (tmp_path / "out").exists()
