"""Red-team pass 41 (b), fixed.

F1 (silently wrong): a variable an earlier run of the same process set was recorded, for a later run, as the value
it had before that earlier run; a rerun in a fresh process resumed steps computed under the other value. What a run
sets is now its own record's (``Reads.prior``), never the next run's. F2 (over-refusal): a walk over the environment
(``{**os.environ}`` for a subprocess, ``os.environ.copy()``, tqdm's ``.items()``) recorded every variable, and a
rerun with any of them changed did not resume. F3: qwen2-moe's configs with ``use_sliding_window: false`` (every
real checkpoint) were refused, whatever window they named. F4: the heads the weights hold were counted from an
edited key-head count where the config gives a head_dim.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import mechkit as mk
from mechkit.errors import ModelLoadError
from tests.stepping import CALLS, quiet, stepping, stop_then_rerun


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))


def test_a_variable_an_earlier_run_set_is_the_next_runs_input(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT41B_SCALE", raising=False)

    class Sets(mk.Plugin):
        name, version, summary, needs_model = "rt41b-sets", "0.1", "sets a variable", False

        def run(self, ctx):
            os.environ["RT41B_SCALE"] = "5"
            return mk.Result(results={"set": 1})

    mk.run(Sets, out=tmp_path / "sets", console=quiet())
    read = lambda ctx: os.environ.get("RT41B_SCALE", "1")  # noqa: E731
    results, log = stop_then_rerun(tmp_path, stepping("rt41b-reads", read, read),
                                   lambda: monkeypatch.delenv("RT41B_SCALE"))  # a fresh process: nothing set it
    assert results == {"s0": "1", "s1": "1"} and "variable RT41B_SCALE, which the run read, has changed" in log


@pytest.mark.parametrize("walk", ["subprocess", "copy", "items", "dict"])
def test_a_walk_over_the_environment_is_no_read_of_each_variable(tmp_path, cache, monkeypatch, walk):
    monkeypatch.setenv("RT41B_UNRELATED", "1")
    walks = {
        "subprocess": lambda ctx: subprocess.run(["echo", "hi"], env={**os.environ, "LC_ALL": "C"}, capture_output=True,
                                             text=True).stdout,
        "copy": lambda ctx: len(os.environ.copy()) > 0,
        "items": lambda ctx: sum(1 for _ in os.environ.items()) > 0,
        "dict": lambda ctx: len(dict(os.environ)) > 0,
    }
    plugin = stepping(f"rt41b-walk-{walk}", walks[walk])
    results, log = stop_then_rerun(tmp_path, plugin, lambda: monkeypatch.setenv("RT41B_UNRELATED", "2"))
    assert CALLS == ["s0"] and log == "", log


def test_a_variable_read_by_name_beside_a_walk_is_still_recorded(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("RT41B_NAMED", "1")

    def both(ctx):
        env = {**os.environ}
        return env.get("PATH") is not None and os.environ["RT41B_NAMED"]

    results, log = stop_then_rerun(tmp_path, stepping("rt41b-named", both),
                                   lambda: monkeypatch.setenv("RT41B_NAMED", "2"))
    assert results == {"s0": "2"} and "variable RT41B_NAMED, which the run read, has changed" in log


def _qwen2_moe(tmp_path, **edits):
    import torch
    import transformers as T

    from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

    torch.manual_seed(0)
    config = T.Qwen2MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
                              sliding_window=32768, use_sliding_window=False, **SPECIAL_TOKENS)
    path = tmp_path / "qm"
    T.Qwen2MoeForCausalLM(config).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    data = json.loads((path / "config.json").read_text())
    data.update(edits)
    if "use_sliding_window" in edits:  # the layer types follow it, as the config builds them
        data.pop("layer_types", None)
    (path / "config.json").write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("window", [32768, 4096, None, 0])
def test_a_window_the_config_turns_off_never_refuses_a_qwen2_moe(tmp_path, window):
    import torch

    m = mk.load_model(str(_qwen2_moe(tmp_path, sliding_window=window)))
    assert torch.isfinite(m(torch.tensor([list(range(3, 43))]))).all()


def test_a_window_named_in_the_refusal_is_config_jsons(tmp_path):
    path = _qwen2_moe(tmp_path, sliding_window=-5, use_sliding_window=True)
    with pytest.raises(ModelLoadError, match="gives sliding_window -5, but a window must hold at least 1 token"):
        mk.load_model(str(path))


def test_the_heads_the_weights_hold_are_counted_by_the_configs_head_dim(tmp_path):
    m = mk.load_model("tiny:llama")
    path = tmp_path / "l"
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    heads, dim = config["num_attention_heads"], config.get("head_dim") or config["hidden_size"] // config[
        "num_attention_heads"]
    config.update(num_attention_heads=3, num_key_value_heads=1, head_dim=dim)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as err:
        mk.load_model(str(path))
    assert f'set "num_attention_heads" in config.json to {heads}' in err.value.fix, err.value
    assert "this config gives no head_dim" not in str(err.value)


def test_a_variable_read_unset_then_set_by_another_run_starts_the_step_afresh(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT41B_LATER", raising=False)

    class Sets(mk.Plugin):
        name, version, summary, needs_model = "rt41b-sets-later", "0.1", "sets a variable", False

        def run(self, ctx):
            os.environ["RT41B_LATER"] = "5"
            return mk.Result(results={"set": 1})

    read = lambda ctx: os.environ.get("RT41B_LATER", "1")  # noqa: E731
    try:
        results, log = stop_then_rerun(tmp_path, stepping("rt41b-reads-later", read, read),
                                       lambda: mk.run(Sets, out=tmp_path / "sets", console=quiet()))
    finally:
        os.environ.pop("RT41B_LATER", None)
    assert results == {"s0": "5", "s1": "5"} and "variable RT41B_LATER, which the run read, has changed" in log


# --- pass 42 (b) -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["format_map", "itemgetter", "dunder"])
def test_a_variable_read_by_name_through_a_call_is_recorded(tmp_path, cache, monkeypatch, how):
    import operator

    monkeypatch.setenv("RT42B_X", "1")
    reads = {"format_map": lambda ctx: "{RT42B_X}".format_map(os.environ),
             "itemgetter": lambda ctx: operator.itemgetter("RT42B_X")(os.environ),
             "dunder": lambda ctx: os.environ.__getitem__("RT42B_X")}
    results, log = stop_then_rerun(tmp_path, stepping(f"rt42b-call-{how}", reads[how]),
                                   lambda: monkeypatch.setenv("RT42B_X", "2"))
    assert results == {"s0": "2"} and "variable RT42B_X, which the run read, has changed" in log


def test_a_listing_then_a_read_by_name_records_the_read(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("RT42B_Y", "1")

    def compute(ctx):
        names = list(os.environ)
        return "{RT42B_Y}".format_map(os.environ) if names else ""

    results, log = stop_then_rerun(tmp_path, stepping("rt42b-list-then-read", compute),
                                   lambda: monkeypatch.setenv("RT42B_Y", "2"))
    assert results == {"s0": "2"} and "variable RT42B_Y" in log


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_a_use_sliding_window_key_the_family_never_reads_turns_no_window_off(tmp_path, family):
    m = mk.load_model(f"tiny:{family}")
    path = tmp_path / family
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config.update(sliding_window=0, use_sliding_window=False)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="gives sliding_window 0, but a window must hold at least 1 token"):
        mk.load_model(str(path))


def test_a_whole_query_scale_written_with_a_point_is_fixed_to_that_value(tmp_path):
    import shutil

    m = mk.load_model("tiny:gemma2")
    path = tmp_path / "g"
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["query_pre_attn_scalar"] = 256.0
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as err:
        mk.load_model(str(path))
    assert "e.g. 256, the value written whole" in err.value.fix
    config["query_pre_attn_scalar"] = 256
    (path / "config.json").write_text(json.dumps(config))
    assert mk.load_model(str(path)).model.config.query_pre_attn_scalar == 256
    shutil.rmtree(path)
