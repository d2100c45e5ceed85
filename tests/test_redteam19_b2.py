"""Red-team pass 19 (b2): 0-d NumPy arrays and NumPy booleans as options, a scheduler.json's fields checked, adapt's
default margin prompts growing as documented with fixes that run, shuffle's one named head refused before the load,
peft wrappers and headless bodies refused with the right fix, and a saved pruned model's kinds read from its config."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import mechkit as mk
import mechkit.registry
from mechkit.errors import MechkitError
from mechkit.options.option import Option, OptionError
from mechkit.options.resolve import resolve_options

# ---- F5: a 0-d array is the scalar it holds, for every option kind ------------------------------------------


@pytest.mark.parametrize("value", [np.array(3), np.array(2.5), np.array("0.1"), np.array(True), np.array(-1)])
def test_a_0d_array_as_a_head_spec_is_read_or_refused_in_one_line(value):
    try:  # before: TypeError: iteration over a 0-d array
        _, parsed = resolve_options(mechkit.registry.get("ablate"), {"heads": value})
    except OptionError as err:
        assert "--heads" in str(err)
        assert not isinstance(value.item(), str)  # a number or a bool, never text
        return
    assert parsed["heads"].spec == "0.1"


@pytest.mark.parametrize("kind,value,expected", [
    (int, np.array(3), 3), (float, np.array(2.5), 2.5), (float, np.array(3), 3.0), (str, np.array("x"), "x"),
    (str, np.array(2.5), "2.5"), (bool, np.array(False), False)])
def test_a_0d_array_reads_as_its_item_for_every_kind(kind, value, expected):
    got = Option("o", kind, None).check(value)[0]
    assert got == expected and type(got) is kind


@pytest.mark.parametrize("kind,value", [(int, np.array(2.5)), (int, np.array(True)), (float, np.array("x")),
                                        (str, np.array(True)), (bool, np.array(3)), (int, np.array([[1]]))])
def test_a_0d_array_of_the_wrong_kind_is_refused_in_one_line(kind, value):
    with pytest.raises(OptionError, match="--o "):
        Option("o", kind, None).check(value)


# ---- F6: NumPy booleans for a bool option --------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [(np.bool_(True), True), (np.bool_(False), False), (np.array(True), True),
                                            (np.int64(1), True), (np.int64(0), False), (1, True)])
def test_numpy_booleans_and_0_or_1_are_a_bool_options_values(value, expected):
    params, _ = resolve_options(mechkit.registry.get("prune"), {"save_model": value})
    assert params["save_model"] is expected


@pytest.mark.parametrize("value", [np.int64(2), 2, np.float64(1.0), np.array("yes!")])
def test_other_numbers_stay_refused_for_a_bool_option(value):
    with pytest.raises(OptionError, match="--save-model .* is not true or false"):
        resolve_options(mechkit.registry.get("prune"), {"save_model": value})


# ---- F9: every field of a scheduler.json -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory):
    from mechkit.adapt import ExecutionPlan, TokenSelection
    from tests.conftest import small_scheduler

    return small_scheduler(llama, ExecutionPlan(layers=(1,), tokens=TokenSelection(0, 0.5, tail=3))), tmp_path_factory.mktemp("sched")


def _edit(data: dict, path: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is KeyError:
        del node[last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return data


EDITS = [("schema", "mechkit.other/1", "schema"), ("signal", None, "signal"), ("adherence", 2.0, "adherence"),
         ("adherence", 1.0, "adherence"), ("margin", -0.1, "margin"), ("min_cv", 1.5, "min_cv"),
         ("min_confidence", "high", "min_confidence"), ("select", "loss", "select"), ("tasks", [], "tasks"),
         ("tasks", ["capitalize", "capitalize"], "tasks"), ("cost.beta_attn", "0.3", "cost.beta_attn"),
         ("cost.beta_mlp", -1.0, "cost.beta_mlp"), ("cost.n_layers", 3, "cost.n_layers"), ("cost.rho", 1.5, "cost.rho"),
         ("cost.dense_b", KeyError, "cost.dense_b"), ("signal.layer", 1, "signal.layer"),
         ("signal.classes", ["a", "b"], "signal.classes"), ("signal.scale.0", 0.0, "signal.scale[0]"),
         ("signal.cv_accuracy", 2, "signal.cv_accuracy"), ("signal.intercept", [0.0], "signal.intercept"),
         ("candidates", [], "candidates"), ("candidates.1.plan.tokens.keep", 0.0, "candidates[1].plan.tokens.keep"),
         ("candidates.1.plan.tokens.rank", "first", "candidates[1].plan.tokens.rank"),
         ("candidates.1.plan.layers", [5], "candidates[1].plan.layers[0]"),
         ("candidates.1.plan.layers", [True], "candidates[1].plan.layers[0]"),
         ("candidates.0.accuracy.capitalize", 1.5, "candidates[0].accuracy['capitalize']"),
         ("candidates.1.accuracy.swap", 0.5, "candidates[1].accuracy"),
         ("candidates.0.logprob.capitalize", float("nan"), "candidates[0].logprob['capitalize']"),
         ("candidates.1.bias", "0.01", "candidates[1].bias"), ("candidates.1.source", 3, "candidates[1].source")]


@pytest.mark.parametrize("path,value,field", EDITS, ids=[f"{p}={v!r}" for p, v, _ in EDITS])
def test_a_scheduler_file_field_out_of_type_or_range_is_refused_naming_file_and_field(llama, saved, path, value, field):
    from mechkit.adapt import adaptive

    data, folder = saved
    good = folder / "good.json"
    good.write_text(json.dumps(data))
    with adaptive(llama, budget=0.7, scheduler=good) as run:  # as written: accepted
        llama(llama.to_tokens("input: cat\noutput:"))
    assert run.log
    bad = folder / "bad.json"
    bad.write_text(json.dumps(_edit(data, path, value)))
    with pytest.raises(MechkitError) as err, adaptive(llama, budget=0.7, scheduler=bad):
        pass
    assert str(bad) in err.value.problem and f" {field} " in f" {err.value.problem}"
    assert "\n" not in str(err.value) and "mechkit adapt" in err.value.fix


def test_a_single_task_scheduler_without_a_signal_still_loads(llama, saved):
    from mechkit.adapt import Scheduler

    data, folder = saved
    single = _edit(data, "signal", None)
    single["tasks"] = ["capitalize"]
    for c in single["candidates"]:
        c["accuracy"], c["logprob"] = {"capitalize": c["accuracy"]["capitalize"]}, {}
    path = folder / "single.json"
    path.write_text(json.dumps(single))
    assert Scheduler.load(path).signal is None


# ---- F10a: a saved pruned model's kinds from its config, before the load ---------------------------------------


@pytest.mark.parametrize("entry,kinds", [
    ({"mlp_keep": {"0": [1, 2]}}, {"neurons"}), ({"head_keep": {"0": [0, 1], "1": [0, 1]}}, {"heads"}),
    ({"head_keep": {"0": [0], "1": [0, 1]}}, {"heads", "uneven-heads"}), ({"layers_removed": [1]}, {"layers"}),
    ({"mlp_keep": {}, "head_keep": {}, "layers_removed": []}, set()), ("broken", None)])
def test_a_pruned_models_kinds_are_read_from_its_config(entry, kinds):
    from mechkit.model.sources.peek import pruned_kinds

    assert pruned_kinds({"model_type": "llama", "mechkit_pruning": entry}) == kinds
    assert pruned_kinds({"model_type": "llama"}) == set()


# ---- F10b: shuffle's explicitly named heads counted before the load -------------------------------------------


@pytest.mark.parametrize("spec", ["0.1", "0.1,0.1", "1.0"])
def test_shuffle_refuses_one_named_head_before_the_load(spec):
    with pytest.raises(OptionError, match=f"--heads {spec} names 1 head") as err:
        resolve_options(mechkit.registry.get("shuffle"), {"heads": spec})
    assert "--heads 0.1,0.2" in err.value.fix and "--top-k" not in err.value.fix  # --top-k is refused beside them


@pytest.mark.parametrize("spec", ["0.1,0.2", "layer:0", "induction", "0.1,layer:1"])
def test_shuffle_leaves_two_heads_and_model_dependent_specs_to_the_load(spec):
    resolve_options(mechkit.registry.get("shuffle"), {"heads": spec})


# ---- F11: adapt's default margin prompts grow as documented; every fix runs -----------------------------------


def _study(handle, **kw):
    from mechkit.adapt import AdaptStudy

    return AdaptStudy(handle, ["capitalize", "past-tense"], n_calib=2, n=2, shots=1, repeats=1,
                      token_options=(), **kw)


def test_default_margin_prompts_grow_for_two_tasks_instead_of_being_refused(llama):
    study = _study(llama)  # 2 tasks x 4 prompts x 10 plans: 80 < 99 residuals, refused before
    study.check_margin_sample()
    assert [len(xs) for xs in study.margin_texts.values()] == [5, 5]  # 2 x 5 x 10 = 100
    held_out = {p.text for ps in study.test.values() for p in ps}
    assert not held_out & {x for xs in study.margin_texts.values() for x in xs}
    wide = _study(llama, margin_plans=20)  # as before: enough with the default
    wide.check_margin_sample()
    assert [len(xs) for xs in wide.margin_texts.values()] == [4, 4]


@pytest.mark.parametrize("given,plans", [(2, 10), (1, 3), (3, 7)])
def test_given_margin_prompts_too_few_name_a_number_that_runs(llama, given, plans):
    import re

    study = _study(llama, margin_prompts=given, margin_plans=plans)
    with pytest.raises(MechkitError, match="residuals") as err:
        study.check_margin_sample()
    n = int(re.search(r"--margin-prompts (\d+)", err.value.fix).group(1))
    _study(llama, margin_prompts=n, margin_plans=plans).check_margin_sample()  # the fix, applied literally
    assert "leave --margin-prompts out" in err.value.fix
    _study(llama, margin_plans=plans).check_margin_sample()  # the other fix, applied literally


def test_too_few_distinct_plans_name_fixes_that_run(llama):
    import re

    study = _study(llama, margin_prompts=10)
    study.check_margin_sample()  # 2 x 10 x 10: enough, until the model offers 2 distinct plans
    with pytest.raises(MechkitError, match="offers 2 distinct plans") as err:
        study._check_plan_count(2)
    n = int(re.search(r"--margin-prompts (\d+)", err.value.fix).group(1))
    fixed = _study(llama, margin_prompts=n)
    fixed.check_margin_sample()
    fixed._check_plan_count(2)
    assert "leave --margin-prompts out" in err.value.fix
    left = _study(llama)
    left.check_margin_sample()
    left._check_plan_count(2)
    assert sum(map(len, left.margin_texts.values())) * 2 >= 99


# ---- F12, F13: peft wrappers and headless bodies refused up front with the right fix ---------------------------


def _peft(llama, config):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(copy.deepcopy(llama.model), config(peft))


PROMPT_LEARNING = [lambda p: p.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
                   lambda p: p.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)]


@pytest.mark.parametrize("config", PROMPT_LEARNING, ids=["prompt-tuning", "prefix-tuning"])
def test_a_prompt_learning_wrapper_is_refused_before_it_runs_on_shifted_logits(llama, config):
    wrapper = _peft(llama, config)
    with pytest.raises(MechkitError, match="prompt-learning wrapper") as err:
        mk.load_model(wrapper, tokenizer=llama.tokenizer)
    assert "get_base_model()" in err.value.fix and "virtual tokens" in err.value.fix
    base = mk.load_model(wrapper.get_base_model(), tokenizer=llama.tokenizer)  # the fix, applied
    assert base.anatomy.n_layers == llama.anatomy.n_layers


@pytest.mark.parametrize("task_type", [None, "CAUSAL_LM"])
def test_a_lora_peft_model_and_its_tuner_get_fixes_that_load(llama, task_type):
    wrapper = _peft(llama, lambda p: p.LoraConfig(r=2, target_modules=["q_proj"], task_type=task_type))
    with pytest.raises(MechkitError, match="peft wrapper") as err:
        mk.load_model(wrapper, tokenizer=llama.tokenizer)
    assert "merge_and_unload()" in err.value.fix and "unload()" in err.value.fix
    mk.load_model(copy.deepcopy(wrapper).unload(), tokenizer=llama.tokenizer)
    tuner = wrapper.base_model  # a LoraModel: no get_base_model; was told to add a Family row
    with pytest.raises(MechkitError, match="peft tuner") as err:
        mk.load_model(tuner, tokenizer=llama.tokenizer)
    assert "merge_and_unload()" in err.value.fix and "unload()" in err.value.fix and "Family" not in err.value.fix
    mk.load_model(copy.deepcopy(tuner).unload(), tokenizer=llama.tokenizer)  # the fix, applied
    mk.load_model(copy.deepcopy(tuner).merge_and_unload(), tokenizer=llama.tokenizer)


@pytest.mark.parametrize("family,body,head", [("llama", "model", "LlamaForCausalLM"),
                                              ("gpt2", "transformer", "GPT2LMHeadModel")])
def test_a_headless_body_is_told_to_load_its_causal_lm_class(family, body, head):
    import transformers

    handle = mk.load_model(f"tiny:{family}")
    with pytest.raises(MechkitError, match="without its language-model head") as err:
        mk.load_model(getattr(handle.model, body), tokenizer=handle.tokenizer)
    assert "AutoModelForCausalLM" in err.value.fix and head in err.value.fix and "Family" not in err.value.fix
    whole = getattr(transformers, head)(handle.model.config)  # the fix: the causal-LM class that wraps it
    assert mk.load_model(whole, tokenizer=handle.tokenizer).anatomy.n_layers == handle.anatomy.n_layers
