"""The third (confirming) red-team pass of issue 32, on the surface that landed after the second: physically
pruned models in the plugins, ``select-tasks --representation lora-grad`` and tools/taskselect_rho.py.

Each test holds one class of failure the pass found, with several instances: a hand-edited
``mechkit_pruning`` entry in ``config.json`` that loaded anyway (a wrong layer count built a model whose
anatomy claimed dense heads, and the first plugin crashed) or was refused with Python's words, a
``taskvec apply`` to a pruned base that wrote a directory that does not load, ``--layer`` read modulo the
layer count (``--layer 40`` on a 2-layer model silently embedded block 0), and the ρ tool raising
KeyError or TypeError on a damaged report.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.edit.surgery import CONFIG_KEY
from tests.test_pruned_models import EVEN, UNEVEN, _pruned, _tiny_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense 3-layer tiny Llama, its unevenly head-pruned and its evenly pruned (a layer removed) copies."""
    root = tmp_path_factory.mktemp("rt3")
    dense = _tiny_dir(root / "dense")
    return dense, _pruned(dense, UNEVEN, root / "uneven"), _pruned(dense, EVEN, root / "even")


# ---- class 2: a pruned model's config entry decides the model built; a hand edit is refused ---------------

def _edited(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config, config.get(CONFIG_KEY))
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("which,edit,words", [
    ("uneven", lambda c, p: p.update(n_layers=5), "n_layers 5, but the config builds 3 layers"),
    ("uneven", lambda c, p: p["head_keep"].update({"0": [2, 2]}), "head_keep[0] = [2, 2]"),
    ("uneven", lambda c, p: p["head_keep"].update({"0": [2, 7]}), "head_keep[0] = [2, 7]"),
    ("uneven", lambda c, p: p["head_keep"].update({"0": []}), "head_keep[0] = []"),
    ("uneven", lambda c, p: p["head_keep"].update({"7": [0, 1]}), "head_keep names layer 7"),
    ("uneven", lambda c, p: p["head_keep"].update({"0": [True, 3]}), "head_keep[0] is not a list of integers"),
    ("uneven", lambda c, p: p.update(config_restore={"num_hidden_layers": 99}), "config_restore num_hidden_layers=99"),
    ("uneven", lambda c, p: c.update({CONFIG_KEY: "yes"}), "malformed: not an object"),
    ("uneven", lambda c, p: p.update(n_layers="three"), "malformed: not an object"),
    ("even", lambda c, p: p.update(layers_removed=[1, 1]), "layers_removed [1, 1]"),
    ("even", lambda c, p: p["mlp_keep"].update({"1": list(range(10))}), "mlp_keep names layer 1"),
    ("even", lambda c, p: p.update(config_restore={"num_hidden_layers": 2}), "config_restore num_hidden_layers=2"),
])
def test_a_hand_edited_pruning_entry_is_refused_in_one_line_naming_the_fix(models, tmp_path, which, edit, words):
    src = models[1] if which == "uneven" else models[2]
    with pytest.raises(MechkitError) as err:
        mk.load_model(str(_edited(src, tmp_path / "m", edit)), device="cpu")
    line = str(err.value)
    assert "\n" not in line and words in line and "mechkit prune --save-model" in line, line


@pytest.mark.parametrize("edit,tensor", [
    (lambda c, p: p["head_keep"].update({"0": [2]}), "model.layers.0.self_attn.q_proj.weight"),
    (lambda c, p: p.update(mlp_keep={"0": list(range(100))}), "model.layers.0.mlp.gate_proj.weight"),
    (lambda c, p: p.update(layers_removed=[1]), "model.layers.1.self_attn.q_proj.weight"),
])
def test_an_entry_that_loads_other_shapes_names_the_tensor_not_torchs_header(models, tmp_path, edit, tensor):
    with pytest.raises(MechkitError) as err:
        mk.load_model(str(_edited(models[1], tmp_path / "m", edit)), device="cpu")
    assert f"size mismatch for {tensor}" in str(err.value) and "Error(s) in loading" not in str(err.value)


def test_every_pruned_model_mechkit_saves_still_loads(models, tmp_path):
    """The check refuses edits only: the pruned models of the plugins' tests (GPT-2's aliased layer count
    included, written before the fix with the kept count) load as before."""
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    assert mk.load_model(str(models[1]), device="cpu").anatomy.head_counts == (2, 4, 2)
    assert mk.load_model(str(models[2]), device="cpu").anatomy.n_layers == 2
    gpt2 = mk.load_model(str(_tiny_dir(tmp_path / "g", "gpt2")), device="cpu")
    saved = save_pruned(prune_copy(gpt2, UnitsToRemove(heads={1: [0, 2, 3]}, layers=[2])), tmp_path / "gp")
    entry = json.loads((saved / "config.json").read_text())[CONFIG_KEY]
    assert entry["config_restore"] == {"num_hidden_layers": 3, "n_layer": 3}  # the dense count, both names
    assert mk.load_model(str(saved), device="cpu").anatomy.head_counts == (4, 1)
    legacy = _edited(saved, tmp_path / "legacy", lambda c, p: p["config_restore"].update(n_layer=2))
    assert mk.load_model(str(legacy), device="cpu").anatomy.head_counts == (4, 1)


# ---- class 9 (and 1): every writer of a model directory writes one that loads -----------------------------

@pytest.mark.parametrize("which", [1, 2])
def test_taskvec_apply_to_a_pruned_base_writes_a_pruned_model_that_reloads(models, tmp_path, which):
    from mechkit.taskarith import TaskVector, save_merged

    base = mk.load_model(str(models[which]), device="cpu")
    name = "model.layers.0.self_attn.o_proj.weight"
    delta = torch.full_like(base.model.state_dict()[name], 1e-3)
    out = save_merged(base, TaskVector({name: delta}, {"tasks": ["capitalize"]}), tmp_path / "merged",
                      allow_other_base=True)
    again = mk.load_model(str(out), device="cpu")
    assert again.anatomy.as_dict() == base.anatomy.as_dict()
    torch.testing.assert_close(again.model.state_dict()[name], base.model.state_dict()[name] + delta)
    ids = base.to_tokens("abc")
    other = copy.deepcopy(base.model.state_dict())
    other[name] = other[name] + delta
    base.model.load_state_dict(other)
    assert torch.equal(again(ids), base(ids))


# ---- class 2/11: a --layer outside the model is refused, never read modulo the layer count ----------------

@pytest.mark.parametrize("layer", [2, 40, -3, -50])
def test_a_select_tasks_layer_outside_the_model_is_refused_naming_the_range(layer):
    from mechkit.taskselect.representations import task_features

    handle = mk.load_model("tiny:llama", device="cpu")  # 2 blocks
    with pytest.raises(MechkitError, match=rf"--layer {layer} is outside the model's 2 blocks — pass --layer 0 to 1"):
        task_features(handle, ["capitalize", "swap"], n=2, layer=layer)


def test_the_layers_inside_the_model_still_embed_their_block():
    from mechkit.taskselect.representations import task_features

    handle = mk.load_model("tiny:llama", device="cpu")
    last, one = (task_features(handle, ["capitalize", "swap"], n=2, layer=x, center=False) for x in (-1, 1))
    assert all((last[t].vector == one[t].vector).all() for t in last)


@pytest.mark.parametrize("blocks", [-1, -2])
def test_negative_grad_blocks_are_refused_wherever_features_are_computed(blocks):
    from mechkit.taskselect.representations import task_features

    handle = mk.load_model("tiny:llama", device="cpu")
    with pytest.raises(MechkitError, match=rf"--grad-blocks {blocks} is below 0"):
        task_features(handle, ["capitalize", "swap"], representation="lora-grad", n=2, grad_blocks=blocks)


# ---- class 10: a damaged select-tasks report is one line in the ρ tool -----------------------------------

def _report() -> dict:
    gain = {"capitalize": 0.1, "swap": 0.3}
    return {"plugin": "select-tasks", "model": {"spec": "tiny:llama"},
            "results": {"features": {"representation": "hidden", "n": 4, "layer": 1, "seed": 0},
                        "targets": {"past-tense": {"selection": {"order": ["capitalize", "swap"], "p": 0.1},
                                                   "transfer": {"tasks": ["capitalize", "swap"],
                                                                "gain": {"0-shot": gain}}}}}}


@pytest.mark.parametrize("tamper,words", [
    (lambda r: r.pop("results"), "no results.features"),
    (lambda r: r["results"].pop("features"), "no results.features"),
    (lambda r: r.update(model={}), "no model.spec"),
    (lambda r: r["results"]["targets"]["past-tense"].pop("selection"), "has no selection order"),
    (lambda r: r["results"]["targets"]["past-tense"]["transfer"]["gain"]["0-shot"].update(nope=1.0),
     "transfer gains are not one per selected task"),
    (lambda r: r["results"]["targets"]["past-tense"]["transfer"].update(tasks=["capitalize", "swap", "x"]),
     "transfer gains are not one per selected task"),
])
def test_a_damaged_report_is_one_line_in_the_rho_tool(tmp_path, tamper, words):
    from mechkit.taskselect.rho import load_report

    report = _report()
    load_report(_write(tmp_path / "whole.json", report))  # the untampered one is accepted
    tamper(report)
    with pytest.raises(MechkitError, match="is not a whole select-tasks report: .*" + words):
        load_report(_write(tmp_path / "report.json", report))


@pytest.mark.parametrize("key,value", [("n", "x"), ("layer", 1.5), ("center", "yes"), ("representation", 3)])
def test_a_feature_setting_of_the_wrong_type_is_one_line(key, value):
    from mechkit.taskselect.rho import feature_config

    report = _report()
    report["results"]["features"][key] = value
    with pytest.raises(MechkitError, match=rf"features.{key} is {value!r}"):
        feature_config(report, "hidden")


def _write(path, report):
    path.write_text(json.dumps(report))
    return path


# ---- class 9 (silently wrong): pruning a neuron- or head-pruned model again lost what it keeps -------------

@pytest.mark.parametrize("which,plan", [
    (1, dict(heads={1: [0, 1]})),  # the copy claimed (4, 2, 4) heads: layers 0 and 2 hold 2
    (1, dict(layers=[0])),  # claimed (4, 4): dense layer 2 holds 2
    (2, dict(mlp={0: [0, 1]})),
    (2, dict(layers=[0])),  # claimed the dense 4 heads of 2
])
def test_prune_copy_of_a_model_with_pruned_units_is_refused(models, which, plan):
    from mechkit.pruning import prune_copy
    from mechkit.pruning.plan import UnitsToRemove

    with pytest.raises(MechkitError, match="had neurons or heads pruned already.*prune the dense model"):
        prune_copy(mk.load_model(str(models[which]), device="cpu"), UnitsToRemove(**plan))


# ---- class 6 (read as wrong): reports of a pruned and a dense model side by side -------------------------

def test_compare_says_each_run_numbers_its_own_models_heads(models, tmp_path):
    """Ranked heads of a pruned model are in its own numbering (its 0.1 is the dense 0.3): the settings say
    which head counts each column's labels count in, and say nothing where the models agree."""
    from mechkit.report.compare import compare_runs

    runs = [mk.run("detect", model=str(m), out=tmp_path / name, device="cpu", n_seqs=3, seg_len=5).out_dir
            for m, name in ((models[0], "dense"), (models[1], "uneven"), (models[0], "again"))]
    row = next(r for r in compare_runs(runs[:2]).settings.rows if str(r[0]).startswith("heads per layer"))
    assert row[1:] == ["4 in each of 3", "2,4,2"]
    assert not any(str(r[0]).startswith("heads per layer") for r in compare_runs([runs[0], runs[2]]).settings.rows)


@pytest.mark.parametrize("which", [1, 2])
def test_a_pruned_model_saved_in_shards_reloads(models, tmp_path, which):
    """save_pretrained shards a large model (a fine-tuned pruned one too): the pruned loader reads the index."""
    from mechkit.model.edit.surgery import save_model_files

    handle = mk.load_model(str(models[which]), device="cpu")
    save_model_files(handle.model, tmp_path / "m", max_shard_size="100KB")
    handle.tokenizer.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m" / "model.safetensors").exists()
    again = mk.load_model(str(tmp_path / "m"), device="cpu")
    ids = handle.to_tokens("abcabc")
    assert again.anatomy.as_dict() == handle.anatomy.as_dict() and torch.equal(again(ids), handle(ids))


def test_weights_that_do_not_fit_the_entry_name_the_weights_as_the_fix(models, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = _edited(models[1], tmp_path / "m", lambda c, p: None)
    state = load_file(str(bad / "model.safetensors"))
    del state["model.layers.2.mlp.up_proj.weight"]
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MechkitError, match=r"missing \['model.layers.2.mlp.up_proj.weight'\].*use the weights saved "
                                           "with this config.json"):
        mk.load_model(str(bad), device="cpu")


# ---- class 8: functions that take Head objects refuse a head the model does not have ----------------------

def _zero(handle, head):
    with mk.edit_weights(handle) as w:
        w.zero_head_output(head)


def _shuffle(handle, head):
    from mechkit.interventions.shuffle import shuffle_heads
    from mechkit.model.headspec import Head

    with shuffle_heads(handle, {head: Head(1, 0), Head(1, 0): head}, component="qkov"):
        pass


def _patterns(handle, head):
    from mechkit.report.patterns import record_patterns

    record_patterns(handle, handle.to_tokens("abcab"), [head])


@pytest.mark.parametrize("call", [_zero, _shuffle, _patterns])
@pytest.mark.parametrize("which,layer,head", [
    ("uneven", 0, 3),  # past layer 0's 2 kept heads: zeroing sliced nothing, silently
    ("uneven", 5, 0),  # IndexError
    ("dense", 0, 9),  # silently nothing
    ("dense", -1, 0),  # silently the last layer's head
])
def test_a_head_object_the_model_lacks_is_refused_and_nothing_changes(models, call, which, layer, head):
    from mechkit.errors import HeadSpecError
    from mechkit.model.headspec import Head

    handle = mk.load_model(str(models[1] if which == "uneven" else models[0]), device="cpu")
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    with pytest.raises(HeadSpecError, match=rf"head {layer}\.{head} is out of range"):
        call(handle, Head(layer, head))
    assert all(torch.equal(before[k], v) for k, v in handle.model.state_dict().items())


@pytest.mark.parametrize("which,edit", [
    (1, lambda c, p: c.pop(CONFIG_KEY)),  # a pruned model's entry removed: transformers said "see the report above"
    (0, lambda c, p: c.update(intermediate_size=100)),  # a dense model's config edited
])
def test_weights_of_other_shapes_than_the_config_are_one_line_naming_the_config(models, tmp_path, which, edit):
    from mechkit.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as err:
        mk.load_model(str(_edited(models[which], tmp_path / "m", edit)), device="cpu")
    assert "do not have the shapes its config.json gives them" in str(err.value) and "above" not in str(err.value)


# ---- class 11: an --out that is an input names that, not --force (which would be refused too) -------------

@pytest.mark.parametrize("kind,where", [("dir", "."), ("dir", "sub/.."), ("file", "model.safetensors")])
def test_an_existing_out_that_is_an_input_is_not_told_to_pass_force(models, kind, where):
    from mechkit.io import check_out

    model = models[1]
    for force in (False, True):  # the same line with or without --force: the fix must work
        with pytest.raises(MechkitError) as err:
            check_out(model / where, force, kind=kind, inputs=(model,))
        assert "--force" not in str(err.value) and "which the run reads" in str(err.value)
