"""Red-team pass 37 (b): each refusal names the problem, and its fix works when applied as written.

F3: a size field of 0 or less (num_attention_heads 0) is named, for every family, before transformers' own config
checks (which said "integer modulo by zero" with a fix about layer_types). F4: a size field that is not a whole
number (n_positions 1.5, "12", true, null) is named too, with the value the weights imply where they say it.
F5: prompts past the context are told "fewer --shots" only where the same prompts without demonstrations fit.
F8: a fix that drops every score-ranked item drops the options only scores read (--n-seqs, --seg-len, --from),
and "--baseline none" drops --baseline-seeds: the run refused each as ignored. Z1: an --lr past AdamW's float32
step is refused before the load, and an overflow in the step is one line.
"""

from __future__ import annotations

import json
import re

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import cli_in_process, tiny_model_dir


def _refused(call) -> str:
    with pytest.raises(MechkitError) as err:
        call()
    return str(err.value)


def _with(folder, field, value, part=None):
    """``folder``'s config.json with ``field`` set to ``value`` (in ``part``, e.g. text_config, where given)."""
    config = json.loads((folder / "config.json").read_text())
    (config[part] if part else config)[field] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One saved tiny model per family (copied by each test that edits its config)."""
    base = tmp_path_factory.mktemp("families")
    return {family: tiny_model_dir(base / family, family) for family in ("llama", "gpt2", "gpt_neox", "gemma")}


def _copy(folders, family, tmp_path):
    import shutil

    return shutil.copytree(folders[family], tmp_path / family)


# F3 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,field,value", [("llama", "num_attention_heads", 0),
                                                ("llama", "num_attention_heads", -3),
                                                ("gpt_neox", "num_attention_heads", 0),
                                                ("gpt_neox", "num_attention_heads", -3),
                                                ("llama", "num_attention_heads", -5)])
def test_a_size_field_below_one_is_named_before_the_config_is_built(folders, tmp_path, family, field, value):
    folder = _copy(folders, family, tmp_path)
    good = json.loads((folder / "config.json").read_text())[field]
    _with(folder, field, value)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    assert f"gives {field} {value}, but it must be a whole number of at least 1" in line, line
    assert "layer_types" not in line and "modulo" not in line and "corrupt" not in line
    _with(folder, field, good)  # the value the model was made with: it loads
    mk.load_model(str(folder), device="cpu")


# F4 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,field,value,shown,implied", [
    ("gpt2", "n_positions", 1.5, "1.5", 512),
    ("gpt2", "n_positions", "12", '"12"', 512),
    ("gpt2", "n_positions", True, "true", 512),
    ("gpt2", "n_embd", 64.0, "64.0", 64),
    ("llama", "hidden_size", 32.5, "32.5", 64),
    ("llama", "num_hidden_layers", 1.5, "1.5", 2),
    ("llama", "max_position_embeddings", None, "null", None),
    ("llama", "intermediate_size", "128", '"128"', None),
    ("gemma", "head_dim", 2.5, "2.5", None),
])
def test_a_size_field_that_is_not_a_whole_number_is_named(folders, tmp_path, family, field, value, shown, implied):
    folder = _copy(folders, family, tmp_path)
    good = json.loads((folder / "config.json").read_text())[field]
    _with(folder, field, value)
    line = _refused(lambda: mk.load_model(str(folder), device="cpu"))
    assert f"gives {field} {shown}, but it must be a whole number of at least 1" in line, line
    assert "layer_types" not in line and "expected int" not in line
    if implied is not None:  # the fix names the value the weights hold, and applied as written the model loads
        m = re.search(rf'set "{field}" in config\.json to (\d+)', line)
        assert m and int(m[1]) == implied, line
        _with(folder, field, int(m[1]))
    else:
        assert f'set "{field}" in config.json to a whole number of at least 1' in line
        _with(folder, field, good)
    mk.load_model(str(folder), device="cpu")


def test_a_text_config_size_field_is_named_with_its_prefix(tmp_path):
    from mechkit.model.checks.integrity import refuse_nonpositive_sizes

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "text_config": {"num_attention_heads": 0.5}}))
    line = _refused(lambda: refuse_nonpositive_sizes(tmp_path))
    assert "gives text_config.num_attention_heads 0.5" in line and 'set "num_attention_heads"' in line


# F5 --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def g12(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory.mktemp("g12") / "m", "gpt2", n_positions=12))


@pytest.fixture(scope="module")
def g64(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory.mktemp("g64") / "m", "gpt2", n_positions=64))


@pytest.mark.parametrize("shots", ["10", "3", "0"])
def test_sweep_past_the_context_even_at_0_shots_is_not_told_fewer_shots(g12, tmp_path, shots):
    result = cli_in_process("sweep", "--model", g12, "--n", "2", "--shots", shots, "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    assert "fewer --shots" not in result.stderr and "even 0-shot prompts are" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_scoring_past_the_context_even_at_0_shots_is_not_told_fewer_shots(g12):
    handle = mk.load_model(g12, device="cpu")
    line = _refused(lambda: mk.score_prompts(handle, mk.build_prompts("capitalize", n=2, shots=5)))
    assert "fewer --shots" not in line and "even 0-shot prompts are" in line, line


def test_prompt_ids_past_the_context_even_at_0_shots_is_not_told_fewer_shots(g12):
    from mechkit.eval import prompt_ids

    handle = mk.load_model(g12, device="cpu")
    line = _refused(lambda: prompt_ids(handle, mk.build_prompts("capitalize", n=2, shots=4)))
    assert "fewer --shots" not in line and "even 0-shot prompts are" in line, line


def test_finetune_rows_past_the_context_even_at_0_shots_are_not_told_fewer_shots(g12):
    from mechkit.taskarith.finetune import Recipe, finetune

    handle = mk.load_model(g12, device="cpu")
    line = _refused(lambda: finetune(handle, Recipe(task="capitalize", steps=1, shots=(3,), eval_n=1, pool=4)))
    assert "fewer --shots" not in line and "even 0-shot training rows are" in line, line


def test_fewer_shots_is_still_told_where_0_shot_prompts_fit_and_it_works(g64, tmp_path):
    result = cli_in_process("sweep", "--model", g64, "--n", "1", "--shots", "10", "--tasks", "capitalize",
                            "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    m = re.search(r"use --shots 0, the most that fit \(0-shot prompts are (\d+) tokens", result.stderr)  # pass 38
    assert m and int(m[1]) <= 64, result.stderr
    ok = cli_in_process("sweep", "--model", g64, "--n", "1", "--shots", "0", "--tasks", "capitalize",
                        "--out", str(tmp_path / "o0"))
    assert ok.returncode == 0, ok.stderr


# F8 --------------------------------------------------------------------------------------------------------------

_NAMES = {"--from": "from_report"}


def _applied(options: dict, line: str) -> dict:
    """``options`` with the first alternative of ``line``'s fix applied as written: its --heads, its k, and
    every option it says to drop."""
    fix = line.split(" — ", 1)[1].split(", or --baseline none")[0]
    out = dict(options)
    dropped = re.search(r"and drop ((?:--[a-z-]+)(?:(?:, | and )--[a-z-]+)*)", fix)
    for flag in re.findall(r"--[a-z-]+", dropped[1]) if dropped else []:
        out.pop(_NAMES.get(flag, flag[2:].replace("-", "_")), None)
    heads = re.search(r"(?:: |e\.g\. )--heads ([^\s)]+)", fix)
    out["heads"] = heads[1]
    if k := re.search(r"--(top-k|sweep) (\d+)\)", fix):
        out[k[1].replace("-", "_")] = k[2]
    return out


ABLATE = {"n": 1, "shots": 0, "tasks": "capitalize", "n_seqs": 1, "baseline_seeds": 1}


@pytest.mark.parametrize("heads,extra,dropped", [
    ("0.0,0.1,0.2,0.3,induction", {"top_k": 4}, ["--top-k", "--n-seqs"]),
    ("0.0,0.1,0.2,0.3,induction", {"top_k": 4, "seg_len": 5}, ["--top-k", "--n-seqs", "--seg-len"]),
    ("0.0,0.1,0.2,random,induction", {"top_k": 2}, ["--n-seqs"]),
    ("1.0,1.1,1.2,1.3,previous-token", {"sweep": "2,3"}, ["--sweep", "--n-seqs"]),
])
def test_ablate_fix_that_drops_the_ranked_items_runs_as_written(heads, extra, dropped):
    options = {**ABLATE, **extra}
    line = _refused(lambda: mk.run("ablate", model="tiny:llama", write=False, heads=heads, **options))
    for flag in dropped:
        assert flag in line.split(" — ", 1)[1], line
    mk.run("ablate", model="tiny:llama", write=False, **_applied({**options, "heads": heads}, line))


def test_ablate_baseline_none_alternative_drops_baseline_seeds_and_runs():
    options = {**ABLATE, "top_k": 4, "heads": "0.0,0.1,0.2,0.3,induction"}
    line = _refused(lambda: mk.run("ablate", model="tiny:llama", write=False, **options))
    assert line.endswith(", or --baseline none and drop --baseline-seeds"), line
    options.pop("baseline_seeds")
    mk.run("ablate", model="tiny:llama", write=False, **options, baseline="none")


def test_the_cli_ablate_fix_of_the_report_runs_as_written(tmp_path):
    args = ["ablate", "--model", "tiny:llama", "--n", "1", "--shots", "0", "--tasks", "capitalize", "--n-seqs", "1",
            "--baseline-seeds", "1", "--heads", "0.0,0.1,0.2,0.3,induction", "--top-k", "4"]
    result = cli_in_process(*args, "--out", str(tmp_path / "a"))
    assert result.returncode == 2
    assert "drop the ranked items from --heads and drop --top-k and --n-seqs: --heads 0.0,0.1,0.2,0.3" \
        in result.stderr, result.stderr
    fixed = ["ablate", "--model", "tiny:llama", "--n", "1", "--shots", "0", "--tasks", "capitalize",
             "--baseline-seeds", "1", "--heads", "0.0,0.1,0.2,0.3"]
    ok = cli_in_process(*fixed, "--out", str(tmp_path / "b"))
    assert ok.returncode == 0, ok.stderr


@pytest.fixture(scope="module")
def detect_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("detect") / "d"
    mk.run("detect", model="tiny:llama", n_seqs=2, out=str(out))
    return str(out)


@pytest.mark.parametrize("heads,k", [("0.0,0.1,0.2,0.3,induction", 4), ("1.0,1.1,1.2,1.3,previous-token", 3)])
def test_shuffle_fix_that_drops_the_ranked_items_drops_from_and_runs(detect_report, heads, k):
    options = {"n": 1, "shots": 0, "tasks": "capitalize", "n_seqs": 2, "seeds": 1, "from_report": detect_report,
               "top_k": k, "heads": heads}
    line = _refused(lambda: mk.run("shuffle", model="tiny:llama", write=False, **options))
    assert "--from" in line.split(" — ", 1)[1], line
    mk.run("shuffle", model="tiny:llama", write=False, **_applied(options, line))


def test_no_room_for_ranked_items_names_the_scoring_options_too():
    from mechkit.model.headspec import HeadSpecError, parse_spec

    with pytest.raises(HeadSpecError, match=r"without its ranked items \(and drop --top-k, --n-seqs and --seg-len\)"):
        parse_spec("layer:0,1.0,induction").check_baseline(2, 4, [2], scoring=["--n-seqs", "--seg-len"])


# Z1 --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lr", ["1e39", "3.5e37", "1e300"])
def test_an_lr_past_float32_is_refused_before_the_load(tmp_path, lr):
    result = cli_in_process("finetune", "--model", str(tmp_path / "no-such-model"), "--lr", lr, "--steps", "2",
                            "--eval-n", "1", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert f"--lr {float(lr):g} is past the range of AdamW's float32 step" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "no-such-model" not in result.stderr


def test_an_lr_past_float32_is_refused_by_finetune_itself(tiny_llama):
    from mechkit.taskarith.finetune import Recipe, finetune

    line = _refused(lambda: finetune(tiny_llama, Recipe(task="capitalize", steps=1, lr=1e39, eval_n=1, pool=2)))
    assert "past the range of AdamW's float32 step" in line and "--lr 0.0001" in line


def test_an_overflow_in_the_adam_step_is_one_line(tiny_llama, monkeypatch):
    import mechkit.taskarith.finetune as ft

    monkeypatch.setattr(ft, "lr_problem", lambda lr: None, raising=False)  # as if the check did not foresee it
    line = _refused(lambda: ft.finetune(tiny_llama, ft.Recipe(task="capitalize", steps=1, lr=1e39, eval_n=1, pool=2)))
    assert "past the weights' float range" in line and "step 1" in line and "lower --lr" in line, line


def test_the_fix_of_an_lr_past_float32_runs(tmp_path):
    result = cli_in_process("finetune", "--model", "tiny:llama", "--lr", "1e39", "--steps", "1", "--eval-n", "1",
                            "--out", str(tmp_path / "o"))
    fix = re.search(r"e\.g\. --lr (\S+)", result.stderr)
    assert fix, result.stderr
    ok = cli_in_process("finetune", "--model", "tiny:llama", "--lr", fix[1], "--steps", "1", "--eval-n", "1",
                        "--out", str(tmp_path / "o2"))
    assert ok.returncode == 0, ok.stderr
