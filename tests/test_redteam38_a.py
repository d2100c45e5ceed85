"""Red-team pass 38 (a), fixed.

F1–F4 (data loss): code that ran after a returned path was checked (a figure's artist, a name's own ``lower()``)
turned a ``Path`` subclass's ``__fspath__`` to a user's file, made a relative path another file by ``os.chdir``,
bind-mounted a user's folder inside a returned one, or put the working directory in ``files``; the writer copied
what it then found and removed it. Returned names and paths are now fixed as plain text and plain absolute paths
when checked, the runner writes its own copy of them, and each entry is checked again (kind, links, mounts) as
it is copied. F5–F8: hostile report values, option values, ``out`` objects and table cells were tracebacks.
F9: a finite longdouble past float64 was called "inf" from a "diverged" run. F10: a NaN default was the example.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.report import build_report, write_report


def _figure_doing(action):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

    class Doing(Artist):
        def draw(self, renderer):
            action()

    fig = Figure()
    fig.add_subplot().plot([0, 1])
    fig.add_artist(Doing())
    return fig


def _plugin(name, make):
    class Made(mk.Plugin):
        version, summary, needs_model = "0.1", "returns what make() gives", False

        def run(self, ctx):
            return make()

    Made.name = name
    return Made


def test_a_path_subclass_that_changes_its_fspath_after_the_check_moves_what_was_checked(tmp_path):
    flip = {"on": False}
    victim, clean = tmp_path / "victim.txt", tmp_path / "clean.bin"
    victim.write_text("USER SECRET DATA")
    clean.write_text("clean")

    class EvilPath(pathlib.PosixPath):
        def __fspath__(self):
            return str(victim) if flip["on"] else str.__str__(str(pathlib.PosixPath(self)))

    plugin = _plugin("rt38a-fspath", lambda: mk.Result(
        results={"a": 1}, figures={"f": _figure_doing(lambda: flip.update(on=True))}, files={"m.bin": EvilPath(clean)}))
    mk.run(plugin, out=tmp_path / "out")
    assert victim.read_text() == "USER SECRET DATA" and (tmp_path / "out" / "m.bin").read_text() == "clean"


def test_a_relative_path_is_the_file_it_named_when_checked_whatever_chdir_comes_after(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "data.bin").write_text("plugin's own")
    (tmp_path / "b" / "data.bin").write_text("USER FILE in b")
    monkeypatch.chdir(tmp_path / "a")
    plugin = _plugin("rt38a-chdir", lambda: mk.Result(
        results={"a": 1}, figures={"f": _figure_doing(lambda: os.chdir(tmp_path / "b"))},
        files={"data.bin": pathlib.Path("data.bin")}))
    mk.run(plugin, out=tmp_path / "out")
    assert (tmp_path / "b" / "data.bin").read_text() == "USER FILE in b"
    assert (tmp_path / "out" / "data.bin").read_text() == "plugin's own"


def test_a_name_whose_own_methods_change_files_after_the_check_changes_nothing(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("USER WORK")
    own = tmp_path / "own"
    own.mkdir()
    (own / "a.txt").write_text("own")
    monkeypatch.chdir(work)
    held: dict = {}

    class Name(str):
        def lower(self):
            held["result"].files["m"] = pathlib.Path(work)
            return str.lower(self)

    def make():
        held["result"] = mk.Result(results={"a": 1}, figures={Name("f"): _figure_doing(lambda: None)},
                                   files={"m": own})
        return held["result"]

    mk.run(_plugin("rt38a-name", make), out=tmp_path / "out")
    assert (work / "thesis.tex").read_text() == "USER WORK"
    assert sorted(os.listdir(tmp_path / "out" / "m")) == [".mechkit-files", "a.txt"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None,
                    reason="a bind mount needs root and unshare (a private mount namespace), which this machine lacks")
def test_a_bind_mount_put_inside_a_returned_folder_after_the_check_is_refused(tmp_path):
    script = tmp_path / "mount_after_check.py"
    script.write_text(f'''
import os, subprocess, sys, pathlib
sys.path[:0] = {[p for p in sys.path if p]!r}
import matplotlib; matplotlib.use("Agg")
from matplotlib.artist import Artist
from matplotlib.figure import Figure
import mechkit as mk
B = pathlib.Path({str(tmp_path)!r})
(B / "ret" / "sub").mkdir(parents=True); (B / "ret" / "own.txt").write_text("own")
(B / "victim").mkdir(); (B / "victim" / "precious.txt").write_text("PRECIOUS")
class Mount(Artist):
    def draw(self, renderer):
        subprocess.run(["mount", "--bind", str(B / "victim"), str(B / "ret" / "sub")], check=True)
class P(mk.Plugin):
    name, version, summary, needs_model = "rt38a-mount", "0.1", "mounts", False
    def run(self, ctx):
        fig = Figure(); fig.add_subplot().plot([0, 1]); fig.add_artist(Mount())
        return mk.Result(results={{"a": 1}}, figures={{"f": fig}}, files={{"ret": B / "ret"}})
try:
    mk.run(P, out=B / "out")
    print("WRITTEN")
except mk.MechkitError as err:
    print("REFUSED", err)
print("PRECIOUS" if (B / "victim" / "precious.txt").exists() else "LOST")
''')
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "REFUSED" in done.stdout and "a mount point" in done.stdout, done.stdout + done.stderr[-2000:]
    assert done.stdout.strip().endswith("PRECIOUS")


class _D(datetime.date):
    def isoformat(self):
        return 5


class _By(bytes):
    def __bytes__(self):
        raise RuntimeError("bytes boom")


def test_report_values_whose_own_methods_misbehave_are_one_line_or_stored():
    from mechkit.report.schema import to_jsonable

    with pytest.raises(MechkitError, match="report value d gave int where text was due"):
        to_jsonable({"d": _D(2020, 1, 1)})
    assert to_jsonable({"b": _By(b"x"), "c": bytearray(b"y")}) == {"b": "x", "c": "y"}


def test_a_finite_longdouble_past_float64_is_too_large_not_inf():
    import numpy as np

    with pytest.raises(MechkitError, match="report value results.x is a number too large for a report"):
        build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0,
                     results={"x": np.longdouble("1e400")}, artifacts=[], timings={})


class _FP:
    def __fspath__(self):
        raise RuntimeError("fspath boom")


class _HS(str):
    def __str__(self):
        raise RuntimeError("str boom")


class _HI(int):
    def __int__(self):
        raise RuntimeError("int boom")

    def __index__(self):
        raise RuntimeError("index boom")


@pytest.mark.parametrize("options", [{"from_report": _FP()}, {"n": _HI(3)}])
def test_option_values_whose_own_methods_raise_are_one_line_before_the_load(options):
    with pytest.raises(MechkitError, match="could not be read as"):
        mk.run("ablate", model="tiny:llama", write=False, shots=0, baseline_seeds=0, **options)


def test_a_text_list_of_str_subclasses_is_read_as_text():
    from mechkit.options.option import Option

    assert Option("tasks", str, None, "t").check([_HS("capitalize"), "past-tense"])[0] == "capitalize,past-tense"


def test_an_out_whose_fspath_raises_is_one_line(tmp_path):
    plugin = _plugin("rt38a-out", lambda: mk.Result(results={"a": 1}))
    with pytest.raises(MechkitError, match="out must be a path, not _FP"):
        mk.run(plugin, out=_FP())
    rep = build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={}, artifacts=[],
                       timings={})
    with pytest.raises(MechkitError, match="out_dir must be a path, not _FP"):
        write_report(_FP(), rep)


def test_table_cells_the_page_cannot_draw_fall_back_to_the_generic_tables(tmp_path, capsys):
    class Cell:
        pass

    class Bad(float):
        def __format__(self, spec):
            raise RuntimeError("format boom")

    for cell in (Cell(), Bad(1.5)):
        class Tables(mk.Plugin):
            name, version, summary, needs_model = "rt38a-cells", "0.1", "odd cells", False

            def run(self, ctx):
                return mk.Result(results={"a": 1})

            @classmethod
            def tables(cls, results, cell=cell):
                return [mk.Table("t", ["k", "v"], [["a", cell]])]

        out = tmp_path / f"o{type(cell).__name__}"
        mk.run(Tables, out=out)
        assert (out / "report.html").is_file()


def test_a_nan_default_is_not_given_as_the_example():
    class Weighted(mk.Plugin):
        name, version, summary, needs_model = "rt38a-nan", "0.1", "a NaN default", False
        options = (mk.Option("w", float, float("nan"), "a weight"),)

        def run(self, ctx):
            return mk.Result(results={"a": 1})

    with pytest.raises(MechkitError) as info:
        mk.run(Weighted, write=False)
    assert "is not a finite number" in str(info.value) and "e.g. --w nan" not in str(info.value)
