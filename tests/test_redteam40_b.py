"""Red-team pass 40 (b): config.json problems named before the load, with fixes that work when applied literally.

F7: a decimal field written as a whole number (``"rms_norm_eps": 1``) was "not a number — set it to a number";
transformers does refuse the int, so the fix is the same value with a point, and a value out of the field's range
(a softcap of 0, a negative jitter) names the range. F8: RoPE fields transformers divides by or takes a log of
(llama3's ``low_freq_factor`` 0, yarn's ``original_max_position_embeddings`` 0), gemma2's
``query_pre_attn_scalar`` 0 and a head count that does not divide the width were "the weights may be corrupt"
or came with a fix about ``layer_types``; any error transformers raises while building the config or the
modules is a config problem. F9: ``query_pre_attn_scalar`` -4 loaded and ran on complex scaling.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

import mechkit as mk
from mechkit.errors import ModelLoadError
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, **SPECIAL_TOKENS)
EXTRA = {"llama": {}, "mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "gemma2": dict(head_dim=8),
         "gemma3_text": dict(head_dim=8), "falcon": {}, "phi3": {}}
GPT2 = dict(n_embd=32, n_head=4, n_layer=2, n_positions=64, **SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved tiny model per family, built on first use; each test edits a copy."""
    made: dict = {}

    def get(family):
        if family not in made:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            torch.manual_seed(0)
            fields = GPT2 if family == "gpt2" else {**SMALL, **EXTRA[family]}
            path = tmp_path_factory.mktemp(family)
            AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **fields)).save_pretrained(path)
            byte_tokenizer().save_pretrained(path)
            made[family] = path
        return made[family]
    return get


def _copy(saved, tmp_path, family, edits):
    path = shutil.copytree(saved(family), tmp_path / "m")
    _edit(path, edits)
    return path


def _edit(path, edits):
    """Set config.json's fields (``a.b`` is a nested key)."""
    config = json.loads((path / "config.json").read_text())
    for key, value in edits.items():
        *outer, last = key.split(".")
        part = config
        for name in outer:
            part = part.setdefault(name, {})
        part[last] = value
    (path / "config.json").write_text(json.dumps(config))


def _load_and_run(path):
    import torch

    m = mk.load_model(str(path), device="cpu")
    out = m.model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert bool(torch.isfinite(out).all()) and not out.is_complex()
    return m


def _refused(path) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as err:
        _load_and_run(path)
    return err.value


def _apply(path, err: ModelLoadError):
    """Apply the fix literally: the value it names (``to 1.0``), or its example (``e.g. 30.0``)."""
    m = re.search(r'set "([\w.]+)" in config\.json to (.*)', err.fix)
    assert m, err.fix
    field, rest = m.groups()
    head = re.match(r"(-?[\d.]+(?:e-?\d+)?|\[[^\]]*\])[\s;,)]", rest + " ")
    example = re.search(r"e\.g\. (-?[\d.]+(?:e-?\d+)?|\[[^\]]*\])", rest)
    value = (head or example).group(1)
    assert "..." not in value, err.fix
    _edit(path, {field: json.loads(value)})
    return value


# ---- F7: decimal fields ----------------------------------------------------------------------------------------
@pytest.fixture
def strict_hub(monkeypatch):
    """transformers' own config validation: an int in a float field refused. Importing transformer_lens (another
    test's) wraps the hub's validator to accept it, and then ``"rms_norm_eps": 1`` simply loads."""
    from huggingface_hub import dataclasses as hub

    monkeypatch.setattr(hub, "_validate_simple_type", getattr(hub._validate_simple_type, "__wrapped__",
                                                              hub._validate_simple_type))


@pytest.mark.parametrize(("family", "field", "value", "fixed"), [
    ("llama", "rms_norm_eps", 1, "1.0"), ("llama", "initializer_range", 0, "0.0"),
    ("mixtral", "router_jitter_noise", 0, "0.0"), ("gemma2", "final_logit_softcapping", 30, "30.0"),
    ("falcon", "layer_norm_epsilon", 1, "1.0"),
])
def test_a_decimal_field_written_whole_is_fixed_with_a_point(strict_hub, saved, tmp_path, family, field, value,
                                                             fixed):
    path = _copy(saved, tmp_path, family, {field: value})
    err = _refused(path)
    assert "not a number" not in str(err) and "decimal number" in str(err), err
    assert f'set "{field}" in config.json to {fixed} ' in err.fix, err.fix
    assert _apply(path, err) == fixed
    _load_and_run(path)


@pytest.mark.parametrize(("family", "field", "value", "valid"), [
    ("mixtral", "router_jitter_noise", -1, "of at least 0"), ("mixtral", "router_jitter_noise", -0.5, "of at least 0"),
    ("gemma2", "final_logit_softcapping", 0, "above 0"), ("gemma2", "final_logit_softcapping", 0.0, "above 0"),
    ("gemma2", "attn_logit_softcapping", -50, "above 0"), ("llama", "rms_norm_eps", 0, "above 0"),
    ("llama", "rms_norm_eps", -1, "above 0"), ("falcon", "layer_norm_epsilon", -1, "above 0"),
    ("llama", "initializer_range", -0.02, "of at least 0"),
])
def test_a_decimal_field_out_of_range_names_the_range(saved, tmp_path, family, field, value, valid):
    path = _copy(saved, tmp_path, family, {field: value})
    err = _refused(path)
    assert f"{field} {json.dumps(value)}, but it must be a decimal number {valid}" in str(err), err
    assert "corrupt" not in str(err) and "layer_types" not in str(err)
    _apply(path, err)
    _load_and_run(path)


# ---- F8 (1) / F9: RoPE fields, query_pre_attn_scalar, heads that do not divide the width --------------------------
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 32}


@pytest.mark.parametrize(("key", "block", "field"), [
    ("rope_scaling", {**LLAMA3, "low_freq_factor": 0}, "rope_scaling.low_freq_factor 0"),
    ("rope_scaling", {**LLAMA3, "high_freq_factor": -4.0}, "rope_scaling.high_freq_factor -4.0"),
    ("rope_parameters", {**LLAMA3, "low_freq_factor": 0}, "rope_parameters.low_freq_factor 0"),
    ("rope_scaling", {**LLAMA3, "original_max_position_embeddings": 0},
     "rope_scaling.original_max_position_embeddings 0"),
    ("rope_scaling", {**YARN, "original_max_position_embeddings": 0}, "rope_scaling.original_max_position_embeddings 0"),
    ("rope_parameters", {**YARN, "beta_fast": -1}, "rope_parameters.beta_fast -1"),
    ("rope_parameters", {**YARN, "beta_slow": -2.0}, "rope_parameters.beta_slow -2.0"),
    ("rope_parameters", {**YARN, "attention_factor": 0.0}, "rope_parameters.attention_factor 0.0"),
    ("rope_parameters", {**YARN, "mscale": 1.0, "mscale_all_dim": -14.43}, "rope_parameters.mscale_all_dim -14.43"),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                         "short_factor": [1.0] * 4, "long_factor": [0.0] * 4}, "rope_parameters.long_factor"),
])
def test_rope_fields_transformers_divides_by_are_refused_naming_the_field(saved, tmp_path, key, block, field):
    path = _copy(saved, tmp_path, "llama", {"rope_parameters": None, "rope_scaling": None} | {key: block})
    err = _refused(path)
    assert field in str(err) and "corrupt" not in str(err) and "layer_types" not in str(err), err
    _apply(path, err)
    _load_and_run(path)


@pytest.mark.parametrize(("family", "edits", "said"), [
    ("llama", {"rope_parameters": {**LLAMA3, "low_freq_factor": 4.0}}, "low_freq_factor must be below"),
    ("llama", {"rope_parameters": {**LLAMA3, "low_freq_factor": 5.0}}, "low_freq_factor must be below"),
    ("llama", {"rope_parameters": {**YARN, "beta_fast": 1.0, "beta_slow": 32.0}}, "beta_slow must be below"),
])
def test_rope_bounds_in_the_wrong_order_are_refused(saved, tmp_path, family, edits, said):
    path = _copy(saved, tmp_path, family, edits)
    err = _refused(path)
    assert said in str(err) and "corrupt" not in str(err), err
    low, high = re.search(r"e\.g\. ([\d.]+) and ([\d.]+)", err.fix).groups()
    names = re.findall(r'"([\w.]+)"', err.fix)
    _edit(path, {names[0]: float(low), names[1]: float(high)})
    _load_and_run(path)


@pytest.mark.parametrize(("family", "edits", "field"), [
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 32, "short_factor": [1.0] * 3,
                                   "long_factor": [1.0] * 4}}, "rope_parameters.short_factor with 3 entries"),
    ("phi3", {"original_max_position_embeddings": 0}, "original_max_position_embeddings 0"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                                  "long_factor": [1.0] * 5}, "original_max_position_embeddings": 32},
     "rope_parameters.long_factor with 5 entries"),
])
def test_other_rope_fields_are_named(saved, tmp_path, family, edits, field):
    path = _copy(saved, tmp_path, family, edits)
    err = _refused(path)
    assert field in str(err) and "corrupt" not in str(err) and "layer_types" not in str(err), err
    _apply(path, err)
    _load_and_run(path)


@pytest.mark.parametrize(("family", "value"), [("gemma2", 0), ("gemma2", -4), ("gemma2", 2.5),
                                               ("gemma3_text", 0), ("gemma3_text", -16)])
def test_query_pre_attn_scalar_below_one_is_refused_before_the_load(saved, tmp_path, family, value):
    path = _copy(saved, tmp_path, family, {"query_pre_attn_scalar": value})
    err = _refused(path)  # -4 ran on the real part of a complex scaling
    assert f"query_pre_attn_scalar {value}" in str(err) and "corrupt" not in str(err), err
    assert _apply(path, err) == "8"  # the config's head_dim
    _load_and_run(path)


@pytest.mark.parametrize(("family", "heads_key", "edits"), [
    ("falcon", "num_attention_heads", {"num_attention_heads": 3}),
    ("falcon", "num_attention_heads", {"num_attention_heads": 5}),
    ("llama", "num_attention_heads", {"num_attention_heads": 3}),
    ("llama", "num_attention_heads", {"num_attention_heads": 5, "head_dim": None}),
    ("gpt2", "n_head", {"n_head": 3}),
])
def test_heads_that_do_not_divide_the_width_name_both_fields(saved, tmp_path, family, heads_key, edits):
    path = _copy(saved, tmp_path, family, edits)
    err = _refused(path)
    width = "n_embd" if family == "gpt2" else "hidden_size"
    assert f"{heads_key} {edits[heads_key]}, which does not divide {width} 32" in str(err), err
    assert "corrupt" not in str(err) and "layer_types" not in str(err)
    assert _apply(path, err) == "4"
    _load_and_run(path)
    _a_head_dim_of_its_own_lets_the_width_be_any(tmp_path / "g")


def _a_head_dim_of_its_own_lets_the_width_be_any(path):
    """The head check is not a false alarm where each head has a width of its own (gemma2's head_dim)."""
    from mechkit.model.checks.integrity import refuse_unsound_routing_and_rope

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "gemma2", "hidden_size": 36,
                                                  "num_attention_heads": 4, "head_dim": 8}))
    refuse_unsound_routing_and_rope(path)  # not refused: each head is head_dim wide
    (path / "config.json").write_text(json.dumps({"model_type": "gemma2", "hidden_size": 36,
                                                  "num_attention_heads": 5}))
    refuse_unsound_routing_and_rope(path)  # nor without one: gemma2's config class gives head_dim a default


# ---- F8 (2): errors raised building the config or the modules -------------------------------------------------
@pytest.mark.parametrize(("target", "error", "named"), [
    ("transformers.models.llama.modeling_llama.LlamaRotaryEmbedding", ZeroDivisionError("division by zero"),
     None),
    ("transformers.models.llama.modeling_llama.LlamaMLP", ValueError("intermediate_size must be even"),
     "intermediate_size"),
    ("transformers.models.llama.modeling_llama.LlamaAttention",
     ValueError("0.0 cannot be raised to a negative power"), None),
])
def test_an_error_building_the_modules_is_a_config_problem(saved, tmp_path, monkeypatch, target, error, named):
    import importlib

    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    original = cls.__init__

    def broken(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise error

    monkeypatch.setattr(cls, "__init__", broken)
    err = _refused(_copy(saved, tmp_path, "llama", {}))
    assert "corrupt" not in str(err) and "re-export" not in str(err), err
    assert "config.json" in str(err) and "weights are not at fault" in str(err)
    assert "layer_types" not in err.fix and "num_hidden_layers" not in err.fix
    if named:
        assert f"fix {named} in config.json" in err.fix, err.fix
    monkeypatch.undo()  # damaged weights are still blamed on the weights: a read of them fails, not a build
    path = _copy(saved, tmp_path / "damaged", "llama", {})
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:len(data) - 64])
    assert "weights are not at fault" not in str(_refused(path))


def test_a_config_error_names_only_the_fields_it_is_about(tmp_path):
    from mechkit.model.checks.integrity import config_fix

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 2,
                                                      "rope_parameters": {"low_freq_factor": 0}}))
    assert "layer_types" not in config_fix(tmp_path, "division by zero")
    assert "fix rope_parameters.low_freq_factor in config.json" in config_fix(tmp_path, "low_freq_factor is 0")
    assert "layer_types" in config_fix(tmp_path, "num_hidden_layers (2) and layer_types (3) disagree")
