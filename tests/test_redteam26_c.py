"""Red-team pass 26 (b): a str Enum given as a text or choice option is its text; a singledispatch helper keeps a
cell plugin's key (its dispatch cache fills on each call); a config value transformers does not know is named in
config.json, and a rotary base of 0 is named among the causes of NaN logits."""

from __future__ import annotations

import enum
import json

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.plugin_key import plugin_code


class Prompt(str, enum.Enum):  # noqa: UP042 - the str mixin, whose str() is "Prompt.CAT" (StrEnum's is its text)
    CAT = "The cat sat on the mat. The cat sat on the mat."


class Mode(str, enum.Enum):  # noqa: UP042 - as Prompt
    ZERO = "zero"


def test_a_str_enum_prompt_runs_on_its_text_not_its_name():
    run = mk.run("attention", model="tiny:llama", prompt=Prompt.CAT, write=False)
    assert run.report["params"]["prompt"] == Prompt.CAT.value
    assert "".join(run.results["tokens"]).replace("Ġ", " ").startswith("The cat")


def test_a_str_enum_choice_is_accepted_as_its_value():
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    params, _ = resolve_options(registry.get("ablate"), {"mode": Mode.ZERO})
    assert params["mode"] == "zero" and type(params["mode"]) is str


def test_a_singledispatch_helper_called_during_a_run_keeps_the_key():
    namespace: dict = {}
    exec(compile('''
import functools, mechkit as mk
@functools.singledispatch
def score(x): return 0
@score.register
def _(x: int): return x * 2
class SD(mk.Plugin):
    name, version, summary, options = "rt26c-sd", "0.1", "x", ()
    def run(self, ctx):
        return mk.Result(results={"v": ctx.step("s", lambda: score(1))}, finding="ok")
''', "<cell>", "exec"), namespace)
    before = plugin_code(namespace["SD"])
    namespace["score"](1), namespace["score"]("a")  # fills its dispatch cache, as a run's steps do
    assert plugin_code(namespace["SD"]) == before


def _model_dir(tmp_path, edit):
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("value", ["nonexistent", "gelu_but_not"])
def test_an_activation_transformers_does_not_know_is_named_in_config_json(tmp_path, value):
    path = _model_dir(tmp_path, lambda c: c.update(hidden_act=value))
    with pytest.raises(MechkitError) as err:
        mk.load_model(path)
    assert "hidden_act" in str(err.value) and "config.json" in err.value.fix and "corrupt" not in err.value.fix


def test_nan_logits_from_a_rotary_base_of_zero_name_rope_theta(tmp_path):
    def zero_theta(config):
        rope = dict(config.get("rope_parameters") or {"rope_type": "default"})
        rope["rope_theta"] = 0.0
        config["rope_parameters"] = rope
        config.pop("rope_theta", None)

    path = _model_dir(tmp_path, zero_theta)
    with pytest.raises(MechkitError, match="rope_theta 0.0, but it must be a positive finite number") as err:
        mk.run("inspect", model=path, write=False, seq_len=16, repeats=1)
    assert "rope_theta" in err.value.fix


@pytest.mark.parametrize("heads", [[{"head": 99, "layer": 0}], [{"head": 0, "layer": 5}], [{"head": -1, "layer": 0}],
                                   [{"head": True, "layer": 0}], ["0.1"]])
def test_a_vector_whose_heads_are_not_the_models_is_refused_before_the_evaluation(heads, tmp_path):
    from mechkit.actvec import ActivationVector

    m = mk.load_model("tiny:llama")
    vector = ActivationVector(vector=mk.load_model("tiny:llama").model.model.embed_tokens.weight[0].detach().clone(),
                              method="function-vector", task="capitalize", layer=0, mode="add", heads=heads)
    with pytest.raises(MechkitError, match="no head of this model"):
        vector.check(m)
