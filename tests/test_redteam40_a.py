"""Red-team pass 40 (a), fixed.

F1 (traceback): an Enum whose ``value`` property raised or returned the member, and a complex subclass whose
``real`` returned itself or whose ``imag`` raised, were raw tracebacks from ``to_jsonable`` and from ``mk.run``
after the work. Members and parts are now read as Enum's and complex's own, and what no bound catches is one line.
F2 (silently wrong): a run writing ``c/sub``, where ``c`` is a bind mount of ``a/r``, went on inside ``a/r``
while another run held it: locks were named by resolved paths, which a bind mount does not change. They are now
named by the place's name through its file system's own mount. F3: ``umask_modes`` walked by path, so a folder of
the tree swapped for a link to a user's folder had the user's key chmod'ed. It now walks by descriptors.
"""

from __future__ import annotations

import enum
import os
import stat

import numpy as np
import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.report.schema import to_jsonable
from tests.mounts import NEEDS_MOUNTS, in_namespace


class _Raises(enum.Enum):
    A = 1

    @property
    def value(self):
        raise ValueError("boom")


class _Itself(enum.Enum):
    A = (17, 3)

    @property
    def value(self):
        return self


class _RealItself(complex):
    @property
    def real(self):
        return self

    @property
    def imag(self):
        return 0


class _ImagRaises(complex):
    @property
    def imag(self):
        raise ValueError("x")


class _ImagArray(complex):
    @property
    def imag(self):
        return np.array([0, 1])


@pytest.mark.parametrize("value, stored", [
    (_Raises.A, 1), (_Itself.A, [17, 3]), (_RealItself(1), 1.0), (_ImagRaises(2), 2.0), (_ImagArray(3), 3.0),
])
def test_enums_and_complex_numbers_whose_own_properties_lie_are_read_as_what_they_are(value, stored):
    assert to_jsonable({"k": value}) == {"k": stored}


@pytest.mark.parametrize("key, text", [(_Raises.A, "1"), (_Itself.A, "17.3")])
def test_such_enums_as_keys_are_their_values_text(key, text):
    assert to_jsonable({key: 1}) == {text: 1}


def test_a_complex_subclass_with_an_imaginary_part_is_one_line():
    with pytest.raises(MechkitError, match=r"report value k is the complex number \(1\+2j\)"):
        to_jsonable({"k": _RealItself(1 + 2j)})


def test_a_value_whose_conversion_recurses_without_end_is_one_line(monkeypatch):
    from mechkit.report import schema

    real = schema._plain

    def deep(obj, nonfinite, depth, seen):
        if obj == {"a": 1}:
            raise RecursionError("maximum recursion depth exceeded")
        return real(obj, nonfinite, depth, seen)

    monkeypatch.setattr(schema, "_plain", deep)  # what a value's own code could still do that no bound above sees
    with pytest.raises(MechkitError, match="report value results could not be converted .RecursionError."):
        schema.build_report(plugin="x", plugin_version="1", model={}, params={}, seed=0, results={"a": 1},
                            artifacts=[], timings={})


@pytest.mark.parametrize("value", [_Raises.A, _RealItself(1)])
def test_mk_run_stores_them(tmp_path, value):
    class Returns(mk.Plugin):
        name, version, summary, needs_model = "rt40a-enum", "0.1", "returns a hostile value", False

        def run(self, ctx):
            return mk.Result(results={"k": value})

    mk.run(Returns, out=tmp_path / "out")
    assert mk.load_report(tmp_path / "out").results["k"] in (1, 1.0)


# --- F2: a lock has one name whatever bind mount reaches the place ----------------------------------------------


def test_where_no_mount_is_known_a_place_keeps_its_own_name(tmp_path, monkeypatch):
    from mechkit.io import locks, read

    monkeypatch.setattr(read, "_mount_rows", lambda: [])  # not Linux: no /proc/self/mountinfo, no fdinfo
    monkeypatch.setattr(read, "mount_id", lambda path: None)
    assert read.canonical_place(tmp_path / "c" / "x") == tmp_path / "c" / "x"
    assert locks.lock_path(tmp_path / "c") == tmp_path / ".c.mechkit-lock"




@NEEDS_MOUNTS
@pytest.mark.parametrize("inside", ["sub", ""])
def test_an_out_through_a_bind_mount_of_a_held_folder_is_refused(tmp_path, inside):
    said = in_namespace(tmp_path, f'''
(B / "a" / "r").mkdir(parents=True); (B / "c").mkdir()
subprocess.run(["mount", "--bind", str(B / "a" / "r"), str(B / "c")], check=True)
from mechkit.io.outlock import out_lock
from mechkit.report import build_report, write_report
import threading
held, done = threading.Event(), threading.Event()
def hold():
    with out_lock(B / "a" / "r"):
        held.set(); done.wait(60)
t = threading.Thread(target=hold); t.start(); held.wait(60)
try:
    write_report(B / "c" / {inside!r}, build_report(plugin="x", plugin_version="1", model={{}}, params={{}}, seed=0,
                 results={{"a": 1}}, artifacts=[], timings={{}}), force=True)
    print("WRITTEN")
except Exception as err:
    print("REFUSED", type(err).__name__, err)
done.set(); t.join()
print(sorted(os.listdir(B / "a" / "r")))
''')
    assert "REFUSED OutInUseError" in said and "another mechkit run" in said, said
    assert said.strip().endswith("[]"), said


# --- F3: modes are given through descriptors, never through a folder swapped for a link -------------------------


def test_a_folder_swapped_for_a_link_while_modes_are_given_never_reaches_the_users_files(tmp_path, monkeypatch):
    from mechkit.io import atomic

    home = tmp_path / "secret"
    home.mkdir()
    (home / "a").write_text("KEY")
    os.chmod(home / "a", 0o600)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a").write_text("x")
    os.chmod(tree / "sub" / "a", 0o600)
    real_stat, swapped = os.stat, []

    def swap_then_stat(name, *args, dir_fd=None, **kwargs):  # a thread swaps the folder as its entries are read
        if not swapped and name == "a" and dir_fd is not None:
            os.rename(tree / "sub", tree / "moved")
            os.symlink(home, tree / "sub")
            swapped.append(True)
        return real_stat(name, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(atomic.os, "stat", swap_then_stat)
    atomic.umask_modes(tree, fsync=True)
    monkeypatch.undo()
    assert swapped and stat.S_IMODE(os.stat(home / "a").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tree / "moved" / "a").st_mode) == atomic.file_mode()  # the tree's own file, as walked


def test_modes_are_given_through_the_whole_tree(tmp_path):
    from mechkit.io.atomic import dir_mode, file_mode, umask_modes

    (tmp_path / "t" / "x" / "y").mkdir(parents=True)
    for f in ("t/f", "t/x/g", "t/x/y/h"):
        (tmp_path / f).write_text("1")
        os.chmod(tmp_path / f, 0o600)
    os.chmod(tmp_path / "t" / "x" / "y", 0o700)
    os.symlink(tmp_path / "t" / "f", tmp_path / "t" / "x" / "link")
    umask_modes(tmp_path / "t")
    assert all(stat.S_IMODE(os.stat(tmp_path / f).st_mode) == file_mode() for f in ("t/f", "t/x/g", "t/x/y/h"))
    assert stat.S_IMODE(os.stat(tmp_path / "t" / "x" / "y").st_mode) == dir_mode()


@NEEDS_MOUNTS
def test_a_file_bind_mounted_inside_the_tree_keeps_its_mode(tmp_path):
    said = in_namespace(tmp_path, '''
import stat
from mechkit.io.atomic import umask_modes
(B / "t" / "d").mkdir(parents=True); (B / "t" / "d" / "m").write_text("")
(B / "key").write_text("KEY"); os.chmod(B / "key", 0o600); (B / "u").mkdir(); (B / "u" / "k").write_text("K")
os.chmod(B / "u" / "k", 0o600); (B / "t" / "bound").mkdir()
subprocess.run(["mount", "--bind", str(B / "key"), str(B / "t" / "d" / "m")], check=True)
subprocess.run(["mount", "--bind", str(B / "u"), str(B / "t" / "bound")], check=True)
umask_modes(B / "t", fsync=True)
print(oct(stat.S_IMODE(os.stat(B / "key").st_mode)), oct(stat.S_IMODE(os.stat(B / "u" / "k").st_mode)))
''')
    assert said.strip().endswith("0o600 0o600"), said
