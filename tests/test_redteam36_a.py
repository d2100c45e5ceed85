"""Red-team pass 35's open items, fixed by class (36 a).

A report value no report can hold (a container holding itself, one nested past ``MAX_DEPTH``, an object of no
JSON form) was a RecursionError or TypeError traceback from ``mk.run`` and ``write_report``; it is one line
naming its key path. A report past the size every reader takes was written, then refused by ``report show``;
the writer refuses it. The lock "held here" was per process, so ``write_report`` from a second thread wrote
into an ``--out`` another thread's run held. A user's file where mechkit's top-level folder was in ``--out``
was deleted by a ``--force`` rerun. ``write_report`` failed with tracebacks on an ``out`` holding a NUL, on
duck-typed tables and in a deleted working directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.report import build_report, write_report
from mechkit.report.schema import MAX_DEPTH, UnstorableError, to_jsonable
from tests.conftest import put_files, returning_files


def _results_plugin(results, name="rt36a"):
    class ReturnsResults(mk.Plugin):
        version = "0.1"
        summary = "returns results"
        needs_model = False

        def run(self, ctx):
            return mk.Result(results=results() if callable(results) else results)

    ReturnsResults.name = name
    return ReturnsResults


def _loop():
    d = {"a": [1, 2]}
    d["a"].append(d)
    return d


def _deep(n):
    d: list = []
    for _ in range(n):
        d = [d]
    return {"d": d}


class _Self:
    def tolist(self):
        return self


@pytest.mark.parametrize(("results", "said"), [
    (_loop, "report value results.a[2] holds itself"),
    (lambda: _deep(100_000), "is nested more than 100 containers deep"),
    (lambda: {"x": object()}, "report value results.x is of type object"),
    (lambda: {"t": _Self()}, "report value results.t could not be read"),  # its tolist() gives itself back
    (lambda: {object(): 1}, "has a key that is of type object"),
])
def test_a_result_no_report_can_hold_is_one_line_naming_its_path(tmp_path, results, said):
    with pytest.raises(MechkitError) as info:
        mk.run(_results_plugin(results), out=tmp_path / "o")
    assert said in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "o").exists()


def test_write_report_refuses_a_report_that_holds_itself(tmp_path):
    rep = build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={"s": 1},
                       artifacts=[], timings={})
    rep["results"]["me"] = rep
    with pytest.raises(UnstorableError, match="report value results.me holds itself"):
        write_report(tmp_path / "o", rep)
    assert not (tmp_path / "o").exists()


def test_the_depth_limit_keeps_what_a_run_stores_and_is_a_type_error_still():
    ok = _deep(MAX_DEPTH - 3)
    assert to_jsonable(ok) == ok
    with pytest.raises(TypeError):  # what callers catching the old refusal still catch
        to_jsonable({"x": object()})
    assert to_jsonable({(3, 1): {1, 2}, None: b"x"}) == {"3.1": [1, 2], "None": "x"}


def test_a_report_past_the_readers_limit_is_refused_before_anything_is_written(tmp_path):
    from mechkit.report.schema import MAX_REPORT_BYTES

    big = "x" * (MAX_REPORT_BYTES + 10)
    with pytest.raises(MechkitError, match=r"report.json would be \d+ MB, more than a report's limit of 32 MB "
                                           r"\(its largest part is 'results'\)") as info:
        mk.run(_results_plugin({"blob": big}), out=tmp_path / "o")
    assert "return large data as a file" in str(info.value)
    assert not (tmp_path / "o").exists()


def test_write_report_from_another_thread_is_refused_while_a_run_holds_the_lock(tmp_path):
    from mechkit.io.outlock import out_lock

    out = tmp_path / "o"
    rep = build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={"s": 1},
                       artifacts=[], timings={})
    seen: list = []

    def other():
        try:
            write_report(out, rep)
            seen.append("written")
        except MechkitError as err:
            seen.append(str(err))

    with out_lock(out):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join(60)
        assert not (out / "report.json").exists()
        write_report(out, rep)  # the holder's own thread writes, as mk.run does
    assert len(seen) == 1 and "is in use by another mechkit run" in seen[0] and "this very process" in seen[0]
    assert (out / "report.json").is_file()


@pytest.mark.parametrize("nested", [False, True])
def test_a_users_file_where_mechkits_top_level_folder_was_is_refused_not_deleted(tmp_path, nested):
    out = tmp_path / "out"
    first = {"sub/x.txt": "1", "a.txt": "1"} if nested else {"a.txt": "1"}
    mk.run(returning_files({"m": put_files(tmp_path / "f", first)}, "rt36a"), out=out)
    shutil.rmtree(out / "m")
    (out / "m").write_text("USER PRECIOUS")
    with pytest.raises(MechkitError, match="it wrote a folder of that name there"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", {"a.txt": "2"})}, "rt36a"), out=out, force=True)
    assert (out / "m").read_text() == "USER PRECIOUS"
    with pytest.raises(MechkitError, match="it wrote a folder of that name there"):  # a run writing no m
        mk.run(returning_files({"n": b"x"}, "rt36a"), out=out, force=True)
    assert (out / "m").read_text() == "USER PRECIOUS"


def test_a_users_link_where_mechkits_top_level_folder_was_is_refused(tmp_path):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"a.txt": "1"})}, "rt36a"), out=out)
    shutil.rmtree(out / "m")
    (tmp_path / "keep").mkdir()
    (out / "m").symlink_to(tmp_path / "keep")
    with pytest.raises(MechkitError, match="it wrote a folder of that name there"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", {"a.txt": "2"})}, "rt36a"), out=out, force=True)
    assert (out / "m").is_symlink()


def _report():
    return build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={"s": 1},
                        artifacts=[], timings={})


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"out_dir": "o\0x"}, "holds a NUL byte"),
    ({"out_dir": b"o"}, "out_dir must be a path"),
    ({"tables": [type("T", (), {"columns": ["a"], "rows": []})()]}, "tables must be a list of mechkit.report.Table"),
])
def test_write_report_refuses_odd_arguments_in_one_line(tmp_path, monkeypatch, kwargs, said):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MechkitError, match=said):
        write_report(**{"out_dir": tmp_path / "o", "report": _report(), **kwargs})
    assert os.listdir(tmp_path) == []


def test_a_plugins_duck_typed_tables_fall_back_to_the_generic_ones(tmp_path):
    class Tables(mk.Plugin):
        name, version, summary, needs_model = "rt36t", "0.1", "duck tables", False

        def run(self, ctx):
            return mk.Result(results={"a": 1})

        def tables(self, results):
            return [type("T", (), {"columns": ["a"], "rows": []})()]

    mk.run(Tables, out=tmp_path / "o")
    assert (tmp_path / "o" / "report.html").is_file()


def test_write_report_in_a_deleted_working_directory_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
            "from mechkit.report import build_report, write_report; from mechkit.errors import MechkitError\n"
            "r = build_report(plugin='p', plugin_version='0.1', model={}, params={}, seed=0, results={}, "
            "artifacts=[], timings={})\n"
            "try:\n    write_report(sys.argv[2], r)\nexcept MechkitError as e:\n    print('ONE', e)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MECHKIT_CACHE": str(tmp_path / "c")}
    done = subprocess.run([sys.executable, "-c", code, str(gone), str(tmp_path / "o")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("ONE the working directory no longer exists")
    assert not (tmp_path / "o").exists()


def test_a_runs_returned_folder_is_walked_once_and_a_direct_call_in_full(tmp_path, monkeypatch):
    from mechkit.io import returned

    walks: list = []
    real = returned.odd_entry

    def counting(path, limit=None):
        walks.append(path)
        return real(path, limit)

    monkeypatch.setattr(returned, "odd_entry", counting)
    import mechkit.runner as runner

    monkeypatch.setattr(runner, "odd_entry", counting)
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"a.txt": "1"})}, "rt36w"), out=tmp_path / "o")
    assert len(walks) == 1
    files = {"m": put_files(tmp_path / "g", {"a.txt": "1"})}
    returned.mark_checked(files)
    files["n"] = put_files(tmp_path / "h", {"b.txt": "1"})  # changed since the mark: checked in full
    write_report(tmp_path / "p", _report(), files=files)
    assert len(walks) == 3


def test_figures_and_files_are_checked_by_one_rule(tmp_path):
    from mechkit.report.writer import outputs_problem

    assert outputs_problem({"a": 3}, {}) == "figures['a'] as a int"
    assert outputs_problem({}, [1]) == "files as a list, not a dict"
    with pytest.raises(MechkitError, match=r"^files\['a.txt'\] is a int"):
        write_report(tmp_path / "o", _report(), files={"a.txt": 3})
    with pytest.raises(MechkitError, match=r"returned files\['a.txt'\] as a int"):
        mk.run(returning_files({"a.txt": 3}, "rt36w"), out=tmp_path / "p")


class _Unreadable(dict):
    def items(self):
        raise ValueError("boom")


def _deep_key():
    key: tuple = ()
    for _ in range(100_000):
        key = (key,)
    return {key: 1}


@pytest.mark.parametrize(("results", "finding", "said"), [
    ({"s": "\udc80"}, None, "report value results.s is text with a character UTF-8 cannot hold"),
    ({"\udc80": 1}, None, "report value results has a key that is text with a character UTF-8 cannot hold"),
    ({}, "found \udc80", "report value finding is text with a character UTF-8 cannot hold"),
    ({"n": 10**5000}, None, "report value results.n is an integer too large"),
    ({"n": -(10**400)}, None, "report value results.n is an integer too large"),  # written, no reader took it
    ({"m": _Unreadable(a=1)}, None, "report value results.m could not be read (ValueError: boom)"),
    (_deep_key(), None, "has a key nested more than 100 tuples deep"),
])
def test_text_numbers_and_members_no_report_can_hold_are_one_line(tmp_path, results, finding, said):
    class Odd(mk.Plugin):
        name, version, summary, needs_model = "rt36odd", "0.1", "odd values", False

        def run(self, ctx):
            return mk.Result(results=results, finding=finding)

    with pytest.raises(MechkitError) as info:
        mk.run(Odd, out=tmp_path / "o")
    assert said in str(info.value)
    assert not (tmp_path / "o").exists()


def test_the_largest_integer_a_report_holds_is_read_back(tmp_path):
    from mechkit.report.schema import MAX_INT
    from mechkit.report.show import load_report

    mk.run(_results_plugin({"n": MAX_INT}), out=tmp_path / "o")
    assert load_report(tmp_path / "o")["results"]["n"] == MAX_INT
