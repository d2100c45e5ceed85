"""Red-team pass 24 (c): what it found, fixed.

S1: a plugin saving the model's backbone (``model.model.save_pretrained``) was refused: the config it shares
with the model was allowed only the model's own class in ``architectures``. S2: buffers were in no check: a
dynamic RoPE's ``original_inv_freq`` scaled in place passed, and every later long forward computed otherwise.
S3: an old checkpoint's per-layer ``rotary_emb.inv_freq`` with other values loaded silently. S4: ``patch
--task ''`` was checked as ioi, and refused only after the load. S5: adapt's empty held-out set was refused
only after the load, though its prompts are text. S6: compose's context refusal named ``--shots 0`` where
60 shots fit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from tests.conftest import cli_in_process, edit_plugin, forwards


def _refusal(edit, model="tiny:llama") -> str:
    handle = model if isinstance(model, mk.ModelHandle) else mk.load_model(model)
    with pytest.raises(MechkitError) as err:
        mk.run(edit_plugin(edit, "rt24c-edit"), model=handle, write=False)
    return str(err.value)


def _passes(edit, model) -> None:
    handle = model if isinstance(model, mk.ModelHandle) else mk.load_model(model)
    run = mk.run(edit_plugin(edit, "rt24c-edit"), model=handle, write=False)
    assert all(run.report["checks"].values())


def _model_dir(path: Path, family: str, extra_tensors: dict | None = None, **overrides) -> Path:
    from safetensors.torch import load_file, save_file

    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model(family, **overrides)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    if extra_tensors:
        save_file({**load_file(path / "model.safetensors"), **extra_tensors}, path / "model.safetensors",
                  metadata={"format": "pt"})
    return path


# --- S1: a save of a module that shares the model's config ------------------------------------------------------


@pytest.mark.parametrize("family,backbone", [("llama", "model"), ("qwen2", "model"), ("gpt2", "transformer"),
                                             ("gpt_neox", "gpt_neox")])
def test_saving_the_backbone_that_shares_the_config_passes(tmp_path, family, backbone):
    _passes(lambda h: getattr(h.model, backbone).save_pretrained(tmp_path / "saved"), f"tiny:{family}")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())["architectures"]
    assert written == [type(getattr(mk.load_model(f"tiny:{family}").model, backbone)).__name__]


@pytest.mark.parametrize("family,names,block", [("llama", "['LlamaForCausalLM'] or ['LlamaModel']", "LlamaAttention"),
                                                ("gpt2", "['GPT2LMHeadModel'] or ['GPT2Model']", "GPT2Attention")])
def test_a_foreign_architecture_is_refused_naming_every_class_a_save_writes(family, names, block):
    for foreign in (["MistralForCausalLM"], [block]):  # a block holding the config saves nothing: no record
        def edit(h, foreign=foreign):
            h.model.config.architectures = foreign

        said = _refusal(edit, f"tiny:{family}")
        assert f"its config field architectures was set to {foreign}" in said
        assert f"not what save_pretrained records ({names})" in said


# --- S2: buffers ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamic_dir(tmp_path_factory) -> Path:
    """A tiny llama whose RoPE is dynamic past 32 positions: what the red team edited."""
    return _model_dir(tmp_path_factory.mktemp("dyn") / "m", "llama", max_position_embeddings=32,
                      rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory) -> Path:
    """A tiny phi3 with LongRoPE: its long set switched in past 16 positions."""
    factors = {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    return _model_dir(tmp_path_factory.mktemp("long") / "m", "phi3", max_position_embeddings=64,
                      original_max_position_embeddings=16,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                                       "original_max_position_embeddings": 16, **factors})


def _rope(h):
    return h.model.model.rotary_emb


@pytest.mark.parametrize("edit,name", [
    (lambda h: _rope(h).original_inv_freq.mul_(2.0), "model.rotary_emb.original_inv_freq"),
    (lambda h: _rope(h).original_inv_freq.zero_(), "model.rotary_emb.original_inv_freq"),
    (lambda h: (forwards(80)(h), _rope(h).original_inv_freq.add_(1e-3)), "model.rotary_emb.original_inv_freq"),
    (lambda h: _rope(h).register_buffer("original_inv_freq", _rope(h).original_inv_freq * 3, persistent=False),
     "model.rotary_emb.original_inv_freq"),
])
def test_a_buffer_only_long_inputs_read_left_changed_is_refused(dynamic_dir, edit, name):
    assert f"its buffer {name} holds other values and was not put back" in _refusal(edit, mk.load_model(str(dynamic_dir)))


@pytest.mark.parametrize("edit,what", [
    (lambda h: h.model.model.layers[0].register_buffer("scale", torch.ones(3)), "model.layers.0.scale was added"),
    (lambda h: delattr(h.model.model.rotary_emb, "original_inv_freq"), "original_inv_freq was removed"),
    (lambda h: h.model.model.rotary_emb.inv_freq.mul_(1.0 + 2 ** -20), "rotary_emb.inv_freq holds other values"),
])
def test_a_buffer_added_removed_or_nudged_is_refused_by_name(edit, what):
    assert what in _refusal(edit)


@pytest.mark.parametrize("lengths", [(80,), (80, 8), (40, 60, 100), (8, 80)])
def test_a_plugin_that_ran_long_forwards_on_a_dynamic_rope_passes_and_an_edit_does_not(dynamic_dir, lengths):
    h = mk.load_model(str(dynamic_dir))
    _passes(forwards(*lengths), h)  # transformers recomputes inv_freq for the longest input: no change
    grown = _rope(h).inv_freq.clone()

    def edit(m):  # what no forward computes: refused, although max_seq_len_cached says a long one ran
        forwards(*lengths)(m)
        _rope(m).inv_freq.mul_(1.5)

    said = _refusal(edit, h)  # after a short forward inv_freq is original_inv_freq itself: either is named
    assert re.search(r"its buffer model\.rotary_emb\.(original_)?inv_freq holds other values", said), said
    assert not torch.equal(_rope(h).inv_freq, grown)


@pytest.mark.parametrize("lengths", [(40,), (40, 8), (8, 40, 60)])
def test_long_forwards_on_a_longrope_pass_and_its_long_set_replaced_is_refused(longrope_dir, lengths):
    h = mk.load_model(str(longrope_dir))
    _passes(forwards(*lengths), h)  # its long set, kept as a plain attribute, is what transformers computes

    def edit(m):
        forwards(*lengths)(m)
        _rope(m).long_inv_freq = _rope(m).long_inv_freq * 2

    assert "its buffer model.rotary_emb.long_inv_freq holds other values" in _refusal(edit, h)


# --- S3: an old checkpoint's per-layer copy of a computed buffer ---------------------------------------------------


def _inv_freq(family: str) -> torch.Tensor:
    from mechkit.model.sources.tiny import tiny_model

    model = tiny_model(family)[0]
    return next(b for n, b in model.named_buffers() if n.endswith("rotary_emb.inv_freq")).clone()


@pytest.mark.parametrize("family,key,value", [
    ("llama", "model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones_like),
    ("llama", "model.layers.1.self_attn.rotary_emb.inv_freq", lambda b: b * 2),
    ("llama", "model.layers.0.self_attn.rotary_emb.inv_freq", lambda b: b[:4]),
    ("qwen2", "model.layers.1.self_attn.rotary_emb.inv_freq", lambda b: b + 1),
    ("gpt_neox", "gpt_neox.layers.0.attention.rotary_emb.inv_freq", lambda b: b.flip(0)),
])
def test_a_per_layer_legacy_buffer_with_other_values_is_refused(tmp_path, family, key, value):
    d = _model_dir(tmp_path / "m", family, {key: value(_inv_freq(family)).contiguous()})
    with pytest.raises(ModelLoadError, match=rf"holds {key} with other values .* its buffer \S+rotary_emb.inv_freq"):
        mk.load_model(str(d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equal_per_layer_copies_load_and_one_off_is_refused(tmp_path, dtype):
    keys = [f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in (0, 1)]
    inv = _inv_freq("llama")
    h = mk.load_model(str(_model_dir(tmp_path / "same", "llama", {k: inv.to(dtype).clone() for k in keys})))
    assert torch.equal(h.model.model.rotary_emb.inv_freq, inv)
    with pytest.raises(ModelLoadError, match=f"holds {keys[1]} with other values"):
        mk.load_model(str(_model_dir(tmp_path / "off", "llama", {keys[0]: inv.to(dtype),
                                                                 keys[1]: (inv * 1.1).to(dtype)})))


# --- S4: an empty option value is not the default ------------------------------------------------------------------


@pytest.fixture
def no_load(monkeypatch):
    from mechkit.model import loading

    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)


@pytest.mark.parametrize("model", ["tiny:gpt2", "tiny:llama", "/nonexistent/model"])
def test_an_empty_patch_task_is_refused_before_the_load(no_load, model):
    with pytest.raises(MechkitError, match="empty task id"):
        mk.run("patch", model=model, task="", write=False)


def test_the_cli_refuses_an_empty_patch_task_in_one_line(no_load):
    done = cli_in_process("patch", "--model", "tiny:gpt2", "--task", "")
    assert done.returncode == 2 and "empty task id" in done.stderr and "Traceback" not in done.stderr
    assert "loading" not in done.stderr


# --- S5: adapt's held-out prompts, checked before the load ---------------------------------------------------------


@pytest.mark.parametrize("tasks,seed", [("past-tense", 0), ("capitalize,past-tense,country-capital", 0),
                                        ("past-tense,capitalize", 0)])
def test_an_empty_heldout_set_is_refused_with_the_seed_before_any_model(tiny_llama, tasks, seed):
    from mechkit import registry
    from mechkit.adapt import AdaptConfig, AdaptStudy
    from mechkit.options.resolve import resolve_options

    options = {"tasks": tasks, "n": 1, "shots": 0, "calib": 2, "repeats": 1, "budgets": "0.5,0.7,1.0"}
    with pytest.raises(MechkitError) as early:
        resolve_options(registry.get("adapt"), options, seed=seed)
    with pytest.raises(MechkitError) as late:  # the study's own refusal, after a load: the same line
        AdaptStudy(tiny_llama, tasks.split(","), AdaptConfig(n=1, shots=0, n_calib=2, repeats=1, seed=seed))
    assert str(early.value) == str(late.value) and "no held-out prompt is left for past-tense" in str(early.value)
    resolve_options(registry.get("adapt"), {**options, "shots": 1}, seed=seed)  # the fix it names passes


@pytest.mark.parametrize("seed", [0, 3])
def test_mk_run_and_the_cli_refuse_an_empty_heldout_set_before_the_load(no_load, seed):
    with pytest.raises(MechkitError, match="no held-out prompt is left for past-tense"):
        mk.run("adapt", model="tiny:llama", tasks="past-tense", n=1, shots=0, seed=seed, write=False)
    done = cli_in_process("adapt", "--model", "tiny:llama", "--tasks", "past-tense", "--n", "1", "--shots", "0",
                          "--seed", str(seed))
    assert done.returncode == 2 and "no held-out prompt is left" in done.stderr and "Traceback" not in done.stderr


def test_the_heldout_check_follows_the_seed():
    from mechkit import registry
    from mechkit.adapt.study import check_heldout
    from mechkit.options.resolve import resolve_options

    options = {"tasks": "capitalize", "n": 10, "shots": 0, "calib": 2, "repeats": 1, "budgets": "0.5,0.7,1.0"}
    for seed in (0, 1, 7):  # a pool large enough: no seed refused
        resolve_options(registry.get("adapt"), options, seed=seed)
        check_heldout(["capitalize"], {"n": 10, "shots": 0, "n_calib": 2}, seed)


# --- S6: compose's context fix names the largest K that fits -------------------------------------------------------


@pytest.mark.parametrize("shots,named", [("100", "79"), ("1,100", "1,79"), ("0,3,90", "0,3,79")])
def test_the_context_fix_names_the_largest_k_and_following_it_runs(shots, named):
    args = {"pairs": "capitalize+swap", "parts": "study", "n": 2, "seeds": 1}
    with pytest.raises(MechkitError, match="longer than the model's context") as err:
        mk.run("compose", model="tiny:llama", write=False, shots=shots, **args)
    assert f"--shots {named}" in err.value.fix and "use --shots 0:" not in err.value.fix
    assert "79" in err.value.fix
    if shots == "100":  # applied literally (one run: 4,000-token prompts on 2 cores)
        run = mk.run("compose", model="tiny:llama", write=False, shots=named, **args)
        assert run.results["shots"] == [int(k) for k in named.split(",")]
