"""Red-team pass 9 (issue 32), classes 2, 4, 5, 7, 8, 9 and 11: what still failed, fixed as a class.

Each test names the case that failed before its fix. Tiny models only.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from mechkit.model.sources.tiny import tiny_model
from mechkit.plugin import Plugin, Result


@pytest.fixture
def many_shards(tmp_path):
    """tiny:llama saved in several shards (with its tokenizer) and the name of the shard holding lm_head."""
    path = tmp_path / "sharded"
    model, tok = tiny_model("llama")
    model.save_pretrained(path, max_shard_size="100KB")
    tok.save_pretrained(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return path, index["weight_map"]["lm_head.weight"]


def _rewrite_index(path, fn):
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"] = fn(index["weight_map"])
    index_file.write_text(json.dumps(index))


# ---- class 2: never compute on weights the user did not give ------------------------------------------

@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_an_index_naming_a_shard_outside_the_directory_is_refused(many_shards, tmp_path, where):
    path, shard = many_shards
    outside = tmp_path / "elsewhere.safetensors"  # other values: the model would silently compute on them
    save_file({k: v * 0 + 7 for k, v in load_file(path / shard).items()}, outside)
    (path / shard).unlink()
    name = "../elsewhere.safetensors" if where == "relative" else str(outside)
    _rewrite_index(path, lambda wm: {k: (name if v == shard else v) for k, v in wm.items()})
    with pytest.raises(MechkitError, match="a path rather than a file in the model's directory") as err:
        mk.load_model(str(path))
    assert name in str(err.value)


def test_a_shard_symlinked_into_the_directory_still_loads(many_shards, tmp_path):
    path, shard = many_shards  # the hub cache's layout: every file a symlink to a blob
    blob = tmp_path / "blob"
    (path / shard).rename(blob)
    (path / shard).symlink_to(blob)
    assert mk.load_model(str(path)).anatomy.n_layers == 2


def test_an_index_whose_weight_map_is_not_an_object_is_one_line_naming_it(many_shards):
    path, _ = many_shards
    _rewrite_index(path, lambda wm: list(wm))
    with pytest.raises(MechkitError, match="weight_map is not an object"):
        mk.load_model(str(path))


@pytest.mark.parametrize("quant", [{"quant_method": "gptq", "bits": 4}, {"quant_method": "bitnet"},
                                   {"quant_method": "compressed-tensors"}])
def test_a_quantization_that_cannot_be_applied_is_named_not_called_corrupt_weights(many_shards, quant):
    path, _ = many_shards
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(MechkitError, match=f"asks for {quant['quant_method']} quantization") as err:
        mk.load_model(str(path))
    assert "corrupt" not in str(err.value) and "mechkit_pruning" not in str(err.value)
    assert "load the original float model" in err.value.fix


# ---- class 4: resume keys cover everything that decides a result ----------------------------------------

def test_a_third_party_plugins_key_covers_mechkits_own_code(tmp_path, monkeypatch):
    from mechkit import plugin_key

    package = tmp_path / "rt9b_elsewhere"  # a plugin package outside mechkit
    package.mkdir()
    (package / "__init__.py").write_text(
        "import mechkit as mk\n\nclass ThirdParty(mk.Plugin):\n    name = 'rt9b-third-party'\n"
        "    version = '0.1'\n    summary = 'x'\n\n    def run(self, ctx):\n        return mk.Result(results={})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from rt9b_elsewhere import ThirdParty

    before = plugin_key.plugin_code(ThirdParty)
    assert before
    real = plugin_key.package_code.__wrapped__
    mechkit_roots = {str(p) for p in sys.modules["mechkit"].__path__}

    def edited(roots):
        return real(roots) + ("-edited" if mechkit_roots & set(roots) else "")

    monkeypatch.setattr(plugin_key, "package_code", edited)  # mechkit's code edited under the same version
    assert plugin_key.plugin_code(ThirdParty) != before


# ---- class 5: saved artifacts know what they belong to --------------------------------------------------

@pytest.fixture(scope="module")
def detect_run(tmp_path_factory):
    return mk.run("detect", model="tiny:llama", n_seqs=2, seg_len=5,
                  out=tmp_path_factory.mktemp("rt9b") / "detect")


def _report_dir(tmp_path, run, change):
    report = json.loads((run.out_dir / "report.json").read_text())
    change(report)
    out = tmp_path / "edited"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(report))
    return out


@pytest.mark.parametrize("change, said", [
    (lambda r: r["model"].pop("weights_sha256"), "does not record the weights it scored"),
    (lambda r: r["model"].__setitem__("weights_sha256", ""), "does not record the weights it scored"),
    (lambda r: r.__setitem__("plugin", "inspect"), "a report of 'inspect', not of detect"),
])
def test_a_detect_report_that_does_not_say_whose_heads_it_scored_is_refused(detect_run, tmp_path, change, said):
    source = _report_dir(tmp_path, detect_run, change)  # before: llama's scores ranked tiny:mistral's heads
    with pytest.raises(MechkitError, match=said):
        mk.run("attention", model="tiny:mistral", write=False, from_report=str(source))


def test_a_detect_report_of_this_model_is_still_taken(detect_run):
    run = mk.run("attention", model="tiny:llama", write=False, from_report=str(detect_run.out_dir))
    assert run.results


# ---- class 7: the model-unchanged check must not be fooled ---------------------------------------------

def _long_only(fn):
    """``fn`` as it is on up to 16 positions (what the probe sees), and zeroed past them."""
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() >= 2 and first.shape[-2] > 16:
            return out * 0 if isinstance(out, torch.Tensor) else out
        return out
    return wrapped


def _swap(what):
    """Replace, for good, one piece of code the model's forward runs; returns the undo."""
    import transformers.masking_utils as masking
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama import modeling_llama

    if what == "registry":
        old = ALL_ATTENTION_FUNCTIONS["sdpa"]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = _long_only(old)
        return lambda: ALL_ATTENTION_FUNCTIONS.__setitem__("sdpa", old)
    owner, name = {"module-function": (modeling_llama, "apply_rotary_pos_emb"),
                   "class-method": (modeling_llama.LlamaMLP, "forward"),
                   "torch-function": (torch.nn.functional, "silu"),
                   "mask": (masking, "sdpa_mask")}[what]
    old = getattr(owner, name)
    setattr(owner, name, _long_only(old))
    return lambda: setattr(owner, name, old)


class _Swaps(Plugin):
    name = "rt9b-swaps"
    version = "0.1"
    summary = "replaces code the model runs and leaves it replaced"
    options = (mk.Option("what", str, "nothing", "what to replace"),)
    undo = None

    def run(self, ctx):
        if ctx.options["what"] != "nothing":
            type(self).undo = _swap(ctx.options["what"])
        return Result(results={"ok": 1})


@pytest.mark.parametrize("what, said", [
    ("registry", r"ALL_ATTENTION_FUNCTIONS\['sdpa'\] was replaced"),
    ("module-function", "modeling_llama.apply_rotary_pos_emb was replaced"),
    ("class-method", "LlamaMLP.forward was replaced"),
    ("torch-function", "torch.nn.functional.silu was replaced"),
    ("mask", "masking_utils.sdpa_mask was replaced"),
])
def test_code_the_model_runs_left_replaced_is_refused(llama, what, said):
    try:
        with pytest.raises(PluginError, match=said) as err:
            mk.run(_Swaps, model=llama, write=False, what=what)
        assert "restart the Python process" in err.value.fix  # reloading the model would not undo it
    finally:
        if _Swaps.undo is not None:
            _Swaps.undo()
            _Swaps.undo = None


def test_a_run_that_replaces_nothing_still_passes(llama):
    assert mk.run(_Swaps, model=llama, write=False).results == {"ok": 1}


# ---- class 8: the Python API restores in any order and refuses what it ignores --------------------------

@pytest.fixture(scope="module")
def traced():
    return mk.load_model("tiny:llama", backend="nnsight")


def test_a_handle_loaded_with_nnsight_runs_without_naming_its_backend_again(traced):
    assert mk.load_model(traced) is traced  # refused before: the default backend "native" differed
    assert mk.run("inspect", model=traced, write=False, batch=1, seq_len=4, repeats=1).results
    assert mk.run("inspect", model=traced, backend="nnsight", write=False, batch=1, seq_len=4, repeats=1).results


def test_another_backend_for_a_loaded_handle_is_refused_with_a_fix_that_works(llama, traced):
    with pytest.raises(MechkitError, match="keeps the backend it was loaded with \\('native'\\)") as err:
        mk.run("inspect", model=llama, backend="nnsight", write=False)
    assert "drop backend=" in err.value.fix
    with pytest.raises(MechkitError, match="keeps the backend it was loaded with \\('nnsight'\\)"):
        mk.load_model(traced, backend="native")


# ---- class 11: every fix a message suggests is right ----------------------------------------------------

@pytest.mark.parametrize("backend", [None, "nnsight"])
def test_a_remote_for_a_loaded_handle_names_the_fix_not_another_refusal(llama, backend):
    # before: "--remote local needs the nnsight backend — add --backend nnsight", which was then refused
    with pytest.raises(MechkitError, match="a loaded handle runs where it was loaded") as err:
        mk.run("inspect", model=llama, remote="local", backend=backend, write=False)
    assert "drop remote=" in err.value.fix


def test_too_few_distinct_margin_plans_are_refused_before_timing_naming_the_prompts_needed():
    from types import SimpleNamespace

    from mechkit.adapt.margin import MarginStage

    study = SimpleNamespace(margin_texts={"a": ["x"] * 4, "b": ["x"] * 4, "c": ["x"] * 4}, adherence=0.99,
                            margin_plan_count=10, margin_prompts=4)  # given: refused (left to the study: more)
    with pytest.raises(MechkitError, match="offers 3 distinct plans") as err:
        MarginStage._check_plan_count(study, 3)  # 12 prompts x 3 plans: 36 < 99 residuals
    assert "--margin-prompts 11" in err.value.fix
    MarginStage._check_plan_count(study, 10)  # 120 residuals: enough


def test_margin_prompts_left_to_the_study_grow_to_what_a_tiny_models_few_plans_need(gpt2):
    """adapt's default --margin-prompts 4 was refused on every tiny model (3 distinct plans: 36 < 99 residuals,
    "pass --margin-prompts 11"): a default that failed on the default tiny models (pass 9b's leftover)."""
    from mechkit.adapt import AdaptStudy

    tasks = ["capitalize", "swap", "opposite"]
    study = AdaptStudy(gpt2, tasks, n=20, shots=7)  # 10 shots' prompts pass tiny:gpt2's 512 positions (refused)
    assert all(len(xs) == 4 for xs in study.margin_texts.values())  # the default on a model with 10 plans
    study.check_margin_sample()  # 3 tasks x 4 prompts x 10 plans: 120 residuals
    study._check_plan_count(3)
    assert [len(xs) for xs in study.margin_texts.values()] == [11, 11, 11]  # 3 x 11 x 3 plans = 99
    held_out = {p.text for ps in study.test.values() for p in ps}
    assert not held_out & {x for xs in study.margin_texts.values() for x in xs}  # never tested on
    assert all(xs == study.margin_pool[t][:11] for t, xs in study.margin_texts.items())
