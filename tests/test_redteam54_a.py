"""Red-team pass 54 (a), fixed.

- ``offload_folder`` given bytes or a non-path, and ``~nosuchuser/…`` given to ``--offload-folder``,
  ``--device-map``, ``report show``, ``taskvec info`` or the loaders, raised TypeError or RuntimeError.
- A name longer than the file system allows, given to a reader (``mk.load_report``, ``TaskVector.load``,
  ``Scheduler.load``, ``ActivationVector.load``, ``rho.load_report``), raised OSError in the API, and on the
  command line was told to "choose a shorter --out" by commands that have none.
- ``tools/taskselect_rho.py --json`` with a long name failed after the features, on a raw OSError.
- A FIFO as ``--device-map X.json`` or as a run's ``scheduler.json`` hung the read for ever.
- A killed ``--force`` write whose folder the user then moved and linked back was never rolled back: readers
  said "no report", and a writer committed over the half set, its journal left to block the next read.
"""

from __future__ import annotations

import io
import os
import signal

import pytest
from rich.console import Console

import mechkit as mk
from mechkit.actvec.vector import ActivationVector
from mechkit.adapt.scheduler import Scheduler
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path
from mechkit.io.outlock import out_lock
from mechkit.taskarith.vector import TaskVector
from mechkit.taskselect import rho
from tests.conftest import cli_in_process
from tests.killed_write import killed_write
from tests.rho_tool import rho_tool

LONG = "a" * 300


class Raw:
    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        return os.fsencode(str(self.path))


@pytest.fixture
def no_hang():
    """Fail (never hang the suite) where a regression blocks on a FIFO."""
    def hung(*_):
        raise TimeoutError("the read blocked on a FIFO")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def test_the_offload_folder_takes_bytes_and_refuses_no_path_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handle = mk.load_model("tiny:llama", offload_folder=Raw("OF"))
    assert handle.anatomy.n_layers == 2
    for value, words in ((3, "offload_folder takes a path"), ("~nosuchuser/OF", "names no user with a home"),
                         (LONG + "/x", "cannot look up --offload-folder")):
        with pytest.raises(MechkitError, match=words):
            mk.load_model("tiny:llama", offload_folder=value)


@pytest.mark.parametrize("call", [
    lambda: mk.load_report("~nosuchuser/r"),
    lambda: TaskVector.load("~nosuchuser/v.safetensors"),
    lambda: ActivationVector.load("~nosuchuser/v.safetensors"),
    lambda: Scheduler.load("~nosuchuser/r"),
    lambda: rho.load_report("~nosuchuser/r"),
    lambda: mk.load_model("tiny:llama", device_map="~nosuchuser/map.json"),
])
def test_a_user_with_no_home_is_one_line(call):
    with pytest.raises(MechkitError, match="~nosuchuser, which names no user with a home directory here") as err:
        call()
    assert err.value.fix.startswith("spell the path out")


@pytest.mark.parametrize("call,what", [
    (lambda: mk.load_report(LONG), "the report"),
    (lambda: TaskVector.load(LONG + "/v.safetensors"), "the task vector"),
    (lambda: ActivationVector.load(LONG), "the activation vector"),
    (lambda: Scheduler.load(LONG), "the scheduler"),
    (lambda: rho.load_report(LONG), "the report"),
])
def test_a_name_too_long_given_to_a_reader_is_one_line_naming_no_out(call, what):
    with pytest.raises(MechkitError, match=f"cannot look up {what} a+…: a name in it is 300 bytes long") as err:
        call()
    assert "--out" not in str(err.value)


@pytest.mark.parametrize("args", [["report", "show", LONG], ["taskvec", "info", LONG + ".safetensors"],
                                  ["report", "compare", LONG, LONG + "b", "--out", "c"]])
def test_the_command_line_readers_never_say_choose_an_out_for_a_path_they_read(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    done = cli_in_process(*args)
    err = done.stderr
    assert done.returncode == 2 and "a name in it is" in err and "--out" not in err.split("—")[-1] and "Traceback" not in err, err
    assert not (tmp_path / "c").exists()


def test_rho_refuses_no_path_in_one_line():
    with pytest.raises(MechkitError, match="takes a path"):
        rho.load_report(None)


def test_the_rho_tools_json_refuses_a_long_name_before_the_features(tmp_path, monkeypatch, capsys):
    tool = rho_tool()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text('{"plugin": "select-tasks"}')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tool, "run", lambda args: pytest.fail("the features were computed before the check"))
    for name in ("b" * 250 + ".json", "b" * 300 + ".json"):
        assert tool.main(["run", "--json", name]) == 2
        err = capsys.readouterr().err
        assert "--json" in err and "bytes long" in err and "Traceback" not in err, err


def test_a_fifo_as_a_device_map_or_a_runs_scheduler_is_refused_not_read(tmp_path, monkeypatch, no_hang):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("map.json")
    with pytest.raises(MechkitError, match="not a regular file"):
        mk.load_model("tiny:llama", device_map="map.json")
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "scheduler.json")
    for given in (tmp_path / "run", tmp_path / "run" / "scheduler.json"):
        with pytest.raises(MechkitError, match="is not a regular file"):
            Scheduler.load(given)
    (tmp_path / "map2.json").write_text('{"": "cpu"}')
    os.symlink(tmp_path / "map2.json", tmp_path / "link.json")  # a link the user named: its file is read
    assert mk.load_model("tiny:llama", device_map="link.json").anatomy.n_layers == 2


@pytest.mark.parametrize("reader", ["report", "write"])
def test_a_killed_write_whose_folder_was_moved_and_linked_back_is_rolled_back(tmp_path, reader):
    out = killed_write(tmp_path, "after-model")
    assert journal_path(out).exists() and (out / "a.txt").read_text() == "2"
    moved = tmp_path / "moved"
    out.rename(moved)
    os.symlink(moved, out)
    if reader == "report":
        with pytest.raises(MechkitError, match="no report at"):  # the old set has no report: read after the roll-back
            mk.load_report(out)
    else:
        with out_lock(out):  # what a `--force` write to the link takes first
            pass
    assert (moved / "a.txt").read_text() == "1" and (moved / "model" / "config.json").read_text() == "{}"
    assert not journal_path(out).exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_run_through_the_link_rolls_back_before_it_judges_what_is_there(tmp_path):
    out = killed_write(tmp_path, "after-model")
    moved = tmp_path / "moved"
    out.rename(moved)
    os.symlink(moved, out)
    with pytest.raises(MechkitError, match="holds a model that a `taskvec apply` run wrote"):  # read after it
        mk.run("inspect", model="tiny:llama", out=out, force=True, console=Console(file=io.StringIO()))
    assert not journal_path(out).exists() and (moved / "a.txt").read_text() == "1"  # rolled back first
