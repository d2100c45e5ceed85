"""The fourth (confirming) red-team pass of issue 32.

A ``scores=`` grid passed to the Python API (``mk.ablate``, ``mk.show_attention``,
``mk.parse_heads``) was checked for its rows and widest width only, so on a model whose layers kept
different numbers of heads a dense model's grid (the same 3 × 4 shape) was accepted, and its scores for the
dense numbering ranked the pruned model's heads (silently wrong heads), or picked a cell with no head and
was refused with "pick heads inside that range" (the user had picked none). A cell past a layer's own
heads must now be empty (NaN or None), as every grid ``mechkit detect`` writes for such a model is.

tools/taskselect_rho.py wrote ``--json`` with a bare ``open(path, "w")`` after the features: ``--json
RUN/report.json`` replaced the run's own report (the tool's input) with its figures, and a missing folder
was a FileNotFoundError traceback after minutes of work. Both are refused first, in one line, and the file
is written whole or not at all.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.model.headspec import HeadSpecError

COUNTS = (2, 4, 2)  # a head-pruned 3-layer model: layer 0 kept 2 heads, 1 kept 4, 2 kept 2


def _own(grid):
    """``grid`` with the cells past each layer's own heads emptied, as detect writes it."""
    return [[v if h < n else None for h, v in enumerate(row)] for row, n in zip(grid, COUNTS, strict=True)]


DENSE = [[0.9, 0.8, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2], [0.1, 0.3, 0.7, 0.6]]  # a dense model's induction scores


@pytest.mark.parametrize("spec", ["induction", "induction,layer:1"])
def test_a_dense_models_grid_is_refused_on_a_model_with_pruned_heads(spec):
    with pytest.raises(HeadSpecError) as err:
        mk.parse_heads(spec, 3, COUNTS, scores={"induction": DENSE}, top_k=2)
    assert "empty (NaN or None) past each layer's own 2, 4, 2 heads" in str(err.value)
    assert "pick heads inside that range" not in str(err.value)


@pytest.mark.parametrize("empty", [None, math.nan])
def test_the_models_own_grid_ranks_only_its_heads(empty):
    grid = [[v if h < n else empty for h, v in enumerate(row)] for row, n in zip(DENSE, COUNTS, strict=True)]
    heads = mk.parse_heads("induction", 3, COUNTS, scores={"induction": grid}, top_k=2)
    assert heads == sorted([mk.Head(0, 0), mk.Head(0, 1)])
    assert mk.parse_heads("induction", 3, COUNTS, scores={"induction": _own(DENSE)}, top_k=3)[-1] == mk.Head(2, 1)


def test_a_dense_model_still_takes_a_full_grid():
    assert mk.parse_heads("induction", 3, 4, scores={"induction": DENSE}, top_k=1) == [mk.Head(0, 0)]


# ---- tools/taskselect_rho.py --json: never the run's own files, never a traceback -----------------------

def _tool():
    path = Path(__file__).resolve().parents[1] / "tools" / "taskselect_rho.py"
    spec = importlib.util.spec_from_file_location("taskselect_rho", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("given,target,words", [
    ("dir", "run/report.json", "inside the run directory"),
    ("file", "run/report.json", "inside the run directory"),
    ("dir", "run/sub/../report.json", "inside the run directory"),
    ("dir", "run/rho.json", "inside the run directory"),
    ("dir", "nowhere/rho.json", "its folder does not exist"),
    ("dir", ".", "is a directory"),
])
def test_a_json_target_that_would_replace_the_runs_files_or_cannot_be_written_is_refused_first(
        tmp_path, monkeypatch, capsys, given, target, words):
    tool = _tool()
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"plugin": "select-tasks", "mine": True}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tool, "run", lambda args: pytest.fail("the features were computed before the check"))
    assert tool.main(["run" if given == "dir" else "run/report.json", "--json", target]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.count("\n") == 1, err
    assert json.loads((run / "report.json").read_text()) == {"plugin": "select-tasks", "mine": True}


def test_the_json_is_written_whole_beside_the_run(tmp_path, monkeypatch, capsys):
    tool = _tool()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path)
    figures = {"past-tense": {"hidden | 0-shot": {"similarity": 0.5, "coverage": None}}}
    monkeypatch.setattr(tool, "run", lambda args: figures)
    (tmp_path / "rho.json").write_text("an earlier run's figures")
    assert tool.main(["run", "--json", "rho.json"]) == 0
    assert json.loads((tmp_path / "rho.json").read_text()) == figures
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rho.json", "run"]  # no temporary file left
