"""The runner: interrupted runs resume from finished steps; option validation; model integrity check."""

from __future__ import annotations

from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import PluginError

CALLS: list[str] = []


class Steps(mk.Plugin):
    name, version, summary = "steps", "0.0.1", "test plugin with resumable steps"
    options = (mk.Option("interrupt", bool, False, is_flag=True),)

    def run(self, ctx):
        first = ctx.step("first", lambda: CALLS.append("first") or {"value": 1})
        if ctx.params["interrupt"]:
            raise KeyboardInterrupt
        second = ctx.step("second", lambda: CALLS.append("second") or {"value": 2})
        return mk.Result(results={"sum": first["value"] + second["value"]})


class Vandal(mk.Plugin):
    name, version, summary = "vandal", "0.0.1", "test plugin that forgets to restore a weight"

    def run(self, ctx):
        ctx.model.anatomy.mlp_out(0).weight.data.mul_(2)
        return mk.Result(results={})


def test_interrupted_run_resumes_finished_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    CALLS.clear()
    with pytest.raises(KeyboardInterrupt):
        mk.run(Steps, model="tiny:gpt2", out=tmp_path / "run", interrupt=True)
    assert CALLS == ["first"] and not (tmp_path / "run").exists()
    # same command again (interrupt is part of the key, so rerun the same options)
    with pytest.raises(KeyboardInterrupt):
        mk.run(Steps, model="tiny:gpt2", out=tmp_path / "run", interrupt=True)
    assert CALLS == ["first"]  # the finished step was not recomputed
    run = mk.run(Steps, model="tiny:gpt2", out=tmp_path / "run2")
    assert run.results["sum"] == 3 and (tmp_path / "run2" / "report.json").exists()


def test_plugin_that_changes_the_model_is_caught(tmp_path):
    with pytest.raises(PluginError, match="left the model changed"):
        mk.run(Vandal, model="tiny:llama", out=tmp_path / "v")
    assert not (tmp_path / "v").exists()


def test_bad_choice_is_rejected():
    with pytest.raises(PluginError, match="must be one of"):
        mk.run("ablate", model="tiny:llama", write=False, mode="evaporate")


class Grow(mk.Plugin):
    name, version, summary = "grow", "0.0.1", "test plugin that holds a 64 MB tensor on the model's device"

    def run(self, ctx):
        import torch

        x = torch.ones(16 * 2**20, device=ctx.model.device)  # 64 MB of float32
        return mk.Result(results={"sum": float(x.sum())})


PEAK = """
import json, sys
from pathlib import Path
import mechkit as mk
from tests.test_runner import Grow
line = [x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:")]
before = int(line[0].split()[1]) / 1024
run = mk.run(Grow, model="tiny:llama", out=sys.argv[1])
print(json.dumps({"before": before, "timings": run.report["timings"]}))
"""


def test_the_report_timings_carry_peak_memory(tmp_path):
    """In a fresh process: in the suite's long one, memory freed by earlier tests is reused, so a 64 MB tensor
    need not raise the peak, and the figure compared against nothing."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "run")], capture_output=True, text=True,
                          env=env, cwd=str(Path(__file__).parent.parent), timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    timings = json.loads((tmp_path / "run" / "report.json").read_text())["timings"]
    assert timings == seen["timings"] and {"load_s", "run_s"} <= set(timings)
    assert timings["peak_rss_mb"] >= seen["before"] + 56  # the 64 MB tensor on top (the tiny model adds little)
    assert "MB" in (tmp_path / "run" / "report.html").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA: peak CUDA memory")
def test_the_report_timings_carry_peak_cuda_memory(tmp_path):
    run = mk.run(Grow, model="tiny:llama", out=tmp_path / "run", device="cuda")
    assert run.report["timings"]["peak_cuda0_mb"] >= 64
