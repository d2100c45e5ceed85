"""Red-team pass 36 (a), what it found in this session's newest code, fixed.

F1: a plugin's ``tables`` hook ran after ``mk.run`` had checked its returned paths, so a hard link it added to a
user's file got into the report. F2: dict keys that become one text in JSON (``1`` and ``"1"``, ``(17, 3)`` and
``"17.3"``, NaN and ``None``) silently kept one value. F3: a ``Path`` holding a lone surrogate was a
UnicodeEncodeError from ``write_report``. F4: a report.json one byte past the limit was written (the newline was
not counted) and ``report show`` refused it. F5: figures ``heat`` and ``heat.png`` were one file, one figure lost.
F6: a user's link where mechkit's subfolder was, inside a returned folder, was deleted by ``--force``. F8: objects
whose ``detach``, ``tolist``, ``items`` or exception text raise were tracebacks.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.report import build_report, write_report
from tests.conftest import put_files, returning_files


def _report(results=None):
    return build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results=results or {"s": 1},
                        artifacts=[], timings={})


def test_a_hard_link_a_tables_hook_adds_to_a_checked_folder_is_refused(tmp_path, monkeypatch):
    from mechkit.io.leftovers import make_prepared_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    made: dict = {}

    class Hooked(mk.Plugin):
        name, version, summary, needs_model = "rt36c-hl", "0.1", "links in its tables hook", False

        def run(self, ctx):
            made["d"] = make_prepared_dir()
            (made["d"] / "a.txt").write_text("hi")
            return mk.Result(results={"x": 1}, files={"m": made["d"]})

        @classmethod
        def tables(cls, results):
            os.link(secret, made["d"] / "key")
            return []

    with pytest.raises(MechkitError, match="other hard link"):
        mk.run(Hooked, out=tmp_path / "o")
    assert not (tmp_path / "o" / "m" / "key").exists() and secret.read_text() == "private"


@pytest.mark.parametrize("results", [
    {"a": {1: "a", "1": "b"}},
    {"heads": {(17, 3): 0.5, "17.3": 0.9}},
    {"n": {None: 1, "None": 2}},
    {"p": {Path("x"): 1, "x": 2}},
])
def test_keys_that_are_one_text_in_json_are_refused_not_merged(tmp_path, results):
    with pytest.raises(MechkitError, match="has two keys that are both"):
        write_report(tmp_path / "o", _report(results))
    with pytest.raises(MechkitError, match="has two keys that are both"):
        mk.run(_plugin(results), out=tmp_path / "p")
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()


def test_non_finite_float_keys_stay_apart():
    from mechkit.report.schema import to_jsonable

    assert to_jsonable({float("nan"): 1, float("inf"): 2, float("-inf"): 3, None: 4}) == \
        {"nan": 1, "inf": 2, "-inf": 3, "None": 4}


def _plugin(results):
    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt36c-r", "0.1", "returns results", False

        def run(self, ctx):
            return mk.Result(results=results)

    return Returns


class _Text(str):
    def encode(self, *args, **kwargs):
        return b"fine"


@pytest.mark.parametrize("results", [
    {"input": Path("/tmp/data-\udcff.txt")},
    {Path("/tmp/k-\udcff"): 1},
    {"s": _Text("x\udcff")},
])
def test_text_utf8_cannot_hold_is_one_line_in_any_form(tmp_path, results):
    with pytest.raises(MechkitError, match="UTF-8 cannot hold"):
        write_report(tmp_path / "o", _report({"ok": 1}) | {"results": results})
    with pytest.raises(MechkitError, match="UTF-8 cannot hold"):
        build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results=results, artifacts=[],
                     timings={})
    assert not (tmp_path / "o").exists()


def test_a_report_at_the_limit_is_written_and_read_back_and_one_byte_more_is_refused(tmp_path, monkeypatch):
    from mechkit.report import schema, show, writer

    monkeypatch.setattr(writer, "MAX_REPORT_BYTES", 4000)
    monkeypatch.setattr(show, "MAX_REPORT_BYTES", 4000)
    base = _report({"pad": ""})
    size = len((json.dumps(writer.to_jsonable(base, "keep"), indent=2, ensure_ascii=False) + "\n").encode())
    assert schema.MAX_REPORT_BYTES > 4000
    fits = _report({"pad": "x" * (4000 - size)})
    write_report(tmp_path / "o", fits)
    assert (tmp_path / "o" / "report.json").stat().st_size == 4000
    assert show.load_report(tmp_path / "o")["results"]["pad"]
    with pytest.raises(MechkitError, match="more than a report's limit"):
        write_report(tmp_path / "p", _report({"pad": "x" * (4001 - size)}))
    assert not (tmp_path / "p").exists()


def test_two_figures_that_are_one_file_are_refused(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one, two = plt.figure(), plt.figure()
    try:
        with pytest.raises(MechkitError, match="two figures or files that are both the file 'heat.png'"):
            write_report(tmp_path / "o", _report(), figures={"heat": one, "heat.png": two})

        class Figures(mk.Plugin):
            name, version, summary, needs_model = "rt36c-f", "0.1", "two figures", False

            def run(self, ctx):
                return mk.Result(results={"a": 1}, figures={"heat": one, "heat.png": two})

        with pytest.raises(MechkitError, match="returned two figures or files that are both the file 'heat.png'"):
            mk.run(Figures, out=tmp_path / "p")
        with pytest.raises(MechkitError, match="both the file 'heat.png'"):
            write_report(tmp_path / "q", _report(), figures={"heat": one}, files={"heat.png": b"x"})
    finally:
        plt.close(one)
        plt.close(two)
    assert not any((tmp_path / n).exists() for n in "opq")


def test_a_run_names_its_figure_files_as_the_writer_writes_them(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()

    class Figure(mk.Plugin):
        name, version, summary, needs_model = "rt36c-g", "0.1", "a figure named with .PNG", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, figures={"heat.PNG": fig})

    try:
        run = mk.run(Figure, out=tmp_path / "o")
    finally:
        plt.close(fig)
    assert run.report["artifacts"] == ["heat.PNG"] and (tmp_path / "o" / "heat.PNG").is_file()


@pytest.mark.parametrize("where", ["sub", "sub/deeper"])
def test_a_users_link_where_mechkits_subfolder_was_is_refused_not_deleted(tmp_path, where):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/deeper/f.txt": "1", "top.txt": "1"})}, "rt36c"),
           out=out)
    shutil.rmtree(out / "m" / where)
    (tmp_path / "userdir").mkdir()
    (out / "m" / where).symlink_to(tmp_path / "userdir")
    with pytest.raises(MechkitError, match="which mechkit did not write"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", {"sub/deeper/f.txt": "2", "top.txt": "2"})},
                               "rt36c"), out=out, force=True)
    assert (out / "m" / where).is_symlink() and (tmp_path / "userdir").is_dir()


class _DetachRaises:
    def detach(self):
        raise RuntimeError("boom")

    def tolist(self):
        return [1]


class _TolistProperty:
    @property
    def tolist(self):
        raise RuntimeError("prop")


class _BadText(Exception):
    def __str__(self):
        raise RuntimeError("str fails")


class _ItemsRaise(dict):
    def items(self):
        raise _BadText()


class _Triples(dict):
    def items(self):
        return [(1, 2, 3)]


@pytest.mark.parametrize("value", [_DetachRaises(), _TolistProperty(), _ItemsRaise(a=1), _Triples(a=1)])
def test_objects_that_raise_when_read_are_one_line(tmp_path, value):
    with pytest.raises(MechkitError, match="report value results.v could not be read"):
        build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={"v": value},
                     artifacts=[], timings={})
    with pytest.raises(MechkitError, match="report value results.v could not be read"):
        write_report(tmp_path / "o", _report() | {"results": {"v": value}})
    assert not (tmp_path / "o").exists()


def test_an_integer_key_too_large_is_named_as_a_key():
    from mechkit.report.schema import to_jsonable

    with pytest.raises(MechkitError, match="report value has a key that is an integer too large"):
        to_jsonable({10**400: 1})
