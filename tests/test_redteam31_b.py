"""Red-team pass 31 (b): what it found, fixed.

F1: ``--seg-len`` past a learned-position model's table (GPT-2's ``n_positions``) was refused at the first
forward with "truncate or split the text", naming no option: the repeated tokens are now bounded by the table,
naming ``--seg-len`` and the largest that fits. F2: a helper run by ``exec`` whose file name sits in a module
constant (``HELPER = "helpers.txt"``), or through ``builtins.exec``, was not in the resume key. F3: the refusal
of missing or unknown tensors suggested ``num_hidden_layers`` where no layer count could fix them.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.plugin_key import plugin_code
from tests.conftest import cli_in_process, tiny_model_dir


@pytest.fixture(scope="module")
def short_gpt2(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("g100") / "m", "gpt2", n_positions=100)


@pytest.mark.parametrize("plugin", ["detect", "attention", "ablate"])
def test_seg_len_past_the_position_table_names_seg_len_and_a_fix_that_works(short_gpt2, tmp_path, plugin):
    extra = ["--tasks", "capitalize", "--n", "2", "--shots", "1", "--baseline", "none", "--top-k", "1"] \
        if plugin == "ablate" else []
    if plugin == "attention":
        extra = ["--prompt", "The cat sat on the mat."]
    args = [plugin, "--model", str(short_gpt2), "--n-seqs", "1", *extra]
    refused = cli_in_process(*args, "--seg-len", "60", "--out", str(tmp_path / "a"))
    assert refused.returncode == 2 and "--seg-len" in refused.stderr and "truncate" not in refused.stderr
    fix = refused.stderr.split("lower --seg-len (seg_len=) to ")[1].split(" ")[0]
    assert cli_in_process(*args, "--seg-len", fix, "--out", str(tmp_path / "b")).returncode == 0


def test_repeated_tokens_are_bounded_by_the_positions_given():
    from mechkit.tasks import repeated_random_tokens
    from mechkit.tasks.prompt import TaskOptionError

    assert repeated_random_tokens(100, 2, seg_len=19, bos_id=0, n_positions=39).shape == (2, 39)
    with pytest.raises(TaskOptionError, match="to 19 or less"):
        repeated_random_tokens(100, 2, seg_len=20, bos_id=0, n_positions=40)


PLUGIN = """
import builtins
import mechkit as mk
HELPER = "{name}"
class P(mk.Plugin):
    name, version, summary = "rt31b-exec", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"v": ctx.step("a", helper)}}, finding="ok")
def helper():
    g = {{}}
    {call}(open(HELPER).read(), g)
    return g["x"]
"""


@pytest.mark.parametrize("call", ["exec", "builtins.exec"])
def test_a_helper_exec_reads_by_a_constants_name_is_in_the_key(tmp_path, monkeypatch, call):
    tag = call.replace(".", "_")
    (tmp_path / f"rt31b_{tag}.py").write_text(textwrap.dedent(PLUGIN.format(name="helpers.txt", call=call)))
    (tmp_path / "helpers.txt").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__(f"rt31b_{tag}").P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        (tmp_path / "helpers.txt").write_text("x = 2\n")
        assert plugin_code(cls) != first
    finally:
        sys.modules.pop(f"rt31b_{tag}", None)


def _saved(tmp_path, drop=None, add=None, layers=None):
    from safetensors.torch import load_file, save_file

    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    if drop:
        weights.pop(drop)
    if add:
        weights[add] = weights["model.norm.weight"].clone()
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    if layers is not None:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    return tmp_path


@pytest.mark.parametrize("case", ["missing norm", "unknown tensor"])
def test_a_gap_no_layer_count_fixes_is_not_told_to_set_one(tmp_path, case):
    path = _saved(tmp_path, drop="model.layers.1.input_layernorm.weight" if case == "missing norm" else None,
                  add="model.layers.0.self_attn.extra.weight" if case == "unknown tensor" else None)
    with pytest.raises(MechkitError) as err:
        mk.load_model(str(path))
    fix = str(err.value).split(" — ")[1]
    assert fix.startswith("re-export the model") and "e.g." not in fix


@pytest.mark.parametrize("layers", [1, 3])
def test_a_layer_count_off_still_names_the_field_as_the_condition(tmp_path, layers):
    with pytest.raises(MechkitError) as err:
        mk.load_model(str(_saved(tmp_path, layers=layers)))
    assert "num_hidden_layers" in str(err.value)


def test_attentions_prompt_past_the_position_table_names_prompt(short_gpt2, tmp_path):
    refused = cli_in_process("attention", "--model", str(short_gpt2), "--seg-len", "10", "--out", str(tmp_path / "a"))
    assert refused.returncode == 2 and "(--prompt, prompt=)" in refused.stderr and "truncate" not in refused.stderr
