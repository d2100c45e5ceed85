"""``--out`` is checked before the model loads and locked for the run: two runs never share one.

The lock is an ``flock`` on a hidden file beside the run directory (:func:`mechkit.io.outlock.out_lock`):
a second run with the same ``--out`` fails at once with one line naming the holder's pid; the lock
file is gone after success, error and Ctrl-C, and one left by a ``kill -9`` is taken over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, ReportExistsError
from mechkit.io.outlock import OutInUseError, lock_path, out_lock

IN_USE = "is in use by another mechkit run (pid {pid}) — wait for it or choose another --out"


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: these runs must stop before."""
    from mechkit.model import loading

    def boom(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", boom)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
            "COLUMNS": "400"}  # one line, however long (rich wraps at the terminal width)


# --- the --out check, before the model loads -------------------------------------------------------------


def test_a_file_a_report_or_a_full_directory_fail_before_the_model_loads(tmp_path, no_model, cache):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(MechkitError, match="is a file, not a directory"):
        mk.run("inspect", model="tiny:llama", out=afile)
    done = tmp_path / "done"
    done.mkdir()
    (done / "report.json").write_text("{}")
    with pytest.raises(ReportExistsError, match="already holds a report — pass --force"):
        mk.run("inspect", model="tiny:llama", out=done)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(MechkitError, match="not an empty directory"):
        mk.run("inspect", model="tiny:llama", out=busy)
    assert afile.read_text() == "x" and (busy / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".*mechkit-lock"))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_place_fails_before_the_model_loads(tmp_path, no_model, cache):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(MechkitError, match="cannot write in"):
            mk.run("inspect", model="tiny:llama", out=ro / "run")
    finally:
        ro.chmod(0o755)


def test_cli_read_only_place_is_one_line_before_the_model_loads(tmp_path, no_model):
    """A read-only ``--out`` through the command line (``/proc`` refuses even root)."""
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", "--model", "tiny:llama", "--out", "/proc/mechkit-run"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("mechkit: error:"), result.stderr
    assert "/proc" in lines[0]


# --- the lock ----------------------------------------------------------------------------------------------


def test_a_held_lock_refuses_a_second_run_before_the_model_loads(tmp_path, no_model, cache):
    out = tmp_path / "runs" / "a"
    with out_lock(out) as path:
        assert path == lock_path(out) and path.parent == out.parent and path.read_text().strip() == str(os.getpid())
        with pytest.raises(OutInUseError) as info:
            mk.run("inspect", model="tiny:llama", out=out)
        assert str(info.value) == f"--out {out} " + IN_USE.format(pid=f"{os.getpid()}, this very process")
        with pytest.raises(OutInUseError):  # --force does not take over a running run's --out
            mk.run("inspect", model="tiny:llama", out=out, force=True)
    assert not out.exists() and not lock_path(out).exists()


def test_the_lock_is_released_after_success_error_and_ctrl_c(tmp_path, cache):
    class Fails(mk.Plugin):
        name, version, summary = "fails", "0.0.1", "test plugin"
        needs_model = False
        options = (mk.Option("how", str, "ok", choices=("ok", "error", "interrupt")),)

        def run(self, ctx):
            assert lock_path(out).exists()  # held during the run
            if ctx.params["how"] == "error":
                raise MechkitError("the plugin failed")
            if ctx.params["how"] == "interrupt":
                raise KeyboardInterrupt
            return mk.Result(results={"ok": True})

    out = tmp_path / "new" / "deeper" / "run"
    with pytest.raises(MechkitError, match="the plugin failed"):
        mk.run(Fails, out=out, how="error")
    assert not (tmp_path / "new").exists()  # the parents made for the lock went with it
    with pytest.raises(KeyboardInterrupt):
        mk.run(Fails, out=out, how="interrupt")
    assert not (tmp_path / "new").exists()
    run = mk.run(Fails, out=out, how="ok")
    assert run.results == {"ok": True} and sorted(p.name for p in out.parent.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == [".mechkit-files", "report.html", "report.json"]  # no lock inside


def test_a_lock_left_by_kill_9_is_taken_over(tmp_path, cache):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from mechkit.io.outlock import out_lock\n"
                               "with out_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(120)",
         str(out)], stdout=subprocess.PIPE, text=True, env=_env(tmp_path))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutInUseError, match=f"pid {holder.pid}"):
            mk.run("inspect", model="tiny:llama", out=out, repeats=1, seq_len=8)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert lock_path(out).exists()  # kill -9: nothing ran to remove it, but the kernel dropped the flock
    run = mk.run("inspect", model="tiny:llama", out=out, repeats=1, seq_len=8)
    assert (run.out_dir / "report.json").exists() and not lock_path(out).exists()


def test_a_lock_removed_by_its_finishing_holder_is_not_shared(tmp_path):
    """A run that opened the lock file just before its holder removed it must not count as holding it."""
    import fcntl

    out = tmp_path / "run"
    with out_lock(out) as path:
        fd = os.open(path, os.O_RDWR)  # opened while held: the old file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now, but that file is gone from the path
        with out_lock(out) as again:  # a new file: the lock is at the path, not on the orphan
            assert not os.path.samestat(os.fstat(fd), os.stat(again))
            with pytest.raises(OutInUseError), out_lock(out):
                pass
    finally:
        os.close(fd)


def test_default_run_directories_of_the_same_second_do_not_collide(tmp_path, monkeypatch):
    import mechkit.report.writer as writer
    from mechkit.runner import locked_default_out

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(writer.time, "strftime", lambda _fmt: "20260101-000000")
    with locked_default_out("inspect") as first, locked_default_out("inspect") as second:
        assert first.name == "20260101-000000-inspect" and second.name == "20260101-000000-inspect-2"
        assert lock_path(first).exists() and lock_path(second).exists()
    assert not lock_path(first).exists() and not (tmp_path / "mechkit-runs").exists()


# --- two real processes ------------------------------------------------------------------------------------

STARTER = """
import pathlib, sys, time
import mechkit.cli.main, mechkit.model.loading, mechkit.model.sources.tiny, mechkit.runner, transformers  # before the barrier
ready, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.002)
mechkit.cli.main.main(sys.argv[3:])
"""


def test_two_runs_started_together_never_both_write_the_same_out(tmp_path):
    """Into an existing empty directory (made beforehand, as people do) both used to write, both exit 0."""
    out = tmp_path / "shared"
    out.mkdir()
    go = tmp_path / "go"
    args = ["inspect", "--model", "tiny:llama", "--out", str(out), "--seq-len", "64", "--repeats", "20"]
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / f"ready{i}"), str(go), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
                              cwd=tmp_path) for i in range(2)]
    try:
        deadline = time.monotonic() + 180
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the runs did not start"
            time.sleep(0.01)
        go.touch()  # both start now, imports done
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    winner = next(r for r in results if r[0] == 0)
    loser = next(r for r in results if r[0] == 2)
    lines = loser[2].strip().splitlines()
    assert len(lines) == 1, loser
    assert (f"--out {out} is in use by another mechkit run (pid " in lines[0]
            or "already holds a report" in lines[0]), lines  # the loser may start after the winner ended
    assert f"report: {out}/report.json" in winner[1] and loser[1] == ""
    assert (out / "report.json").exists() and not lock_path(out).exists()


def test_a_run_started_while_the_lock_is_held_fails_in_one_line(tmp_path):
    """Deterministic: the test holds the lock while a real ``mechkit`` process starts on the same --out."""
    out = tmp_path / "held"
    with out_lock(out):
        result = subprocess.run([sys.executable, "-m", "mechkit.cli.main", "inspect", "--model", "tiny:llama",
                                 "--out", str(out)], capture_output=True, text=True, env=_env(tmp_path),
                                timeout=300)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.strip().splitlines() == [f"mechkit: error: --out {out} " + IN_USE.format(pid=os.getpid())]
    assert not out.exists() and not lock_path(out).exists()
