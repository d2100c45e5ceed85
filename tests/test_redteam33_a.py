"""Red-team pass 33 (a): what it found, fixed.

F1: a ``--force`` rerun deleted a user's empty folder, link to a folder, or folder holding only a link inside a
returned folder (its list named files only). F2: the public ``write_report`` moved the working directory, the
home directory and mechkit's cache into a report (only ``mk.run`` refused them). F3: a plugin returning the
run's own ``--model`` folder had it moved into the report. F4: ``write_report`` took no lock. F5–F7: it wrote an
int as NUL bytes, took ``force="no"`` as true, and raised raw errors for wrong types.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import put_files, returning_files


@pytest.mark.parametrize("made", ["empty folder", "link to a folder", "folder holding a link"])
def test_a_users_folder_entry_inside_a_returned_folder_is_refused_not_deleted(tmp_path, made):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/x.txt": "1", "a.txt": "1"})}, "rt33a"), out=out)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "d.csv").write_text("p")
    entry = out / "m" / "sub" / "mine"
    if made == "empty folder":
        entry.mkdir()
    elif made == "link to a folder":
        os.symlink(tmp_path / "precious", entry)
    else:
        entry.mkdir()
        os.symlink(tmp_path / "precious", entry / "l")
    with pytest.raises(MechkitError, match="which mechkit did not write, inside a subfolder"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", {"sub/x.txt": "2"})}, "rt33a"), out=out, force=True)
    assert os.path.lexists(entry) and (tmp_path / "precious" / "d.csv").read_text() == "p"


def test_a_users_top_level_folder_in_a_returned_folder_stays_with_what_it_holds(tmp_path):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"a.txt": "1"})}, "rt33a"), out=out)
    put_files(out / "m" / "top", {"notes/n.md": "mine"})
    mk.run(returning_files({"m": put_files(tmp_path / "g", {"a.txt": "2"})}, "rt33a"), out=out, force=True)
    assert (out / "m" / "top" / "notes" / "n.md").read_text() == "mine" and (out / "m" / "a.txt").read_text() == "2"


def _report():
    from mechkit.report import build_report

    return build_report(plugin="p", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                        results={"s": 1}, artifacts=[], timings={})


@pytest.mark.parametrize("place", ["cwd", "home", "cache", "tmp"])
def test_write_report_refuses_the_places_mk_run_refuses(tmp_path, monkeypatch, place):
    import tempfile

    from mechkit.report import write_report

    where = put_files(tmp_path / "place", {"keep.txt": "k"})
    if place == "cwd":
        monkeypatch.chdir(where)
    elif place == "home":
        monkeypatch.setenv("HOME", str(where))
    elif place == "cache":
        monkeypatch.setenv("MECHKIT_CACHE", str(where))
    else:
        monkeypatch.setattr(tempfile, "tempdir", str(where))
    with pytest.raises(MechkitError, match="moving it into the report would destroy it"):
        write_report(tmp_path / "o", _report(), files={"c": where})
    assert (where / "keep.txt").read_text() == "k" and not (tmp_path / "o").exists()


def test_a_plugin_returning_the_runs_own_model_folder_is_refused(tmp_path):
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path / "md")
    byte_tokenizer().save_pretrained(tmp_path / "md")

    class Returns(mk.Plugin):
        name, version, summary = "rt33a-model", "0.1", "x"

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"model": Path(ctx.model.source)})

    with pytest.raises(MechkitError, match="an input of the run"):
        mk.run(Returns, model=str(tmp_path / "md"), out=tmp_path / "out")
    assert (tmp_path / "md" / "config.json").is_file()


LOCKED = textwrap.dedent("""
    import sys
    from pathlib import Path
    from mechkit.report import build_report, write_report
    rep = build_report(plugin="second", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                       results={"s": 1}, artifacts=[], timings={})
    try:
        write_report(Path(sys.argv[1]), rep, force=True)
        print("WROTE")
    except Exception as err:
        print("REFUSED", err)
""")


def test_write_report_takes_the_lock_a_run_holds(tmp_path):
    from mechkit.io.outlock import out_lock
    from mechkit.report import write_report

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with out_lock(out):
        write_report(out, _report())  # this process holds it: written
        done = subprocess.run([sys.executable, "-c", LOCKED, str(out)], capture_output=True, text=True, env=env,
                              timeout=120)
    assert done.stdout.startswith("REFUSED") and "in use by another mechkit run" in done.stdout
    assert '"plugin": "p"' in (out / "report.json").read_text()


@pytest.mark.parametrize("call", [
    lambda w, o, r: w(o, r, files={"a": 3}),
    lambda w, o, r: w(o, r, force="no"),
    lambda w, o, r: w(o, r, figures={"a": "x"}),
    lambda w, o, r: w(o, r, figures=["x"]),
    lambda w, o, r: w(o, r, tables=[1]),
    lambda w, o, r: w(o, [1]),
    lambda w, o, r: w(3, r),
])
def test_write_report_refuses_wrong_types_in_one_line(tmp_path, call):
    from mechkit.report import write_report

    with pytest.raises(MechkitError) as err:
        call(write_report, tmp_path / "o", _report())
    assert "\n" not in str(err.value) and not (tmp_path / "o").exists()
