"""The examples run: the custom plugin through the public API, the study script's steps on a tiny model."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import mechkit as mk

ROOT = Path(__file__).resolve().parents[1]


def test_custom_plugin_example_runs():
    spec = importlib.util.spec_from_file_location(
        "mechkit_sink_heads", ROOT / "examples/custom_plugin/mechkit_sink_heads/__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = mk.run(module.SinkHeads, model="tiny:mistral", write=False, tasks="swap", n=2, top_k=3)
    scores = run.results["scores"]["sink"]
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for row in scores for s in row)
    assert len(run.results["top"]) == 3


def test_song_study_example_on_tiny_model(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples/song_study.py"), "--model", "tiny:llama",
                             "--out", str(tmp_path), "--tasks", "swap", "--n", "2", "--sweep", "1,2",
                             "--shuffle-k", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "top induction heads" in result.stdout and "k=2" in result.stdout
    for step in ("detect", "ablate", "shuffle"):
        assert (tmp_path / step / "report.json").exists()


def test_prune_example_on_tiny_model(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples/prune_for_task.py"), "--model", "tiny:llama",
                             "--tasks", "swap", "--n", "3", "--calib", "3", "--shots", "2",
                             "--out", str(tmp_path / "pruned")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "pruned" in result.stdout and "forward speedup" in result.stdout
    assert (tmp_path / "pruned" / "model.safetensors").is_file()
