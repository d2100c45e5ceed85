"""Resumable runs: finished steps survive Ctrl-C (a real SIGINT included), damaged ones are recomputed.

A rerun of the same command must skip every finished step and give the same report as a run that
was never interrupted; a step file that cannot be read back is discarded with one warning line
instead of failing every rerun.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.io.disk_cache import RUN_MARKER
from mechkit.io.outlock import lock_path

CALLS: list[str] = []
INTERRUPTED = "mechkit: error: interrupted — finished steps are kept; rerun the same command to resume"
SWEEP = {"model": "tiny:llama", "tasks": "capitalize", "n": 4, "shots": 2, "batch_size": 1}  # 4 batches x 2 layers


class Steps(mk.Plugin):
    name, version, summary = "steps", "0.0.1", "test plugin with two resumable steps"
    needs_model = False
    options = (mk.Option("stop", bool, False, is_flag=True),)

    def run(self, ctx):
        first = ctx.step("first", lambda: CALLS.append("first") or {"value": 1})
        if ctx.params["stop"]:
            raise KeyboardInterrupt
        second = ctx.step("second", lambda: CALLS.append("second") or {"value": 2})
        return mk.Result(results={"sum": first["value"] + second["value"]})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _step_files(cache: Path) -> dict[str, Path]:
    """Every finished step of every run in the cache, by key."""
    files = {}
    for f in (cache / "runs").glob("*/*.json"):
        if f.name == RUN_MARKER:  # the folder's mark as mechkit's, not a step
            continue
        try:
            files[json.loads(f.read_text())["key"]] = f
        except (ValueError, KeyError):
            files[f.name] = f
    return files


@pytest.mark.parametrize("damage", [b'{"key": "first", "val', b"", b"\xff\xfe\x00", b"[1, 2]",
                                    b'{"key": "second", "value": {"value": 9}}'])
def test_a_damaged_step_is_discarded_with_one_warning_and_recomputed(tmp_path, cache, damage):
    CALLS.clear()
    with pytest.raises(KeyboardInterrupt):
        mk.run(Steps, out=tmp_path / "run", stop=True)
    (path,) = _step_files(cache).values()
    path.write_bytes(damage)  # truncated, empty, not text, not a step, another step's
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        mk.run(Steps, out=tmp_path / "run", stop=True, console=Console(file=log, width=40))
    assert CALLS == ["first", "first"]  # recomputed, not a crash
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mechkit: warning: discarded the damaged resume step 'first'")
    assert lines[0].endswith("computing it again")
    kept = json.loads(path.read_text())
    assert (kept["key"], kept["value"]) == ("first", {"value": 1})  # sound again
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        mk.run(Steps, out=tmp_path / "run", stop=True, console=Console(file=log))
    assert CALLS == ["first", "first"] and log.getvalue() == ""  # and resumed from


def test_an_unwritable_cache_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("MECHKIT_CACHE", str(blocker))
    CALLS.clear()
    log = io.StringIO()
    run = mk.run(Steps, out=tmp_path / "run", console=Console(file=log))
    assert run.results == {"sum": 3} and CALLS == ["first", "second"]
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mechkit: warning: cannot keep finished steps"), lines


def test_a_second_identical_run_keeps_no_steps_while_the_first_holds_them(tmp_path, cache):
    """Two runs of the same plugin, options, seed and model (different --out) never share resume steps:
    the second warns and runs without, so neither writes or clears the other's."""
    from mechkit.io.outlock import out_lock
    from mechkit.options.resolve import resolve_params
    from mechkit.runner import resume_dir

    resume = resume_dir(Steps, "llama", resolve_params(Steps, {}), 0)
    CALLS.clear()
    log = io.StringIO()
    with out_lock(resume):  # the first run, still going
        run = mk.run(Steps, out=tmp_path / "second", console=Console(file=log, width=300))
        assert not resume.exists()  # the second wrote nothing into the first's steps
    assert run.results == {"sum": 3} and CALLS == ["first", "second"]
    (line,) = log.getvalue().splitlines()
    assert line.startswith("mechkit: warning: another run with the same options") and "keeps none" in line


# --- sweep: the exact sweep and the attribution estimate resume --------------------------------------------


def _counting(monkeypatch, module, name: str, stop_after: int | None = None) -> list:
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_an_interrupted_exact_sweep_resumes_where_it_stopped(tmp_path, cache, monkeypatch):
    import mechkit.heads.effects as effects

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "fresh"))
    whole = mk.run("sweep", write=False, **SWEEP).results  # never interrupted
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    with monkeypatch.context() as patch:
        _counting(patch, effects, "_layer_effects", stop_after=3)
        with pytest.raises(KeyboardInterrupt):
            mk.run("sweep", out=tmp_path / "run", **SWEEP)
    assert len([k for k in _step_files(cache) if "|layer" in k]) == 3
    assert not (tmp_path / "run").exists() and not lock_path(tmp_path / "run").exists()
    with monkeypatch.context() as patch:
        again = _counting(patch, effects, "_layer_effects")
        resumed = mk.run("sweep", out=tmp_path / "run", **SWEEP).results
    assert len(again) == 4 * 2 - 3  # only the unfinished (batch, layer) steps
    assert resumed["exact"] == whole["exact"]  # the same numbers, bit for bit
    assert not (cache / "runs").exists() or not any((cache / "runs").iterdir())  # done with: cleared


def test_a_finished_attribution_is_not_computed_again(tmp_path, cache, monkeypatch):
    import mechkit.heads.effects as effects
    import mechkit.report

    options = {**SWEEP, "method": "both", "batch_size": 2}
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "fresh"))
    whole = mk.run("sweep", write=False, **options).results
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the report is written: every step has finished

    with monkeypatch.context() as patch:
        patch.setattr(mechkit.report, "write_report", interrupted)
        with pytest.raises(KeyboardInterrupt):
            mk.run("sweep", out=tmp_path / "run", **options)
    with monkeypatch.context() as patch:
        attribution = _counting(patch, effects, "_attribution_sums")
        layers = _counting(patch, effects, "_layer_effects")
        resumed = mk.run("sweep", out=tmp_path / "run", **options).results
    assert attribution == [] and layers == []
    assert resumed == whole  # exact, attribution and their agreement, bit for bit


@pytest.mark.parametrize("plugin, module, unit, options", [
    ("sweep", "mechkit.heads.effects", "_attribution_sums", {**SWEEP, "method": "attribution"}),
    ("detect", "mechkit.heads.scores", "_batch_sums", {"model": "tiny:llama", "n_seqs": 8, "seg_len": 6,
                                                       "batch_size": 2}),
])
def test_an_interrupted_batch_loop_resumes_at_the_first_unfinished_batch(tmp_path, cache, monkeypatch, plugin,
                                                                        module, unit, options):
    """The attribution estimate and detect's head scores keep each batch: 4 batches, stopped after 3."""
    import importlib

    mod = importlib.import_module(module)
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "fresh"))
    whole = mk.run(plugin, write=False, **options).results
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    with monkeypatch.context() as patch:
        _counting(patch, mod, unit, stop_after=3)
        with pytest.raises(KeyboardInterrupt):
            mk.run(plugin, out=tmp_path / "run", **options)
    with monkeypatch.context() as patch:
        again = _counting(patch, mod, unit)
        resumed = mk.run(plugin, out=tmp_path / "run", **options).results
    assert len(again) == 1  # only the unfinished batch
    assert resumed == whole  # bit for bit


# --- a real SIGINT to a real mechkit process ---------------------------------------------------------------

SLOW_SWEEP = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a parent that ignores SIGINT (Ray can leave it so) passes that on
import mechkit.heads.effects as effects
real = effects._layer_effects
def slow(*args, **kwargs):  # each (batch, layer) step takes a while (1 s: a parent starved on a loaded
    # machine still finds the run midway), so the run is stopped midway
    time.sleep(float(sys.argv[1]))
    return real(*args, **kwargs)
effects._layer_effects = slow
from mechkit.cli.main import main
main(sys.argv[2:])
"""


def test_ctrl_c_keeps_finished_steps_and_the_rerun_resumes(tmp_path, cache, monkeypatch):
    import mechkit.heads.effects as effects

    out = tmp_path / "run"
    args = ["sweep", "--model", "tiny:llama", "--out", str(out), "--tasks", "capitalize", "--n", "4",
            "--shots", "2", "--batch-size", "1"]
    env = {**os.environ, "MECHKIT_CACHE": str(cache), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SWEEP, "1.0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while len([k for k in _step_files(cache) if "|layer" in k]) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no step finished"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert [line for line in stderr.splitlines() if line.strip()] == [INTERRUPTED], stderr
    assert stdout == "" and not out.exists() and not lock_path(out).exists()
    kept = len([k for k in _step_files(cache) if "|layer" in k])
    assert 2 <= kept < 8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the killed process ran: float reductions differ between thread counts
    try:
        with monkeypatch.context() as patch:  # the same command again, counting the steps it computes
            again = _counting(patch, effects, "_layer_effects")
            resumed = mk.run("sweep", out=out, **SWEEP)
        assert len(again) == 8 - kept and (out / "report.json").exists()
        monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "fresh"))
        assert resumed.results["exact"] == mk.run("sweep", write=False, **SWEEP).results["exact"]
    finally:
        torch.set_num_threads(threads)
