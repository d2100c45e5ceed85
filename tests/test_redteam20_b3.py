"""Red-team pass 20, batch 3: NumPy switches and seeds, digits that are not ASCII, text that is not UTF-8,
peft adapter layers left in a model, and config.json fields that disagree with the weights.

F8: ``write=np.True_`` was refused with "pass write=False" (the opposite), ``seed=np.array(2)`` refused.
F9: ``seed="²"`` raised ValueError (``'²'.isdigit()`` is true, ``int('²')`` fails).
F12: a prompt with bytes that are not UTF-8 raised the tokenizer's TypeError after the model had loaded.
F13: LoRA layers injected with ``peft.inject_adapter_in_model`` loaded, and prune's surgery raised KeyError.
F14: ``vocab_size``/``pad_token_id`` out of step with the weights, or a ``mechkit_pruning`` entry keyed ``"¹"``,
were reported as corrupt weights ("re-export the directory").
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mechkit as mk
from mechkit.errors import MechkitError

# --- F8: NumPy booleans for the switches, a 0-d array for the seed, fixes that fit what was given ---------------


@pytest.mark.parametrize("switch", [dict(write=np.True_), dict(write=np.array(True)), dict(force=np.True_),
                                    dict(force=np.array(True), write=np.bool_(True))])
def test_numpy_booleans_are_switches(switch, tmp_path):
    run = mk.run("inspect", model="tiny:llama", out=tmp_path / "run", **switch)
    assert (tmp_path / "run" / "report.json").is_file() and run.results["anatomy"]["n_layers"] == 2


@pytest.mark.parametrize("write", [np.False_, np.array(False)])
def test_numpy_false_writes_nothing(write):
    assert mk.run("inspect", model="tiny:llama", write=write).results["anatomy"]["n_layers"] == 2


@pytest.mark.parametrize("value, fix", [("yes", "write=True"), ("on", "write=True"), (np.int64(1), "write=True"),
                                        ("maybe", "write=True or write=False"), (3, "write=True or write=False")])
def test_a_switch_that_is_not_a_bool_gets_the_fix_it_means(value, fix):
    with pytest.raises(MechkitError, match="write must be True or False") as err:
        mk.run("inspect", model="tiny:llama", write=value)
    assert err.value.fix == f"pass {fix}"


@pytest.mark.parametrize("seed, other", [(np.array(2), np.array(True)), (np.array(2, dtype=np.int32), np.array(2.5)),
                                         (np.array(np.uint8(2)), np.array([2]))])
def test_a_0d_integer_array_is_a_seed_and_other_arrays_are_not(seed, other):
    from mechkit.model.headspec import checked_seed

    assert checked_seed(seed) == 2
    assert mk.run("inspect", model="tiny:llama", seed=seed, write=False).results["anatomy"]["n_layers"] == 2
    with pytest.raises(MechkitError, match="seed must be a whole number"):
        mk.run("inspect", model="tiny:llama", seed=other, write=False)


# --- F9: digits int() does not read plainly ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["²", "¹²", "٣", " ³ "])
def test_a_seed_of_other_digits_is_one_line(seed):
    with pytest.raises(MechkitError, match="seed must be a whole number"):
        mk.run("inspect", model="tiny:llama", seed=seed, write=False)
    assert mk.run("inspect", model="tiny:llama", seed=" 12 ", write=False).results["anatomy"]["n_layers"] == 2


@pytest.mark.parametrize("address", ["localhost:²", "host:٣٠٠٠"])
def test_a_ray_port_of_other_digits_is_refused_as_not_host_port(address):
    from mechkit.options.execution import RayAddress

    with pytest.raises(MechkitError, match="is not auto or HOST:PORT"):
        RayAddress()(address)


# --- F12: text that is not UTF-8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, where", [("ab\udcff", "character 3, the byte 0xff"),
                                         (["ok", "x\udcfe"], "text 1, character 2, the byte 0xfe"),
                                         ("\ud800", "character 1")])
def test_to_tokens_refuses_text_that_is_not_utf8(text, where):
    handle = mk.load_model("tiny:llama")
    with pytest.raises(MechkitError, match="not UTF-8") as err:
        handle.to_tokens(text)
    assert where in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("plugin, options, flag", [
    ("attention", dict(prompt="\udcff\udcfe", heads="0.0,0.1"), "--prompt"),
    ("patch", dict(clean="ab\udcff", corrupted="abc", answers="a,b"), "--clean"),
    ("patch", dict(clean="abc", corrupted="ab\udcff", answers="a,b"), "--corrupted"),
    ("patch", dict(clean="abc", corrupted="abd", answers="a,\udcff"), "--answers"),
])
def test_text_options_that_are_not_utf8_are_refused_before_the_load(plugin, options, flag, monkeypatch):
    import mechkit.model.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(loading, "_resolve", no_load)
    with pytest.raises(MechkitError, match=f"{flag} holds bytes that are not UTF-8") as err:
        mk.run(plugin, model="tiny:llama", write=False, **options)
    assert "UTF-8 text" in err.value.fix


def test_the_command_line_refuses_a_prompt_that_is_not_utf8(tmp_path):
    argv = [sys.executable, "-m", "mechkit.cli.main", "attention", "--model", "tiny:llama", "--prompt",
            b"\xff\xfe", "--heads", "0.0,0.1", "--out", str(tmp_path / "x")]
    done = subprocess.run(argv, capture_output=True, timeout=300)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "Traceback" not in err and "--prompt holds bytes that are not UTF-8" in err


# --- F13: peft adapter layers in place of the model's own ----------------------------------------------------------


def _injected(targets):
    peft = pytest.importorskip("peft")
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model("llama")[:2]
    peft.inject_adapter_in_model(peft.LoraConfig(r=2, target_modules=targets, init_lora_weights=False), model)
    return model, tok


@pytest.mark.parametrize("targets", [["q_proj", "up_proj"], ["down_proj"], ["v_proj"]])
def test_injected_lora_layers_are_refused_with_a_fix_that_loads(targets):
    from peft.tuners.tuners_utils import BaseTunerLayer

    model, tok = _injected(targets)
    with pytest.raises(MechkitError, match="peft adapter layer") as err:
        mk.load_model(model, tokenizer=tok)
    assert "get_base_layer()" in err.value.fix and "\n" not in str(err.value)
    for name, layer in [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]:  # the fix
        layer.merge()
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer.get_base_layer())
    handle = mk.load_model(model, tokenizer=tok)
    run = mk.run("prune", model=handle, target="neurons", sparsity="0.5", guide="magnitude", write=False, n=2,
                 calib=2, shots=1, repeats=1, tasks="capitalize", timing_batch=1)
    assert run.results


def test_a_lora_peft_model_gets_fixes_that_load():
    peft = pytest.importorskip("peft")
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model("llama")[:2]
    wrapper = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    for given, what in [(wrapper, "peft wrapper"), (wrapper.base_model, "peft tuner"),
                        (wrapper.get_base_model(), "peft adapter layer")]:
        with pytest.raises(MechkitError, match=what):
            mk.load_model(given, tokenizer=tok)
    mk.load_model(copy.deepcopy(wrapper).merge_and_unload(), tokenizer=tok)
    mk.load_model(copy.deepcopy(wrapper).unload(), tokenizer=tok)
    mk.load_model(copy.deepcopy(wrapper.base_model).unload(), tokenizer=tok)


# --- F14: config.json fields out of step with the weights ----------------------------------------------------------


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    from mechkit.model.sources.tiny import tiny_model

    root = tmp_path_factory.mktemp("dense") / "m"
    model, tok = tiny_model("llama")[:2]
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


def _edited(dense, tmp_path, **fields):
    where = tmp_path / "edited"
    shutil.copytree(dense, where)
    config = json.loads((where / "config.json").read_text())
    config.update(fields)
    (where / "config.json").write_text(json.dumps(config))
    return where


@pytest.mark.parametrize("fields, problem, field, fixed", [
    (dict(vocab_size=100), "gives vocab_size 100, but the weights' embedding (model.embed_tokens.weight) has 259 rows",
     '"vocab_size": 259', dict(vocab_size=259)),
    (dict(vocab_size=300), "gives vocab_size 300", '"vocab_size": 259', dict(vocab_size=259)),
    (dict(pad_token_id=5000), "gives pad_token_id 5000, outside the vocabulary of 259 tokens", '"pad_token_id"',
     dict(pad_token_id=None)),
    (dict(bos_token_id=259), "gives bos_token_id 259", '"bos_token_id"', dict(bos_token_id=-1)),
    (dict(eos_token_id=[257, 900]), "gives eos_token_id 900", '"eos_token_id"', dict(eos_token_id=[257])),
    (dict(pad_token_id="0"), "gives pad_token_id '0', which is not a token id", '"pad_token_id"',
     dict(pad_token_id=0)),
])
def test_config_fields_out_of_step_with_the_weights_are_named(dense, tmp_path, fields, problem, field, fixed):
    where = _edited(dense, tmp_path, **fields)
    with pytest.raises(MechkitError, match="config.json gives") as err:
        mk.load_model(str(where))
    assert problem in str(err.value) and field in err.value.fix and "corrupt" not in str(err.value)
    assert mk.load_model(str(_edited(where, tmp_path / "fixed", **fixed))).anatomy.n_layers == 2  # the fix loads


@pytest.fixture(scope="module")
def pruned(dense, tmp_path_factory):
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    where = tmp_path_factory.mktemp("pruned") / "m"
    save_pruned(prune_copy(mk.load_model(str(dense), device="cpu"), UnitsToRemove(mlp={1: [0, 1, 2]})), where)
    return where


@pytest.mark.parametrize("key", ["¹", "٠", "01", "-1", " 1"])
def test_a_pruning_entry_keyed_by_other_text_is_named(pruned, tmp_path, key):
    from mechkit.model.edit.surgery import CONFIG_KEY

    where = tmp_path / "p"
    shutil.copytree(pruned, where)
    config = json.loads((where / "config.json").read_text())
    entry = config[CONFIG_KEY]
    entry["mlp_keep"] = {key: next(iter(entry["mlp_keep"].values()))}
    (where / "config.json").write_text(json.dumps(config))
    with pytest.raises(MechkitError, match=f"mlp_keep key {key!r} is not a layer number") as err:
        mk.load_model(str(where))
    assert "corrupt" not in str(err.value) and "mechkit_pruning" in str(err.value)
    assert mk.load_model(str(pruned)).anatomy.n_layers == 2  # the entry as saved loads
