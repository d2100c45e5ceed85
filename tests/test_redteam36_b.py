"""Red-team pass 36 (b): refusals whose fix was wrong or incomplete.

F1: a ``generation_config.json`` nested 100 000 deep and a GPT-2 ``n_positions`` below 1 were blamed on the
weights ("re-export"); each names its file or field now. F2: the generic context refusal told a run at ``--shots
0`` (or of prompts with no demonstrations) to use fewer shots. F3: attention, ablate and shuffle checked one
length at a time: lowering ``--seg-len`` as told led to a refusal for ``--prompt`` or ``--shots``; the first
refusal names every change. F4: weights missing a layer between others were told to set the layer count. F5:
"drop a ranked item" kept a ``--top-k`` that still failed; the fix gives a spec and k that pass.
"""

from __future__ import annotations

import json
import re

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import tiny_model_dir


def _refused(call) -> str:
    with pytest.raises(MechkitError) as err:
        call()
    return str(err.value)


# F1 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,text", [("llama", "[" * 100_000 + "]" * 100_000),
                                         ("gpt2", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                                         ("llama", '{"do_sample": false, "y": {"z": ' + "[" * 60_000 + "]" * 60_000
                                          + "}}")])
def test_a_deep_generation_config_is_named_not_the_weights(tmp_path, family, text):
    folder = tiny_model_dir(tmp_path / "m", family)
    (folder / "generation_config.json").write_text(text)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    assert "generation_config.json is nested too deeply" in line and "corrupt" not in line
    (folder / "generation_config.json").unlink()  # the fix: the model loads without one
    mk.load_model(str(folder), device="cpu")


@pytest.mark.parametrize("field,value", [("n_positions", -1), ("n_positions", -5), ("n_positions", 0),
                                         ("n_embd", -4)])
def test_a_size_field_below_one_names_the_field_and_its_range(tmp_path, field, value):
    folder = tiny_model_dir(tmp_path / "m", "gpt2")
    config = json.loads((folder / "config.json").read_text())
    good = config[field]
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    assert f"gives {field} {value}" in line and "at least 1" in line and "corrupt" not in line
    if field == "n_positions":
        assert f'set "n_positions" in config.json to {good}' in line
    (folder / "config.json").write_text(json.dumps({**config, field: good}))
    mk.load_model(str(folder), device="cpu")


# F2 --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def g12(tmp_path_factory):
    return mk.load_model(str(tiny_model_dir(tmp_path_factory.mktemp("g12") / "m", "gpt2", n_positions=12)))


@pytest.mark.parametrize("task,shots", [("capitalize", 0), ("opposite", 0), ("ioi", 0), ("ioi", 3)])
def test_prompts_without_demonstrations_are_not_told_fewer_shots(g12, task, shots):
    prompts = mk.build_prompts(task, n=2, shots=shots)
    line = _refused(lambda: mk.score_prompts(g12, prompts))
    assert "longer context" in line and "fewer --shots" not in line


def test_prompt_ids_without_demonstrations_are_not_told_fewer_shots(g12):
    from mechkit.eval import prompt_ids

    line = _refused(lambda: prompt_ids(g12, mk.build_prompts("capitalize", n=2, shots=0)))
    assert "longer context" in line and "fewer --shots" not in line


def test_prompts_with_demonstrations_are_still_told_fewer_shots(g12):
    line = _refused(lambda: mk.score_prompts(g12, mk.build_prompts("capitalize", n=2, shots=3)))
    assert "even 0-shot prompts are" in line  # pass 37: on 12 positions no fewer shots fit (see test_redteam37_b)


# F3 --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def g40(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory.mktemp("g40") / "m", "gpt2", n_positions=40))


def _fixes(line: str) -> dict:
    """The option values a refusal's fix names."""
    found = {}
    if m := re.search(r"lower --seg-len \(seg_len=\) to (\d+) or less", line):
        found["seg_len"] = int(m[1])
    if m := re.search(r"use --shots (\d+)", line):
        found["shots"] = int(m[1])
    if "pass a prompt of at most" in line:
        found["prompt"] = "The cat sat on the mat."
    return found


@pytest.mark.parametrize("plugin,options,named", [
    ("attention", {"n_seqs": 1, "seg_len": 25}, {"seg_len", "prompt"}),
    ("attention", {"n_seqs": 1, "seg_len": 30, "heads": "induction", "top_k": 1}, {"seg_len", "prompt"}),
    ("ablate", {"n_seqs": 1, "seg_len": 25, "n": 1, "tasks": "capitalize", "top_k": 2, "baseline_seeds": 1},
     {"seg_len", "shots"}),
    ("ablate", {"n_seqs": 1, "seg_len": 22, "n": 1, "shots": 4, "tasks": "capitalize,opposite", "baseline": "none",
                "top_k": 1}, {"seg_len", "shots"}),
    ("shuffle", {"n_seqs": 1, "seg_len": 25, "n": 1, "tasks": "capitalize", "top_k": 2, "seeds": 1},
     {"seg_len", "shots"}),
])
def test_every_length_past_the_model_is_named_in_the_first_refusal(g40, plugin, options, named):
    line = _refused(lambda: mk.run(plugin, model=g40, write=False, **options))
    fixes = _fixes(line)
    assert set(fixes) == named, line
    mk.run(plugin, model=g40, write=False, **{**options, **fixes})  # every change at once: it runs


# F4 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,drop,asked", [("llama", "layers.2.", 4), ("llama", "layers.2.", 6),
                                               ("gpt2", "h.2.", 5), ("llama", "layers.1.", 4)])
def test_a_layer_missing_between_others_is_named_not_the_layer_count(tmp_path, family, drop, asked):
    from safetensors.torch import load_file, save_file

    key = "num_hidden_layers" if family == "llama" else "n_layer"
    folder = tiny_model_dir(tmp_path / "m", family, **{key: 4})
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if drop not in k}, folder / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: asked}))
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    missing = drop.split(".")[1]
    assert f"lack layer {missing} " in line and f"set {key}" not in line and "re-export" in line


# F5 --------------------------------------------------------------------------------------------------------------

RUN = {"n": 1, "shots": 0, "tasks": "capitalize", "n_seqs": 1, "baseline_seeds": 1}


@pytest.mark.parametrize("plugin,heads,flag", [
    ("ablate", "0.0,0.1,0.2,induction,previous-token", {"top_k": 2}),
    ("ablate", "0.0,0.1,induction,previous-token,random", {"top_k": 3}),
    ("ablate", "1.0,1.1,1.2,previous-token,duplicate-token", {"sweep": "2,3"}),
    ("shuffle", "0.0,0.1,0.2,induction,previous-token", {"top_k": 2}),
])
def test_the_fewer_ranked_items_fix_gives_values_that_pass(plugin, heads, flag):
    options = {**RUN, **({"seeds": 1, "baseline_seeds": None} if plugin == "shuffle" else {})}
    options = {k: v for k, v in options.items() if v is not None}
    line = _refused(lambda: mk.run(plugin, model="tiny:llama", write=False, heads=heads, **flag, **options))
    assert "drop a ranked item" not in line
    m = re.search(r"e\.g\. --heads (\S+) --(top-k|sweep) (\d+)", line)
    assert m, line
    mk.run(plugin, model="tiny:llama", write=False, heads=m[1], **{m[2].replace("-", "_"): m[3]}, **options)


def test_no_room_for_a_ranked_item_drops_them_all():
    from mechkit.model.headspec import HeadSpecError, parse_spec

    scores = {kind: [[0.0] * 4, [1.0] * 4] for kind in ("induction", "previous-token", "duplicate-token")}
    with pytest.raises(HeadSpecError, match=r"drop the ranked items from --heads and drop --top-k: --heads layer:0"):
        parse_spec("layer:0,induction").check_baseline(2, 4, [2], scores=scores, late=True)  # picks 2 of layer 1
    with pytest.raises(HeadSpecError, match=r"name at most 4 heads one by one in --heads, without its ranked items"):
        parse_spec("layer:0,1.0,induction").check_baseline(2, 4, [2])
