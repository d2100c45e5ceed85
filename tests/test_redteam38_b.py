"""Red-team pass 38 (b): each refusal's fix works when applied as written.

F2: prompts past the context under a command whose --shots has a minimum (icl-vectors: 2) are told a longer context
where even that many demonstrations do not fit, else the most that fit (never "fewer --shots" below the minimum).
F3: adapt's prompts past the context are compared with their 0-shot length, before any work ("use shorter prompts
(fewer --shots...)" was said to 0-shot prompts too). F4: vocab_size (and other families' size fields: experts,
ffn_dim, rotary_dim...) that is not a whole number of at least 1 is named with the value the weights hold, and a
field transformers refuses for its type is named whatever it is (the fix was about layer_types).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import cli_in_process, tiny_model_dir


def _refused(call) -> str:
    with pytest.raises(MechkitError) as err:
        call()
    return str(err.value)


def _gpt2(tmp_path_factory, n: int) -> str:
    return str(tiny_model_dir(tmp_path_factory.mktemp(f"g{n}") / "m", "gpt2", n_positions=n))


@pytest.fixture(scope="module")
def g12(tmp_path_factory):
    return _gpt2(tmp_path_factory, 12)


@pytest.fixture(scope="module")
def g40(tmp_path_factory):
    return _gpt2(tmp_path_factory, 40)


@pytest.fixture(scope="module")
def g120(tmp_path_factory):
    return _gpt2(tmp_path_factory, 120)


@pytest.fixture(scope="module")
def g100(tmp_path_factory):
    return _gpt2(tmp_path_factory, 100)


ICL = ("--tasks", "capitalize", "--n", "2", "--n-dev", "2", "--n-contexts", "2", "--n-cie", "2")


# F2 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shots", [None, "2", "3"])
def test_icl_vectors_where_not_even_its_fewest_shots_fit_is_told_a_longer_context(g40, tmp_path, shots):
    more = ("--shots", shots) if shots else ()
    result = cli_in_process("icl-vectors", "--model", g40, *ICL, *more, "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    line = result.stderr
    assert "use a model with a longer context" in line and "fewer --shots" not in line, line
    assert "--shots 2" in line and "fewest" in line, line  # why: 2 is the least icl-vectors allows
    assert "Traceback" not in line


def test_icl_vectors_is_told_the_most_shots_that_fit_and_they_do(g120, tmp_path):
    result = cli_in_process("icl-vectors", "--model", g120, *ICL, "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    m = re.search(r"use --shots (\d+)\b", result.stderr)
    assert m and int(m[1]) >= 2, result.stderr
    ok = cli_in_process("icl-vectors", "--model", g120, *ICL, "--shots", m[1], "--out", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("demos,zero,limit,per,least,want", [
    (2, 33, 40, 33, 2, "use a model with a longer context"),  # the longest holds the fewest allowed already
    (10, 33, 40, 33, 2, "use a model with a longer context"),  # not even 2 fit
    (10, 33, 120, 33, 2, "use --shots 2, the most"),  # 33 + 2 * 33 = 99 <= 120 < 132
    (10, 33, 200, 33, 2, "use --shots 5 or fewer, the most that fit (0-shot prompts are 33 tokens and a "
                             "demonstration up to 33; it holds 200; 2 is the fewest allowed)"),
    (10, 33, 100, 30, 0, "use --shots 2 or fewer"),
    (10, 33, 64, 37, 0, "use --shots 0, the most that fit"),
    (10, 33, 100, 70, 1, "use a model with a longer context"),
])
def test_context_fix_knows_the_fewest_shots_allowed(demos, zero, limit, per, least, want):
    from mechkit.eval.scoring import context_fix

    fix = context_fix(demos, zero, limit, per, least)
    assert want in fix, fix
    if want.startswith("use a model"):
        assert "fewer --shots" not in fix


def test_a_plugins_shots_minimum_reaches_the_context_fix():
    from mechkit.eval.scoring import context_fix, fewest_shots
    from mechkit.registry import get

    with fewest_shots(get("icl-vectors").options):
        inside = context_fix(2, 10, 40)
    assert "longer context" in inside and "fewer --shots" not in inside, inside
    assert "fewer --shots" in context_fix(2, 10, 40)  # outside the block: no floor (0)
    with fewest_shots(get("sweep").options):  # min=0
        assert "fewer --shots" in context_fix(2, 10, 40)


# F3 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shots", [None, "0", "3"])
def test_adapt_past_the_context_even_at_0_shots_is_told_a_longer_context(g12, tmp_path, shots):
    more = ("--shots", shots) if shots else ()
    result = cli_in_process("adapt", "--model", g12, "--tasks", "capitalize", "--n", "2", *more,
                            "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    line = result.stderr
    assert "even 0-shot prompts are" in line and "fewer --shots" not in line, line
    assert "Traceback" not in line


def test_adapt_is_told_the_most_shots_that_fit(g100):
    from mechkit.adapt import AdaptStudy

    m = mk.load_model(g100, device="cpu")
    line = _refused(lambda: AdaptStudy(m, ["capitalize"], n=2, shots=10))
    found = re.search(r"use --shots (\d+) or fewer", line)
    assert found and int(found[1]) < 10, line


def test_check_texts_context_compares_the_0_shot_length(g12):
    from mechkit.eval.scoring import check_texts_context

    m = mk.load_model(g12, device="cpu")
    line = _refused(lambda: check_texts_context(m, ["input: abcdefghij\noutput: ABCDEFGHIJ\ninput: abcdefghij\noutput:"]))
    assert "even 0-shot prompts are" in line and "fewer --shots" not in line, line


# F4 --------------------------------------------------------------------------------------------------------------

def _with(folder, field, value):
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import torch
    import transformers as T

    from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

    base = tmp_path_factory.mktemp("families38")
    out = {f: tiny_model_dir(base / f, f) for f in ("gpt2", "llama", "phi3")}
    extra = {"mixtral": T.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2,
                                        num_experts_per_tok=1, **SPECIAL_TOKENS),
             "opt": T.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=4,
                                word_embed_proj_dim=32, **SPECIAL_TOKENS),
             "gptj": T.GPTJConfig(n_embd=32, n_layer=1, n_head=4, rotary_dim=4, n_positions=64, **SPECIAL_TOKENS)}
    for name, config in extra.items():
        torch.manual_seed(0)
        T.AutoModelForCausalLM.from_config(config).save_pretrained(base / name)
        byte_tokenizer().save_pretrained(base / name)
        out[name] = base / name
    return out


@pytest.mark.parametrize("value", [1.5, "12", True, None, 2.0, 1e30, [4]])
def test_vocab_size_not_a_whole_number_is_named_with_the_rows_the_weights_hold(folders, tmp_path, value):
    folder = shutil.copytree(folders["gpt2"], tmp_path / "m")
    _with(folder, "vocab_size", value)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    fix = line.split(" — ")[-1]
    assert '"vocab_size"' in fix and "259" in fix, line
    assert "layer_types" not in line
    _with(folder, "vocab_size", 259)  # the fix, applied
    mk.load_model(str(folder), device="cpu")


@pytest.mark.parametrize("family,field,value", [
    ("mixtral", "num_local_experts", 0), ("mixtral", "num_local_experts", -1), ("mixtral", "num_local_experts", 1.5),
    ("mixtral", "num_experts_per_tok", 0), ("mixtral", "num_experts_per_tok", "12"),
    ("opt", "ffn_dim", -1), ("opt", "ffn_dim", 0), ("opt", "word_embed_proj_dim", True),
    ("gptj", "rotary_dim", -1), ("gptj", "rotary_dim", None), ("gptj", "rotary_dim", [4]),
    ("llama", "num_key_value_heads", None), ("phi3", "num_key_value_heads", None),
])
def test_other_families_size_fields_are_named(folders, tmp_path, family, field, value):
    folder = shutil.copytree(folders[family], tmp_path / "m")
    good = json.loads((folder / "config.json").read_text())[field]
    _with(folder, field, value)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    fix = line.split(" — ")[-1]
    assert f'"{field}"' in fix, line
    assert "layer_types" not in line and "corrupt" not in line and "shapes" not in line, line
    _with(folder, field, good)  # the value the fix names, where it names one, or the saved one
    mk.load_model(str(folder), device="cpu")


@pytest.mark.parametrize("family,field,value", [("llama", "pretraining_tp", 1.5), ("llama", "pretraining_tp", [4]),
                                                ("phi3", "original_max_position_embeddings", "12")])
def test_a_field_of_the_wrong_type_is_named_whatever_it_is(folders, tmp_path, family, field, value):
    folder = shutil.copytree(folders[family], tmp_path / "m")
    _with(folder, field, value)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    assert f'set "{field}" in config.json to a ' in line and "layer_types" not in line, line
