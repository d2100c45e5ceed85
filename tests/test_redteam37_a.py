"""Red-team pass 37 (a), fixed.

F1/F3: a returned folder changed after the run's check (a figure's draw callback ran in the writer) got a hard
link to a user's key into the report with the umask's mode, or a FIFO as a raw OSError: each file is checked
again as it is copied. F2: a dict subclass whose ``items()`` showed a clean folder while ``dict()`` copied
another from its storage: ``files`` and ``figures`` are read once, as checked. F4: ``np.longdouble`` and an Enum
key of a tuple were refused as "nested more than 100 deep". F5: an option value the report cannot record was
refused after the work. F6: an int, float or date subclass whose own methods raise was a traceback. F7: a float
key whose ``__str__`` gives a lone surrogate passed ``build_report``.
"""

from __future__ import annotations

import datetime
import enum
import os
from pathlib import Path

import numpy as np
import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.report import build_report, write_report
from mechkit.report.schema import to_jsonable


def _figure_with(callback):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([1, 2])
    fig.canvas.mpl_connect("draw_event", callback)
    return fig


@pytest.mark.parametrize("change", ["hard link", "fifo"])
def test_a_returned_folder_changed_while_the_report_is_written_is_refused(tmp_path, change):
    secret = tmp_path / "secret"
    secret.write_text("KEY")
    os.chmod(secret, 0o600)
    folder = tmp_path / "vec"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"1")

    def add(event):
        if not os.path.lexists(folder / "z"):
            os.link(secret, folder / "z") if change == "hard link" else os.mkfifo(folder / "z")

    class Drawing(mk.Plugin):
        name, version, summary, needs_model = "rt37a-draw", "0.1", "changes its folder as it is drawn", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, figures={"f": _figure_with(add)}, files={"vec": folder})

    with pytest.raises(MechkitError, match="not the plain file it was when the run's result was checked"):
        mk.run(Drawing, out=tmp_path / "out")
    assert not (tmp_path / "out").exists() and (folder / "a.bin").read_bytes() == b"1"
    assert secret.read_text() == "KEY" and oct(secret.stat().st_mode & 0o777) == "0o600"


def test_files_are_read_once_as_they_were_checked(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("KEY")
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    (good / "a").write_text("a")
    bad.mkdir()
    os.link(secret, bad / "keylink")

    class Sneaky(dict):
        def items(self):
            return [("vec", good)]

        def values(self):
            return [good]

    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt37a-sneaky", "0.1", "a dict subclass", False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files=Sneaky(vec=bad))

    mk.run(Returns, out=tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out" / "vec")) == [".mechkit-files", "a"]
    assert (bad / "keylink").exists()
    good.mkdir()  # moved into the first report
    (good / "a").write_text("a")
    rep = build_report(plugin="p", plugin_version="0.1", model={}, params={}, seed=0, results={}, artifacts=[],
                       timings={})
    write_report(tmp_path / "direct", rep, files=Sneaky(vec=bad))
    assert sorted(os.listdir(tmp_path / "direct" / "vec")) == [".mechkit-files", "a"]


class _Pair(enum.Enum):
    A = (17, 3)


def test_numbers_of_every_width_and_enum_keys_are_stored():
    assert to_jsonable({"x": np.longdouble(1.5), "c": np.clongdouble(2), "y": np.float16(0.5)}) == \
        {"x": 1.5, "c": 2.0, "y": 0.5}
    assert to_jsonable({_Pair.A: 1, (_Pair.A, 1): 2}) == {"17.3": 1, "17.3.1": 2}
    with pytest.raises(MechkitError, match="is the complex number"):
        to_jsonable({"c": np.clongdouble(1 + 2j)})
    with pytest.raises(MechkitError, match="is the complex number"):
        to_jsonable({"c": 1 + 2j})


def test_an_option_value_the_report_cannot_record_is_refused_before_the_work():
    done: list = []

    class Counted(mk.Plugin):
        name, version, summary, needs_model = "rt37a-n", "0.1", "an int option", False
        options = (mk.Option("n", int, 1, "how many"),)

        def run(self, ctx):
            done.append(1)
            return mk.Result(results={"a": 1})

    with pytest.raises(MechkitError, match="--n cannot be recorded in the report: its value is an integer too large"):
        mk.run(Counted, write=False, n=10**400)
    assert done == []


class _I(int):
    def __abs__(self):
        raise RuntimeError("boom")

    def __int__(self):
        raise RuntimeError("boom")


class _F(float):
    def __float__(self):
        raise RuntimeError("ff")


class _D(datetime.date):
    def isoformat(self):
        raise RuntimeError("iso")


class _R(int):
    def __repr__(self):
        raise RuntimeError("repr")


class _S(float):
    def __str__(self):
        return "\udcff"


def test_number_and_date_subclasses_are_read_as_what_they_are():
    assert to_jsonable({"i": _I(3), "f": _F(1.5), "s": {_S(1.5): 1}}) == {"i": 3, "f": 1.5, "s": {"1.5": 1}}
    with pytest.raises(MechkitError, match="report value d could not be read"):
        to_jsonable({"d": _D(2020, 1, 1)})
    with pytest.raises(MechkitError, match=r"has two keys that are both '1' in JSON \(a _R and '1'\)"):
        to_jsonable({_R(1): 1, "1": 2})


def test_a_run_stores_them_through_mk_run(tmp_path):
    class Odd(mk.Plugin):
        name, version, summary, needs_model = "rt37a-odd", "0.1", "odd numbers", False

        def run(self, ctx):
            return mk.Result(results={"i": _I(3), "f": _F(2.5), "x": np.longdouble(0.25), "p": Path("a")})

    run = mk.run(Odd, out=tmp_path / "o")
    assert run.report["results"] == {"i": 3, "f": 2.5, "x": 0.25, "p": "a"}


def test_a_prepared_folder_changed_while_the_report_is_written_is_refused(tmp_path, monkeypatch):
    import tempfile

    from mechkit.io.leftovers import make_prepared_dir

    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    secret = tmp_path / "secret"
    secret.write_text("KEY")
    os.chmod(secret, 0o600)
    made: dict = {}

    def add(event):
        if not os.path.lexists(made["d"] / "z"):
            os.link(secret, made["d"] / "z")

    class Drawing(mk.Plugin):
        name, version, summary, needs_model = "rt37a-prep", "0.1", "links into its prepared folder", False

        def run(self, ctx):
            made["d"] = make_prepared_dir()
            (made["d"] / "a.bin").write_bytes(b"1")
            return mk.Result(results={"a": 1}, figures={"f": _figure_with(add)}, files={"m": made["d"]})

    with pytest.raises(MechkitError, match="other hard link"):
        mk.run(Drawing, out=tmp_path / "out")
    assert not (tmp_path / "out").exists() and secret.read_text() == "KEY" and secret.stat().st_nlink == 1
