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

Also: a head given as ``(0.7, 1)`` was truncated to head 0.1 and ``Head(0.0, 1)`` was a raw TypeError (now one
line); ``mk.run(model=handle, out=<the directory the handle was loaded from>, force=True)`` deleted the
model's weights, a saved model being a set mechkit owns (now refused as the input, as the CLI's ``--model
DIR --out DIR`` was); TransformerLens failing on a head-pruned GPT-2 sent the user to check architecture
support (now names the pruning).
"""

from __future__ import annotations

import json
import math

import pytest

import mechkit as mk
from mechkit.model.headspec import HeadSpecError
from tests.rho_tool import rho_tool

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
    tool = rho_tool()
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
    tool = rho_tool()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path)
    figures = {"past-tense": {"hidden | 0-shot": {"similarity": 0.5, "coverage": None}}}
    monkeypatch.setattr(tool, "run", lambda args: figures)
    (tmp_path / "rho.json").write_text("an earlier run's figures")
    assert tool.main(["run", "--json", "rho.json"]) == 0
    assert json.loads((tmp_path / "rho.json").read_text()) == figures
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rho.json", "run"]  # no temporary file left


# ---- class 9/11: TransformerLens on a head-pruned model names the pruning, not architecture support --------

def test_a_bridge_that_fails_on_pruned_heads_names_the_pruning_as_the_cause():
    pytest.importorskip("transformer_lens", reason="TransformerLens (the interop extra) is not installed")
    from mechkit.pruning import prune_copy
    from mechkit.pruning.plan import UnitsToRemove

    pruned = prune_copy(mk.load_model("tiny:gpt2", device="cpu"), UnitsToRemove(heads={1: [0, 1, 2]}))
    with pytest.raises(mk.MechkitError) as err:
        mk.to_transformer_lens(pruned)
    line = str(err.value)
    assert "layers keep different numbers of heads" in line and "bridge the dense model" in line, line
    assert "supports the architecture" not in line and "\n" not in line


# ---- class 8: a head that is not a pair of integers is one line, never truncated nor a TypeError ----------

@pytest.mark.parametrize("heads", [lambda: [mk.Head(0.0, 1)], lambda: [(0.7, 1)], lambda: [(True, 0)],
                                   lambda: [mk.Head(0, "1")], lambda: ["12"]])
def test_a_head_that_is_not_a_pair_of_integers_is_refused(heads):
    """(A Head itself now refuses such values when it is made: pass 6.)"""
    with pytest.raises(HeadSpecError, match="is not a pair of integers"):
        mk.parse_heads(heads(), 3, COUNTS)


def test_integer_heads_of_any_integer_type_are_taken_as_plain_heads():
    import numpy as np

    heads = mk.parse_heads([(np.int64(1), np.int32(3)), mk.Head(0, 1)], 3, COUNTS)
    assert heads == [mk.Head(0, 1), mk.Head(1, 3)] and all(type(h.layer) is int for h in heads)


def test_the_functions_taking_head_objects_refuse_a_float_head_and_change_nothing():
    from mechkit.pruning import prune_copy
    from mechkit.pruning.plan import UnitsToRemove

    model = prune_copy(mk.load_model("tiny:llama", device="cpu"), UnitsToRemove(heads={0: [0, 1]}))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    with pytest.raises(mk.MechkitError, match="is not a pair of integers"), mk.ablate(model, [mk.Head(0.0, 1)]):
        pass
    with pytest.raises(mk.MechkitError, match="is not a pair of integers"), mk.edit_weights(model) as w:
        w.zero_head_output(mk.Head(1, 1.0))
    assert all(v.equal(before[k]) for k, v in model.model.state_dict().items())


# ---- class 1: mk.run(model=handle, out=the directory the handle came from, force=True) keeps the model -----

def test_a_run_over_the_directory_its_loaded_model_came_from_is_refused_and_the_model_stays(tmp_path):
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    saved = save_pruned(prune_copy(mk.load_model("tiny:llama", device="cpu"), UnitsToRemove(heads={0: [0, 1]})),
                        tmp_path / "model")  # a set mechkit owns (its manifest lists the weights)
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    handle = mk.load_model(str(saved), device="cpu")
    for out in (saved, tmp_path / "model" / ".." / "model"):
        with pytest.raises(mk.MechkitError, match="is the input"):
            mk.run("attention", model=handle, prompt="abab", heads="0.0", out=out, force=True)
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    run = mk.run("attention", model=handle, prompt="abab", heads="0.0", out=tmp_path / "run")
    assert (tmp_path / "run" / "report.json").exists() and run.results["heads"]


# ---- --force over a model another plugin's run saved ---------------------------------------------------------

@pytest.fixture(scope="module")
def saved_model_run(tmp_path_factory):
    """A finetune run's directory: its report beside the model it saved (the set --force would replace)."""
    out = tmp_path_factory.mktemp("ft") / "ft"
    mk.run("finetune", model="tiny:llama", task="capitalize", steps=1, batch_size=2, eval_n=2, out=str(out),
           device="cpu")
    assert (out / "model.safetensors").is_file()
    return out


@pytest.mark.parametrize("plugin, options", [("attention", dict(prompt="abab", heads="0.1")),
                                             ("inspect", {}), ("detect", dict(n_seqs=2, seg_len=4))])
def test_another_plugins_force_never_deletes_a_saved_model(saved_model_run, plugin, options):
    before = {p.name: p.stat().st_mtime_ns for p in saved_model_run.iterdir()}
    with pytest.raises(mk.MechkitError, match="holds a model that a `finetune` run wrote") as err:
        mk.run(plugin, model="tiny:llama", out=str(saved_model_run), force=True, device="cpu", **options)
    assert "\n" not in str(err.value) and "another --out" in str(err.value)
    assert {p.name: p.stat().st_mtime_ns for p in saved_model_run.iterdir()} == before


def test_the_same_plugins_force_still_replaces_its_own_model(saved_model_run, tmp_path):
    run = mk.run("finetune", model="tiny:llama", task="capitalize", steps=1, batch_size=2, eval_n=2,
                 out=str(saved_model_run), force=True, device="cpu")
    assert run.report["plugin"] == "finetune" and (saved_model_run / "model.safetensors").is_file()
