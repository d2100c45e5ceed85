"""Red-team pass 20 (b2): finetune's weight decay refused up front and named when training diverges, adapt's too few
margin prompts refused before the load with a count that runs on any model, a scheduler.json's layer keys, head
indices and unknown keys checked, and shuffle's --top-k 1 refused before the load."""

from __future__ import annotations

import copy
import json
import re

import pytest

import mechkit as mk
import mechkit.registry
from mechkit.errors import MechkitError
from mechkit.options.option import OptionError
from mechkit.options.resolve import resolve_options


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


def _flag(text: str, flag: str) -> str:
    """The value a fix gives ``flag`` (the first one it names)."""
    return re.search(rf"{flag} (\S+)", text).group(1)


# ---- F6: AdamW's decoupled decay with lr·weight_decay ≥ 1 refused before the load; divergence names the settings ----


@pytest.mark.parametrize("lr,decay", [(1e-6, 1e30), (1e-3, 1000.0), (0.5, 2.0), (1e-4, 1e4), (2.0, 0.5)])
def test_a_weight_decay_no_step_survives_is_refused_before_the_load_with_a_fix_that_parses(lr, decay):
    plugin = mechkit.registry.get("finetune")
    with pytest.raises(OptionError, match="--weight-decay") as err:
        resolve_options(plugin, {"lr": lr, "weight_decay": decay})
    assert "decoupled" in err.value.problem and f"--lr {lr:g}" in err.value.problem
    fixed = float(_flag(err.value.fix, "--weight-decay"))
    assert lr * fixed <= 0.1
    resolve_options(plugin, {"lr": lr, "weight_decay": fixed})  # the fix, applied literally


@pytest.mark.parametrize("lr,decay", [(1e-4, 0.01), (0.5, 1.9), (1e-6, 1e5)])
def test_a_weight_decay_below_one_over_lr_is_accepted(lr, decay):
    resolve_options(mechkit.registry.get("finetune"), {"lr": lr, "weight_decay": decay})


def test_the_fixed_weight_decay_trains(llama):
    from mechkit.taskarith.finetune import Recipe, decay_problem, finetune

    with pytest.raises(MechkitError, match="decoupled weight decay"):  # the library refuses it too, before the copy
        finetune(llama, Recipe(task="capitalize", steps=3, batch_size=2, lr=1e-6, weight_decay=1e30))
    fixed = float(_flag(decay_problem(1e-6, 1e30)[1], "--weight-decay"))
    out = finetune(llama, Recipe(task="capitalize", steps=3, batch_size=2, lr=1e-6, weight_decay=fixed))
    assert len(out.losses) == 3


@pytest.mark.parametrize("method", ["full", "lora"])
def test_divergence_names_every_setting_of_the_update(llama, method):
    from mechkit.taskarith.finetune import Recipe, finetune

    with pytest.raises(MechkitError, match="training diverged") as err:
        finetune(llama, Recipe(task="capitalize", steps=3, batch_size=2, lr=1e30, method=method, weight_decay=1e-31))
    for part in ("--lr 1e+30", "--weight-decay 1e-31", "--batch-size 2", f"--method {method}"):
        assert part in err.value.problem
    assert "--weight-decay" in err.value.fix
    assert ("--lora-alpha" in err.value.problem and "--lora-alpha" in err.value.fix) == (method == "lora")


# ---- F7: too few given margin prompts refused before the load, with a count that runs whatever the plans ----------

BASE = {"budgets": "0.7,1.0", "prune_budgets": "", "token_layers": ""}


@pytest.mark.parametrize("tasks,adherence,given,plans,count", [
    ("capitalize,past-tense", 0.999, 2, 10, 500), ("capitalize", 0.99, 5, 10, 99), ("capitalize,past-tense", 0.99, 4, 10, 50),
    ("capitalize,past-tense,lowercase", 0.9, 1, 2, 3)])
def test_too_few_margin_prompts_are_refused_before_the_load_naming_a_count_for_any_model(tasks, adherence, given,
                                                                                        plans, count):
    plugin = mechkit.registry.get("adapt")
    options = {**BASE, "tasks": tasks, "adherence": adherence, "margin_prompts": given, "margin_plans": plans}
    with pytest.raises(MechkitError, match="residuals") as err:
        resolve_options(plugin, options)
    assert int(_flag(err.value.fix, "--margin-prompts")) == count
    assert "leave --margin-prompts out" in err.value.fix
    resolve_options(plugin, {**options, "margin_prompts": count})  # the fix passes the check that refused it


@pytest.mark.parametrize("n_plans", [1, 2, 3, 10])
def test_the_suggested_margin_prompts_pass_every_check_whatever_plans_the_model_offers(llama, n_plans):
    from mechkit.adapt import AdaptStudy

    options = {**BASE, "tasks": "capitalize,past-tense", "adherence": 0.99, "margin_prompts": 4}
    with pytest.raises(MechkitError) as err:
        resolve_options(mechkit.registry.get("adapt"), options)
    n = int(_flag(err.value.fix, "--margin-prompts"))
    study = AdaptStudy(llama, ["capitalize", "past-tense"], n_calib=2, n=2, shots=1, repeats=1, token_options=(),
                       margin_prompts=n)
    assert [len(xs) for xs in study.margin_texts.values()] == [n, n]
    study.check_margin_sample()
    study._check_plan_count(n_plans)  # before: 50 passed the first check and was refused here with 2 plans


def test_enough_margin_prompts_for_the_plans_asked_are_left_to_the_load():
    resolve_options(mechkit.registry.get("adapt"), {**BASE, "tasks": "capitalize,past-tense", "margin_prompts": 5})
    resolve_options(mechkit.registry.get("adapt"), {**BASE, "tasks": "capitalize", "margin": 0.05})


def test_the_suggested_margin_prompts_run(tmp_path):
    options = {**BASE, "tasks": "capitalize", "calib": 2, "n": 2, "shots": 1, "repeats": 1, "adherence": 0.9,
               "margin_plans": 2}
    with pytest.raises(MechkitError, match="residuals") as err:  # before the load: no model of that name is needed
        mk.run("adapt", model="tiny:no-such-model", margin_prompts=1, out=tmp_path / "a", **options)
    n = int(_flag(err.value.fix, "--margin-prompts"))
    run = mk.run("adapt", model="tiny:llama", margin_prompts=n, out=tmp_path / "b", **options)
    assert run.results["margin_calibration"]["n"] >= 9


# ---- F10, F11: a scheduler.json's layer keys, head indices and unknown keys -------------------------------------


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory):
    from mechkit.adapt import ExecutionPlan, TokenSelection
    from tests.conftest import small_scheduler

    return small_scheduler(llama, ExecutionPlan(heads={1: (0,)}, tokens=TokenSelection(0, 0.5, tail=3))), tmp_path_factory.mktemp("sched")


def _edit(data: dict, path: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = path.split("/")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return data


def _refused(llama, folder, data, field: str, words: str) -> None:
    from mechkit.adapt import adaptive

    bad = folder / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(MechkitError) as err, adaptive(llama, budget=0.7, scheduler=bad):
        llama(llama.to_tokens("input: cat\noutput:"))
    assert str(bad) in err.value.problem and f" {field} " in f" {err.value.problem}" and words in err.value.problem
    assert "\n" not in str(err.value)


def test_the_file_as_written_loads_and_runs(llama, saved):
    from mechkit.adapt import adaptive

    data, folder = saved
    good = folder / "good.json"
    good.write_text(json.dumps(data))
    with adaptive(llama, budget=0.7, scheduler=good) as run:
        llama(llama.to_tokens("input: cat\noutput:"))
    assert run.log


@pytest.mark.parametrize("layer", ["²", "١", "１", "01", "00"])
def test_a_layer_key_that_is_not_a_layer_number_in_ascii_digits_is_refused(llama, saved, layer):
    data, folder = saved
    for key in ("heads", "mlp"):
        _refused(llama, folder, _edit(data, f"candidates/1/plan/{key}", {layer: [0]}), f"candidates[1].plan.{key}",
                 "not a block of the model")


@pytest.mark.parametrize("path,value,field", [
    ("candidates/1/plan/tokens/heads", [99], "candidates[1].plan.tokens.heads[0]"),
    ("candidates/1/plan/tokens/heads", [0, 4], "candidates[1].plan.tokens.heads[1]"),
    ("candidates/1/plan/heads", {"1": [0, 99]}, "candidates[1].plan.heads['1'][1]"),
    ("candidates/1/plan/mlp", {"1": [10 ** 6]}, "candidates[1].plan.mlp['1'][0]")])
def test_head_and_channel_indices_past_the_models_widths_are_refused(llama, saved, path, value, field):
    data, folder = saved
    _refused(llama, folder, _edit(data, path, value), field, "outside 0..")


def test_token_heads_within_the_model_are_accepted(llama, saved):
    from mechkit.adapt import adaptive

    data, folder = saved
    ok = folder / "ok.json"
    ok.write_text(json.dumps(_edit(data, "candidates/1/plan/tokens/heads", [0, 3])))
    with adaptive(llama, budget=0.7, scheduler=ok):
        llama(llama.to_tokens("input: cat\noutput:"))


@pytest.mark.parametrize("path,field", [
    ("extra", "the file"), ("model/Extra", "model"), ("cost/alpha", "cost"), ("signal/bias", "signal"),
    ("candidates/0/weight", "candidates[0]"), ("candidates/1/plan/Heads", "candidates[1].plan"),
    ("candidates/1/plan/tokens/Keep", "candidates[1].plan.tokens")])
def test_an_unknown_key_is_refused_at_every_level_with_the_known_ones(llama, saved, path, field):
    data, folder = saved
    _refused(llama, folder, _edit(data, path, {"1": [0]}), field, "unknown key")


# ---- F15: shuffle's ranked spec with --top-k 1 refused before the load -------------------------------------------


@pytest.mark.parametrize("options", [{"top_k": 1}, {"heads": "random", "top_k": 1},
                                     {"heads": "previous-token,previous-token", "top_k": 1},
                                     {"heads": "duplicate-token", "top_k": 1}])
def test_shuffle_refuses_a_top_k_that_names_one_head_before_the_load(options):
    plugin = mechkit.registry.get("shuffle")
    with pytest.raises(OptionError, match="names at most 1 head") as err:
        resolve_options(plugin, options)
    resolve_options(plugin, {**options, "top_k": int(_flag(err.value.fix, "--top-k"))})  # the fix, literally


@pytest.mark.parametrize("options", [{"top_k": 2}, {"heads": "induction,0.1", "top_k": 1},
                                     {"heads": "induction,layer:0", "top_k": 1}, {"heads": "induction,random", "top_k": 1}])
def test_shuffle_leaves_specs_the_model_decides_to_the_load(options):
    resolve_options(mechkit.registry.get("shuffle"), options)


def test_shuffles_top_k_fix_runs(llama):
    with pytest.raises(OptionError) as err:
        resolve_options(mechkit.registry.get("shuffle"), {"heads": "random", "top_k": 1})
    k = int(_flag(err.value.fix, "--top-k"))
    run = mk.run("shuffle", model=llama, heads="random", top_k=k, tasks="", n_seqs=4, seg_len=5, seeds=1, write=False)
    assert len(run.results["conditions"][1]["heads"]) == 2
