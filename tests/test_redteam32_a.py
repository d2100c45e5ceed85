"""Red-team pass 32 (a): what it found in returned folders and the public writer, fixed.

F1: a ``--force`` rerun deleted a user's note in a subfolder of a returned folder (its list named the top level
only, and the subfolder went whole). F2: a returned folder already holding a ``.mechkit-files`` (a user's file of
that name, or a copied list of another set) was trusted: the runs mixed and the user's file was overwritten.
F3: a name with a backslash inside a returned folder was listed but never counted as the run's: it stayed
beside the next run's files. F4: ``mechkit.report.write_report`` called directly skipped the checks ``mk.run``
makes: a FIFO was a raw OSError, a folder holding the report folder copied the report's temporary folder into
itself, and a path that never existed was told to "run it again".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import put_files, returning_files


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*")
            if p.is_file() and p.name != ".mechkit-files"}



@pytest.mark.parametrize("second", [{"sub/x.txt": "x2"}, {"a.txt": "a2"}])
@pytest.mark.parametrize("note", ["sub/NOTES.md", "sub/mydir/data.csv"])
def test_a_users_file_in_a_subfolder_of_a_returned_folder_is_never_deleted(tmp_path, second, note):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/x.txt": "x1"})}, "rt32a"), out=out)
    (out / "m" / note).parent.mkdir(parents=True, exist_ok=True)
    (out / "m" / note).write_text("my thesis")
    with pytest.raises(MechkitError, match="which mechkit did not write, inside a subfolder"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", second)}, "rt32a"), out=out, force=True)
    assert (out / "m" / note).read_text() == "my thesis" and (out / "m" / "sub" / "x.txt").read_text() == "x1"


def test_a_top_level_note_stays_and_the_old_runs_subfolder_goes(tmp_path):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/x.txt": "x1", "a.txt": "a1"})}, "rt32a"), out=out)
    (out / "m" / "NOTES.md").write_text("mine")
    mk.run(returning_files({"m": put_files(tmp_path / "g", {"a.txt": "a2"})}, "rt32a"), out=out, force=True)
    assert _tree(out / "m") == {"a.txt": "a2", "NOTES.md": "mine"}


@pytest.mark.parametrize("content", ["MY NOTES", '{"writer": "prune", "files": ["a.txt"]}'])
def test_a_returned_folder_holding_a_list_of_its_own_is_refused_and_kept(tmp_path, content):
    f = put_files(tmp_path / "f", {"a.txt": "run1", ".mechkit-files": content})
    with pytest.raises(MechkitError, match="a file named .mechkit-files"):
        mk.run(returning_files({"m": f}, "rt32a"), out=tmp_path / "out")
    assert (f / ".mechkit-files").read_text() == content and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["w\\old", "bad\udcffname"])
def test_a_name_the_folders_list_cannot_hold_is_refused(tmp_path, name):
    f = put_files(tmp_path / "f", {"a.txt": "1"})
    try:
        (f / name).write_text("run1 only")
    except (UnicodeEncodeError, OSError):
        pytest.skip("this file system takes no such name")
    with pytest.raises(MechkitError, match="which the report's list of the folder cannot hold"):
        mk.run(returning_files({"m": f}, "rt32a"), out=tmp_path / "out")


def _report():
    from mechkit.report import build_report

    return build_report(plugin="probe", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                        results={"s": 1}, artifacts=[], timings={})


def test_write_report_refuses_a_fifo_in_one_line(tmp_path):
    from mechkit.report import write_report

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(MechkitError, match="which is a FIFO"):
        write_report(tmp_path / "o1", _report(), files={"f": tmp_path / "fifo"})
    assert not (tmp_path / "o1").exists()


def test_write_report_refuses_a_folder_holding_the_reportput_files(tmp_path):
    from mechkit.report import write_report

    h = put_files(tmp_path / "hold", {"a.txt": "A"})
    with pytest.raises(MechkitError, match="which holds the report folder"):
        write_report(h / "out", _report(), files={"m": h})
    assert (h / "a.txt").read_text() == "A" and not (h / "out").exists()


def test_write_report_names_a_path_that_never_existed(tmp_path):
    from mechkit.report import write_report

    with pytest.raises(MechkitError) as err:
        write_report(tmp_path / "o5", _report(), files={"l": tmp_path / "nope"})
    assert "which is missing" in str(err.value) and "run it again" not in str(err.value)


def test_a_rewrite_that_restores_the_mtime_is_not_removed_after_the_commit(tmp_path, monkeypatch):
    import mechkit.io.atomic as atomic

    mine = tmp_path / "mine.txt"
    mine.write_text("v1")
    real = atomic._rename_dir

    def rewrite(tmp, target, replace):  # cp -p over it: same size, mtime put back, ctime moves
        st = mine.stat()
        with open(mine, "r+") as f:
            f.write("v2")
        os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns))
        return real(tmp, target, replace)

    monkeypatch.setattr(atomic, "_rename_dir", rewrite)
    run = mk.run(returning_files({"n": mine}, "rt32a"), out=tmp_path / "out")
    assert mine.read_text() == "v2" and (run.out_dir / "n").read_text() == "v1"
