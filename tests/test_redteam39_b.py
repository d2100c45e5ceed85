"""Red-team pass 39 (b): compose's context check counts the tokens greedy decoding writes (F4); more experts
per token than a MoE layer holds (F5) and RoPE fields out of range (F6, F7) are refused before the load,
naming config.json's field and a valid value."""

from __future__ import annotations

import json
import re

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer
from tests.conftest import tiny_model_dir

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, **SPECIAL_TOKENS)
EXTRA = {"mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
         "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                           shared_expert_intermediate_size=16),
         "olmoe": dict(num_experts=4, num_experts_per_tok=2),
         "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8),
         "phi": {}, "gemma3_text": dict(head_dim=8), "gpt_neox": {}, "llama": {}}


def _model_dir(path, family: str, **edits):
    """A tiny ``family`` model saved with the byte tokenizer, its config.json then edited (``a__b`` is a nested key)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **SMALL, **EXTRA[family])).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    for key, value in edits.items():
        *outer, last = key.split("__")
        part = config
        for name in outer:
            part = part.setdefault(name, {})
        part[last] = value
    (path / "config.json").write_text(json.dumps(config))
    return path


def _load_and_run(path):
    """Load and forward once: the old code failed only at the forward (or blamed the weights)."""
    import torch

    m = mk.load_model(str(path))
    m.model(input_ids=torch.tensor([[1, 2, 3]]))
    return m


# ---- F5: more experts per token than the layer holds ------------------------------------------------------
@pytest.mark.parametrize(("family", "edits", "picked", "held"), [
    ("mixtral", dict(num_experts_per_tok=5), "num_experts_per_tok 5", "num_local_experts (4)"),
    ("mixtral", dict(num_experts_per_tok=3, num_local_experts=2), "num_experts_per_tok 3", "num_local_experts (2)"),
    ("qwen2_moe", dict(num_experts_per_tok=5), "num_experts_per_tok 5", "num_experts (4)"),
    ("olmoe", dict(num_experts_per_tok=9), "num_experts_per_tok 9", "num_experts (4)"),
])
def test_more_experts_per_token_than_held_is_refused_naming_both(tmp_path, family, edits, picked, held):
    path = _model_dir(tmp_path / family, family, **edits)
    with pytest.raises(ModelLoadError, match=re.escape(picked)) as err:
        _load_and_run(path)
    assert held in str(err.value) and "config.json" in str(err.value) and "at most" in err.value.fix


def test_experts_per_token_equal_to_held_still_loads(tmp_path):
    _load_and_run(_model_dir(tmp_path / "m", "mixtral", num_experts_per_tok=4))


# ---- F6 / F7: RoPE fields ------------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "edits", "field"), [
    ("phi", dict(rope_parameters__partial_rotary_factor=1.5), "rope_parameters.partial_rotary_factor 1.5"),
    ("phi", dict(rope_parameters__partial_rotary_factor="x"), 'rope_parameters.partial_rotary_factor "x"'),
    ("phi", dict(rope_parameters__partial_rotary_factor=-0.5), "rope_parameters.partial_rotary_factor -0.5"),
    ("phi", dict(rope_parameters__partial_rotary_factor=0), "rope_parameters.partial_rotary_factor 0"),
    ("gpt_neox", dict(rope_parameters__rope_theta="x"), 'rope_parameters.rope_theta "x"'),
    ("gpt_neox", dict(rope_parameters__rope_theta=-1.0), "rope_parameters.rope_theta -1.0"),
    ("llama", dict(rope_parameters__rope_theta=0), "rope_parameters.rope_theta 0"),
    ("llama", dict(rope_theta="x"), 'rope_theta "x"'),  # the legacy top-level key
    ("phi", dict(partial_rotary_factor=2.0), "partial_rotary_factor 2.0"),
    ("gemma3_text", dict(rope_parameters__full_attention__rope_theta="x"),
     'rope_parameters.full_attention.rope_theta "x"'),  # the per-layer-type form
    ("gemma3_text", dict(rope_parameters__sliding_attention__rope_theta=-5), "sliding_attention.rope_theta -5"),
])
def test_rope_fields_out_of_range_are_refused_naming_the_field(tmp_path, family, edits, field):
    path = _model_dir(tmp_path / family, family, **edits)
    with pytest.raises(ModelLoadError, match=re.escape(field)) as err:
        _load_and_run(path)
    assert "config.json" in str(err.value) and "e.g." in err.value.fix and "corrupt" not in err.value.fix


def test_rope_theta_nan_is_refused(tmp_path):
    path = _model_dir(tmp_path / "m", "llama")
    (path / "config.json").write_text((path / "config.json").read_text().replace('"rope_theta": 10000.0',
                                                                                  '"rope_theta": NaN'))
    with pytest.raises(ModelLoadError, match="rope_theta NaN.*positive finite"):
        _load_and_run(path)


@pytest.mark.parametrize(("family", "edits"), [("phi", dict(rope_parameters__partial_rotary_factor=1.0)),
                                               ("gemma3_text", {})])
def test_valid_rope_fields_still_load(tmp_path, family, edits):
    _load_and_run(_model_dir(tmp_path / family, family, **edits))


# ---- F4: compose's context check counts what greedy decoding writes ---------------------------------------
PAIRS = ["capitalize+swap", "capitalize+plus-one"]


@pytest.fixture(scope="module")
def gpt2():
    return mk.load_model("tiny:gpt2")


def test_steps_prompts_past_the_context_are_refused_before_work(gpt2):
    from mechkit.compose.analysis import ComposeStudy

    for k in (7, 8):  # the study's prompts fit at 8; the steps prompts and their decoded answers do not
        with pytest.raises(MechkitError, match="longer than the model's context"):
            ComposeStudy(gpt2, PAIRS, shots=[0, 2, k], n=2, top_k=2).check_fits(["study", "steps"])
    ComposeStudy(gpt2, PAIRS, shots=[0, 2, 8], n=2, top_k=2).check_fits(["study"])  # no decoding: fits


def test_the_suggested_shots_run_the_steps_part(gpt2):
    from mechkit.compose.analysis import ComposeStudy

    with pytest.raises(MechkitError) as err:
        ComposeStudy(gpt2, PAIRS, shots=[0, 2, 5, 10], n=2, top_k=2).check_fits(["study", "steps"])
    suggested = re.findall(r"--shots ([\d,]+)", str(err.value))
    assert suggested
    for grid in suggested:
        shots = [int(x) for x in grid.split(",")]
        study = ComposeStudy(gpt2, PAIRS[:1], shots=[shots[-1]], n=2, seeds=2, top_k=2)
        study.check_fits(["steps"])
        study.settings({"tiny:gpt2": gpt2}, steps=True, grid=False)  # was an IndexError past the position table


def test_word_match_decoding_is_counted(tmp_path):
    from mechkit.compose.analysis import ComposeStudy
    from mechkit.compose.settings import study_prompts
    from mechkit.compose.stepwise import answer_budget
    from mechkit.eval import encode_rows

    m = mk.load_model("tiny:gpt2")
    prompts = [p for ps in study_prompts(PAIRS[0], 2, 2, 0).values() for p in ps]
    scored = max(len(r.ids) for r in encode_rows(m.text_tokenizer(), prompts, None))
    decoded = max(len(m.tokenizer(p.text)["input_ids"]) + answer_budget(m, p) - 1 for p in prompts)
    assert decoded > scored
    short = mk.load_model(str(tiny_model_dir(tmp_path / "g", "gpt2", n_positions=scored)))
    ComposeStudy(short, PAIRS[:1], shots=[0, 2], n=2, seeds=1, top_k=2).check_fits(["study"])  # scoring fits
    with pytest.raises(MechkitError, match="longer than the model's context"):
        ComposeStudy(short, PAIRS[:1], shots=[0, 2], n=2, seeds=1, top_k=2, words=True).check_fits(["study"])
