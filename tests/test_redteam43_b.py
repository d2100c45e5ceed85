"""Red-team pass 43 (b), fixed.

F3 (silently wrong): a variable the kept run read and then set, set again by another run of the process, was
compared with the value from before the first run's set: the step resumed although a fresh computation read the
other run's value. A step now keeps the value its run left in the variable, and a rerun takes the variable as
unchanged only while it still holds that. F2 (over-refusal): loops over os.environ (``values()``'s ``in``, a
comprehension over its names, ``map``) recorded every variable. F5: qwen2 with ``use_sliding_window: false`` and
sliding ``layer_types`` was "a window must hold at least 1 token" whatever the window. F6: a query scale of 1e300
was fixed to a 301-digit number. F8 (silently wrong): finite weights near 1e38 made every logit 0 (a norm's mean
square overflowed), and detect exited 0 with flat scores.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from tests.stepping import CALLS, quiet, stepping, stop_then_rerun


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))


def test_a_variable_another_run_set_since_is_this_runs_input(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT43B_XV", raising=False)

    def reads_then_sets(ctx):
        value = os.environ.get("RT43B_XV", "1")
        os.environ["RT43B_XV"] = "7"
        return value

    class Sets(mk.Plugin):
        name, version, summary, needs_model = "rt43b-sets", "0.1", "sets", False

        def run(self, ctx):
            os.environ["RT43B_XV"] = "9"
            return mk.Result(results={"a": 1})

    try:
        results, log = stop_then_rerun(tmp_path, stepping("rt43b-p", reads_then_sets),
                                       lambda: mk.run(Sets, out=tmp_path / "q", console=quiet()))
    finally:
        os.environ.pop("RT43B_XV", None)
    assert results == {"s0": "9"} and "variable RT43B_XV, which the run read, has changed" in log


def test_a_variable_the_kept_run_itself_left_still_resumes_in_the_same_process(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT43B_LEFT", raising=False)
    try:
        results, log = stop_then_rerun(tmp_path, stepping("rt43b-left", lambda ctx: os.environ.setdefault(
            "RT43B_LEFT", "True")), lambda: None)
    finally:
        os.environ.pop("RT43B_LEFT", None)
    assert results == {"s0": "True"} and CALLS == ["s0"] and log == ""


@pytest.mark.parametrize("walk", ["values", "comprehension", "map"])
def test_loops_over_the_environment_record_no_variable(tmp_path, cache, monkeypatch, walk):
    monkeypatch.setenv("RT43B_UNRELATED", "a")
    walks = {"values": lambda ctx: "x" in os.environ.values(),
             "comprehension": lambda ctx: len({k: os.environ[k] for k in os.environ}) > 0,
             "map": lambda ctx: len(list(map(os.environ.__getitem__, os.environ))) > 0}
    results, log = stop_then_rerun(tmp_path, stepping(f"rt43b-loop-{walk}", walks[walk]),
                                   lambda: monkeypatch.setenv("RT43B_UNRELATED", "b"))
    assert CALLS == ["s0"] and log == "", log


def _qwen2(tmp_path, **edits):
    m = mk.load_model("tiny:qwen2")
    path = tmp_path / "q"
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config.update(edits)
    (path / "config.json").write_text(json.dumps(config))
    return path, config


@pytest.mark.parametrize("window", [None, 4096])
def test_sliding_layers_with_the_window_turned_off_name_that_conflict_and_its_fix_works(tmp_path, window):
    path, config = _qwen2(tmp_path, use_sliding_window=False, sliding_window=window,
                          layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ModelLoadError, match="use_sliding_window false, but its layer_types hold sliding layers"):
        mk.load_model(str(path))
    for fix in ({"use_sliding_window": True, "sliding_window": 4096}, {"layer_types": ["full_attention"] * 2}):
        (path / "config.json").write_text(json.dumps({**config, **fix}))
        assert torch.isfinite(mk.load_model(str(path))(torch.tensor([list(range(3, 43))]))).all()


def test_a_huge_query_scale_is_not_the_example(tmp_path):
    m = mk.load_model("tiny:gemma2")
    path = tmp_path / "g"
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["query_pre_attn_scalar"] = 1e300
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as err:
        mk.load_model(str(path))
    assert "written whole" not in err.value.fix and len(err.value.fix) < 300


def test_a_model_whose_logits_are_all_one_value_is_refused_before_the_work(tmp_path):
    m = mk.load_model("tiny:llama")
    with torch.no_grad():
        for layer in m.model.model.layers:
            layer.mlp.down_proj.weight.fill_(1e38)  # finite; the final norm's mean square overflows
    assert bool((m(torch.tensor([[1, 2, 3]])) == 0).all())
    with pytest.raises(MechkitError, match="computes the same logit for every token"):
        mk.run("inspect", model=m, out=tmp_path / "o", console=quiet())


def test_a_dare_p_of_one_says_it_drops_every_entry():
    from mechkit.taskarith.merge import merge
    from mechkit.taskarith.vector import TaskVector

    a, b = TaskVector({"w": torch.tensor([1.0, -2.0])}), TaskVector({"w": torch.tensor([3.0, 1.0])})
    with pytest.raises(MechkitError, match=r"p 1 drops every entry") as err:
        merge([a, b], "dare", p=1.0)
    assert "density 0 keeps" not in str(err.value)
