"""Red-team pass 8 (issue 32), classes 2, 4, 5, 7, 8, 9 and 11: what still failed, fixed as a class.

Each test names the case that failed before its fix. Tiny models only.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from mechkit.model.sources.tiny import tiny_model
from mechkit.plugin import Plugin, Result


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tiny:llama saved as a model directory (with its tokenizer)."""
    path = tmp_path_factory.mktemp("rt8b") / "llama"
    model, tok = tiny_model("llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _copy(saved, tmp_path, name="m"):
    return shutil.copytree(saved, tmp_path / name)


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


# ---- class 2: never compute on weights the user did not give ------------------------------------------

def test_a_peft_adapter_beside_the_weights_is_refused_not_applied(saved, tmp_path):
    path = _copy(saved, tmp_path)  # transformers (with peft) wrapped q_proj in LoRA and applied it, exit 0
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}))
    with pytest.raises(MechkitError, match="PEFT adapter.*merge_and_unload"):
        mk.load_model(path)


def test_a_pruned_directory_keeps_an_output_embedding_its_config_calls_tied(saved, tmp_path):
    from mechkit.model.edit.surgery import CONFIG_KEY

    path = _copy(saved, tmp_path)  # a pruned model's config says tied: the file's own lm_head was replaced
    _edit_config(path, tie_word_embeddings=True, **{CONFIG_KEY: {"n_layers": 2}})
    m = mk.load_model(path)
    file = load_file(path / "model.safetensors")
    assert torch.equal(m.model.lm_head.weight, file["lm_head.weight"])
    assert torch.equal(m.model.model.embed_tokens.weight, file["model.embed_tokens.weight"])


def test_a_config_naming_the_pruning_key_in_a_value_loads_as_dense(saved, tmp_path):
    path = _copy(saved, tmp_path)  # "could not load ...: 'mechkit_pruning' — the weights may be corrupt"
    _edit_config(path, _name_or_path="/data/mechkit_pruning_runs/base")
    assert mk.load_model(path).anatomy.n_layers == 2


# ---- class 11: every fix a message suggests is right ---------------------------------------------------

def test_weights_past_float16s_range_name_the_dtype_not_damage(saved, tmp_path):
    path = _copy(saved, tmp_path)  # "its weights are damaged: use the original weights" (they were fine)
    state = load_file(path / "model.safetensors")
    state["model.layers.1.mlp.down_proj.weight"][0, 0] = 1e6
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MechkitError, match="float16's range.*--dtype bfloat16"):
        mk.load_model(path, dtype="float16")
    assert mk.load_model(path, dtype="bfloat16").model.model.layers[1].mlp.down_proj.weight[0, 0] > 9e5


def test_an_id_the_models_own_tokenizer_gives_past_the_embedding_names_the_tokenizer(saved, tmp_path):
    from transformers import AutoTokenizer

    path = _copy(saved, tmp_path)  # "pass ids from m.to_tokens(text)": they came from it
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(["<zz>"])
    tok.save_pretrained(path)
    m = mk.load_model(path)
    with pytest.raises(MechkitError, match="tokenizer gives '<zz>' id 259.*not the one these weights"):
        m(m.to_tokens("a <zz> b"))
    with pytest.raises(MechkitError, match="outside the model's vocabulary"):  # ids it does not give: as before
        m(torch.tensor([[1, 9999]]))


def test_a_budget_no_plan_can_reach_does_not_say_raise_it():
    from mechkit.pruning.study import budget_fix

    fix = budget_fix(["neurons"], [{"cost_ratio": 1.12}, {"cost_ratio": 1.3}])  # --budget < 1 cannot reach 1.12
    assert "raise --budget" not in fix and "--budget-unit flops" in fix and "1.12" in fix
    assert "--budget-unit" not in budget_fix(["neurons"], [{"cost_ratio": 1.0}], unit="flops")
    assert budget_fix(["neurons"], [{"cost_ratio": 0.6}]).startswith("raise --budget")


# ---- class 5: artifacts know what they belong to -------------------------------------------------------

def test_a_task_vector_of_other_weights_is_refused_in_another_dtype(tmp_path):
    from mechkit.taskarith.apply import model_base
    from mechkit.taskarith.checks import base_mismatch

    ours, other = mk.load_model("tiny:llama"), mk.load_model(tiny_model("llama", seed=7)[0])
    recorded = model_base(ours)  # as taskvec extract records it, in float32
    for dtype in ("bfloat16", "float16"):  # the hashes differ by dtype: the architecture alone decided
        assert base_mismatch(recorded, model_base(mk.load_model(other.model, dtype=dtype)))
        assert base_mismatch(recorded, model_base(mk.load_model(tiny_model("llama")[0], dtype=dtype))) is None


def test_an_extracted_task_vector_records_its_bases_values(tmp_path):
    from mechkit.taskarith.extract import extract

    base, tok = tiny_model("llama")
    ft, _ = tiny_model("llama")
    with torch.no_grad():
        ft.model.norm.weight.add_(0.01)
    ft.save_pretrained(tmp_path / "ft")
    tok.save_pretrained(tmp_path / "ft")
    vec = extract(mk.load_model(base), tmp_path / "ft", tasks=["capitalize"])
    probe = vec.meta["base"]["probe"]
    assert probe and "probe" not in vec.summary()["base"]  # kept for the check, not printed


def test_an_activation_vector_refuses_another_tokenizer_and_names_another_dtype(llama):
    from mechkit.actvec import ActivationVector
    from mechkit.model.checks.identity import config_sha256, tokenizer_sha256

    vec = ActivationVector(torch.zeros(2, 64), "task-vector", "capitalize", 0, "replace",
                           model_sha256=llama.weights_sha256(), model_config_sha256=config_sha256(llama.model),
                           model_dtype="float32", model_tokenizer_sha256=tokenizer_sha256(llama.tokenizer))
    vec.check(llama)
    left = mk.load_model("tiny:llama")
    left.tokenizer.padding_side = "left"  # other padded batches: other activations
    with pytest.raises(MechkitError, match="another tokenizer"):
        vec.check(left)
    with pytest.raises(MechkitError, match="in float32.*bfloat16.*--dtype float32"):  # not "other weights"
        vec.check(mk.load_model("tiny:llama", dtype="bfloat16"))


# ---- class 7: the model-unchanged check must not be fooled ---------------------------------------------

class _Leaves(Plugin):
    name = "rt8b-leaves"
    version = "0.1"
    summary = "leaves something of the handle changed"
    options = (mk.Option("what", str, "anatomy", "what to leave changed"),)

    def run(self, ctx):
        m, what = ctx.model, ctx.options["what"]
        if what == "anatomy":
            m.anatomy.n_heads = 2
        elif what == "layers":
            m.anatomy.layers.pop()
        elif what == "generation":
            m.model.generation_config.repetition_penalty = 5.0
        elif what == "sha":
            m._sha256 = "0" * 64
        elif what == "spec":
            m.spec = "tiny:gpt2"
        return Result(results={"ok": 1})


@pytest.mark.parametrize("what, said", [("anatomy", "anatomy"), ("layers", "anatomy"),
                                        ("generation", "generation_config field repetition_penalty"),
                                        ("sha", "hash it remembers"), ("spec", "handle.spec")])
def test_a_run_that_leaves_the_handle_changed_is_refused(what, said):
    with pytest.raises(PluginError, match=said):
        mk.run(_Leaves, model=mk.load_model("tiny:llama"), write=False, what=what)


def test_a_run_that_leaves_nothing_changed_still_passes():
    assert mk.run(_Leaves, model=mk.load_model("tiny:llama"), write=False, what="nothing").results == {"ok": 1}


# ---- class 4: resume keys cover everything that decides a result ---------------------------------------

def test_the_resume_key_covers_libraries_attention_and_backend(llama, monkeypatch):
    from mechkit import runner

    key = runner.run_model_key(llama)
    assert key["attn_implementation"] == str(llama.model.config._attn_implementation)
    assert key["backend"] == "native"
    cls = mk.Plugin
    before = runner.resume_dir(cls, key, {}, 0)
    monkeypatch.setattr(runner, "library_versions", lambda: {"torch": "0", "transformers": "0"})
    assert runner.resume_dir(cls, key, {}, 0) != before  # an upgrade between a kill and the rerun


# ---- class 8: the Python API refuses what it ignores -----------------------------------------------------

@pytest.mark.parametrize("extra", [{"top_k": 3}, {"scores": {"induction": [[0.0] * 4] * 2}}])
def test_ablate_refuses_a_pick_among_heads_it_names_one_by_one(llama, extra):
    with pytest.raises(MechkitError, match="would be ignored"), mk.ablate(llama, heads="0.1", **extra):
        pass
    with pytest.raises(MechkitError, match="would be ignored"), mk.ablate(llama, heads=[(0, 1)], **extra):
        pass


def test_ablate_still_takes_top_k_for_ranked_heads_and_a_reference_in_a_mode_loop(llama):
    with mk.ablate(llama, heads="random", top_k=2) as hs:
        assert len(hs) == 2
    ids = llama.to_tokens("hello there")
    for mode in ("zero", "mean"):  # one reference for every mode: accepted
        with mk.ablate(llama, heads="0.1", mode=mode, reference=ids):
            llama(ids)
