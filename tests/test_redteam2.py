"""The second fresh red-team pass of issue 32 and its audit of every fix a message suggests (class 11).

Each test holds one class of failure the pass found, with several instances: an ``--out`` file that
replaced the weights the run read, damaged tokenizer files reported as "no tokenizer", a config asking
for a million layers that took minutes to refuse, transformers' load table printed before mechkit's one
line, a symlinked or oversized ``report.json`` read (and embedded) whole, public API functions raising
``AttributeError`` on a non-model, ``--expr`` silently ignoring ``--weights``, and fixes that named a
command or option that does not exist or does not help. The last test reads every error message in
``mechkit/``, ``cli/`` and ``plugins/`` and checks the options and commands it names exist.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import time
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from tests.test_reliability import _cli, _fix_names_real_options, _model_dir, _tree

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny:llama model directory, a noisy copy of it (the "fine-tuned" one) and their task vector."""
    from mechkit.model import load_model
    from mechkit.taskarith import extract
    from tests.conftest import noisy_model_dir

    root = tmp_path_factory.mktemp("rt2")
    base, ft = _model_dir(root / "base"), noisy_model_dir(root / "ft")
    vector = extract(load_model(str(base), device="cpu", dtype="float32"), ft).save(root / "v.safetensors")
    return base, ft, Path(vector)


# ---- class 1: an --out file inside an input directory would replace what the run reads ----------------

@pytest.mark.parametrize(("where", "name"), [("ft", "model.safetensors"), ("base", "model.safetensors"),
                                             ("ft", "tokenizer.json"), ("base", "config.json")])
def test_extract_out_over_a_file_of_an_input_model_is_refused_and_both_stay(tmp_path, capsys, dirs, where, name):
    """``taskvec extract --out FT/model.safetensors --force`` replaced the fine-tuned weights with the vector."""
    base, ft, _ = dirs
    before = {"base": _tree(base), "ft": _tree(ft)}
    target = {"base": base, "ft": ft}[where] / name
    argv = ("taskvec", "extract", "--base", str(base), "--finetuned", str(ft), "--out", str(target), "--force")
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and "inside the input" in err[0], err
    _fix_names_real_options(argv, err[0])
    assert {"base": _tree(base), "ft": _tree(ft)} == before


@pytest.mark.parametrize("spelling", ["symlink", "dot-dot", "relative"])
def test_the_check_sees_an_input_file_under_any_spelling(tmp_path, monkeypatch, dirs, spelling):
    from mechkit.io import check_out

    _, ft, _ = dirs
    (tmp_path / "link").symlink_to(ft)
    monkeypatch.chdir(ft.parent)
    out = {"symlink": tmp_path / "link" / "model.safetensors", "dot-dot": ft / ".." / ft.name / "config.json",
           "relative": Path(ft.name) / "tokenizer_config.json"}[spelling]
    with pytest.raises(MechkitError, match="inside the input"):
        check_out(out, force=True, kind="file", inputs=(str(ft),))


def test_a_new_file_inside_an_input_directory_is_still_allowed(tmp_path, capsys, dirs):
    """Only an existing file is refused: a vector saved beside the fine-tuned weights replaces nothing."""
    base, ft, _ = dirs
    out = ft / "vector-new.safetensors"
    try:
        code, err = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft), "--out", str(out))
        assert code == 0 and out.is_file(), err
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize("writer", ["taskvec merge --force", "taskvec extract --force", "write_atomic", "check_out"])
def test_a_pipe_or_device_is_never_replaced_by_a_file(tmp_path, capsys, dirs, writer):
    """As root, ``taskvec merge --out /dev/full --force`` renamed a regular file over the device (found on
    /dev/full itself; here a FIFO stands in for every special file)."""
    import stat

    from mechkit.io import check_out, write_atomic

    base, ft, vector = dirs
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    if writer == "write_atomic":
        with pytest.raises(MechkitError, match="not a regular file"):
            write_atomic(fifo, "x")
    elif writer == "check_out":
        with pytest.raises(MechkitError, match="not a regular file"):
            check_out(fifo, force=True, kind="file")
    else:
        argv = {"taskvec merge --force": ("taskvec", "merge", "-v", f"a={vector}", "--expr", "a"),
                "taskvec extract --force": ("taskvec", "extract", "--base", str(base), "--finetuned", str(ft))}[writer]
        code, err = _cli(capsys, *argv, "--out", str(fifo), "--force")
        assert code == 2 and len(err) == 1 and "not a regular file" in err[0], err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


# ---- class 2 and 10: damaged tokenizer files, absurd configs, one line only -------------------------

def _garbage_json(d: Path) -> None:
    (d / "tokenizer.json").write_text("{garbage")


def _latin1_tokenizer_config(d: Path) -> None:
    text = (d / "tokenizer_config.json").read_text().replace("}", ', "x": "\u00e4"}', 1)
    (d / "tokenizer_config.json").write_bytes(text.encode("latin-1"))


def _truncated_tokenizer(d: Path) -> None:
    data = (d / "tokenizer.json").read_bytes()
    (d / "tokenizer.json").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [_garbage_json, _latin1_tokenizer_config, _truncated_tokenizer],
                         ids=["garbage", "latin-1 config", "truncated"])
def test_damaged_tokenizer_files_are_refused_at_load_not_called_missing(tmp_path, damage):
    """They were swallowed: the model loaded, and an analysis reading text said "no tokenizer files"."""
    d = _model_dir(tmp_path / "m")
    damage(d)
    with pytest.raises(ModelLoadError, match="tokenizer files in .* do not load") as err:
        mk.load_model(str(d))
    assert "\n" not in str(err.value) and "tokenizer.save_pretrained" in str(err.value)


def test_a_model_without_tokenizer_files_still_loads_for_token_level_work(tmp_path):
    d = _model_dir(tmp_path / "m")
    for f in d.glob("*token*"):
        f.unlink()
    assert mk.load_model(str(d)).tokenizer is None


def _layers(d: Path, n: int, key: str = "num_hidden_layers") -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = n
    cfg.pop("layer_types", None)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(("family", "key", "n"), [("llama", "num_hidden_layers", 10**6),
                                                  ("llama", "num_hidden_layers", 3),
                                                  ("gpt2", "n_layer", 10**6)])
def test_more_layers_than_the_weights_hold_is_refused_from_the_headers_before_building(tmp_path, monkeypatch,
                                                                                      family, key, n):
    """A million layers: transformers built every one (minutes, then the memory) before the gap check."""
    from transformers import AutoModelForCausalLM

    d = _model_dir(tmp_path / "m", family)
    _layers(d, n, key)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model was built before the layer check"))
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="lack layer 2:" if n == 3 else f"lack layers 2–{n - 1}") as err:
        mk.load_model(str(d))
    assert time.monotonic() - start < 5 and "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["missing tensor", "wider mlp", "more layers"])
def test_a_refused_load_prints_mechkits_line_and_no_load_table(tmp_path, capfd, damage):
    """transformers logs its LOAD REPORT table through ``transformers.modeling_utils``: every refused
    directory printed a dozen table lines above the one line (only a subprocess showed it)."""
    from safetensors.torch import load_file, save_file

    d = _model_dir(tmp_path / "m")
    if damage == "missing tensor":
        state = load_file(d / "model.safetensors")
        state.pop("model.norm.weight")
        save_file(state, d / "model.safetensors", metadata={"format": "pt"})
    elif damage == "wider mlp":
        cfg = json.loads((d / "config.json").read_text())
        cfg["intermediate_size"] *= 2
        (d / "config.json").write_text(json.dumps(cfg))
    else:
        _layers(d, 3)
    logging.getLogger("transformers.modeling_utils").setLevel(logging.WARNING)
    with pytest.raises(ModelLoadError):
        mk.load_model(str(d))
    captured = capfd.readouterr()
    assert "LOAD REPORT" not in captured.err + captured.out


# ---- class 6: a run's report is its own regular file, of a report's size ----------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        mk.run("inspect", model="tiny:llama", seed=seed, out=root / f"r{seed}", repeats=1)
    return root


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("reader", ["report show", "report compare", "mk.load_report"])
@pytest.mark.parametrize("damage", ["symlink out", "fifo", "too large"])
def test_a_runs_report_json_that_is_not_its_own_regular_file_is_refused(tmp_path, capsys, runs, reader, damage):
    """``report compare`` followed a symlinked report.json to any local JSON and embedded it in
    compare.html; a 60 MB one ran past two minutes."""
    from mechkit.report.show import MAX_REPORT_BYTES

    run = _copy_run(runs / "r0", tmp_path / "run")
    report = run / "report.json"
    if damage == "symlink out":
        secret = tmp_path / "secret.json"
        secret.write_text(report.read_text().replace('"finding": "', '"finding": "SECRET '))
        report.unlink()
        report.symlink_to(secret)
    elif damage == "fifo":
        report.unlink()
        os.mkfifo(report)
    else:
        with report.open("r+b") as f:  # sparse: the size is what is checked, before any read
            f.truncate(MAX_REPORT_BYTES + 1)
    start = time.monotonic()
    if reader == "mk.load_report":
        with pytest.raises(MechkitError) as err:
            mk.load_report(run)
        lines = [str(err.value)]
    else:
        extra = ("--out", str(tmp_path / "cmp")) if reader == "report compare" else ()
        paths = (str(run), str(runs / "r1")) if reader == "report compare" else (str(run),)
        code, lines = _cli(capsys, *reader.split(), *paths, *extra)
        assert code == 2
    assert len(lines) == 1 and " — " in lines[0] and time.monotonic() - start < 10, lines
    assert not (tmp_path / "cmp").exists()


def test_a_report_json_named_directly_through_a_symlink_is_the_users_choice(tmp_path, capsys, runs):
    (tmp_path / "link.json").symlink_to(runs / "r0" / "report.json")
    code, err = _cli(capsys, "report", "show", str(tmp_path / "link.json"))
    assert code == 0, err


@pytest.mark.parametrize("length", [10_000, 2_000_000])
def test_a_long_report_string_is_cut_in_the_terminal(length):
    from mechkit.report.show import MAX_TEXT, safe_text

    text = safe_text("x" * length).plain
    assert len(text) < MAX_TEXT + 50 and f"{length - MAX_TEXT:,} more characters" in text


# ---- class 8: the API refuses what is not a model, and what it would ignore ----------------------------

def _calls(bad):
    import torch

    ids = torch.zeros(1, 2, dtype=torch.long)
    return {
        "ablate": lambda: mk.ablate(bad, heads="0.0").__enter__(),
        "edit_weights": lambda: mk.edit_weights(bad).__enter__(),
        "hooks": lambda: mk.hooks(bad, {}).__enter__(),
        "record": lambda: mk.record(bad, "blocks.0.hook_resid_post").__enter__(),
        "run_with_cache": lambda: mk.run_with_cache(bad, ids),
        "gradients": lambda: mk.gradients(bad, "blocks.0.hook_resid_post", ids, lambda x: x.sum()),
        "pattern_hooks": lambda: mk.pattern_hooks(bad, {}).__enter__(),
        "score_prompts": lambda: mk.score_prompts(bad, ["x"]),
        "to_transformer_lens": lambda: mk.to_transformer_lens(bad),
        "adaptive": lambda: mk.adaptive(bad, 0.5).__enter__(),
        "parse_heads": lambda: mk.parse_heads("0.0", bad if not isinstance(bad, int) else 0, 4),
    }


@pytest.mark.parametrize("bad", [None, "tiny:llama", 3], ids=["None", "spec", "int"])
@pytest.mark.parametrize("call", list(_calls(None)))
def test_an_api_function_given_no_model_is_a_mechkit_error_naming_load_model(call, bad):
    with pytest.raises(MechkitError) as err:
        _calls(bad)[call]()
    if call == "parse_heads":  # takes the model's shape, not the model
        assert "n_layers must be a whole number" in str(err.value) and "m.anatomy.n_layers" in str(err.value)
    else:
        assert f"mk.{call} needs a loaded model" in str(err.value) and "mk.load_model(" in str(err.value)


@pytest.mark.parametrize(("switch", "value"), [("write", "no"), ("write", None), ("force", "yes"), ("force", 1)])
def test_run_switches_that_are_not_true_or_false_are_refused_before_the_model_loads(tmp_path, monkeypatch,
                                                                                   switch, value):
    """``mk.run(..., write="no")`` wrote the report: any non-empty string is true."""
    monkeypatch.setattr("mechkit.model.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(MechkitError, match=f"{switch} must be True or False"):
        mk.run("inspect", model="tiny:llama", out=tmp_path / "r", **{switch: value})
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("ignored", [("--weights", "0.5"), ("--density", "0.5"), ("--p", "0.3"), ("--seed", "3")])
@pytest.mark.parametrize("command", ["merge", "apply"])
def test_expr_with_a_merge_method_option_is_refused_not_ignored(tmp_path, capsys, dirs, command, ignored):
    """``--expr a --weights 0.5`` wrote the unweighted vector and exited 0."""
    _, _, vector = dirs
    base = ("--base", "tiny:llama") if command == "apply" else ()
    out = tmp_path / ("o" if command == "apply" else "o.safetensors")
    argv = ("taskvec", command, *base, "-v", f"a={vector}", "--expr", "a", *ignored, "--out", str(out))
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and f"{ignored[0]} applies to --method merges" in err[0], err
    _fix_names_real_options(argv, err[0])
    assert not out.exists()


# ---- class 11: every fix a message suggests is right --------------------------------------------------

def test_the_fix_for_a_non_plugin_names_a_real_command():
    """It named `mechkit list`, which does not exist."""
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    with pytest.raises(MechkitError) as err:
        mk.run(3)
    command = re.search(r"`mechkit ([a-z ]+)`", str(err.value)).group(1)
    assert CliRunner().invoke(cli, command.split()).exit_code == 0


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_merge_weights_fix_names_one_weight_per_vector_and_it_runs(tmp_path, capsys, dirs, n):
    """Every weight 0 said "e.g. --weights 0.7,0.3" whatever the number of vectors: for one it failed."""
    _, _, vector = dirs
    vs = [a for i in range(n) for a in ("-v", f"v{i}={vector}")]
    argv = ("taskvec", "merge", *vs, "--method", "ties", "--weights", ",".join(["0"] * n),
            "--out", str(tmp_path / "m.safetensors"))
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1, err
    weights = re.search(r"--weights ([\d.,]+)", err[0].split(" — ")[1]).group(1)
    assert len(weights.split(",")) == n
    code, err = _cli(capsys, *argv[:-4], "--weights", weights, "--out", str(tmp_path / "ok.safetensors"))
    assert code == 0, err


@pytest.mark.parametrize(("model", "expected"), [("tiny:llama", 4), ("tiny:gpt2", 4)])
def test_the_compose_default_top_k_fits_the_tiny_models(monkeypatch, tmp_path, model, expected):
    """Class 11: ``mechkit compose`` on a tiny model failed by default (--top-k 5 of 8 heads leaves no
    random baseline). The default is now 5, at most half the heads; the study gets the resolved k."""
    from mechkit.compose import analysis

    seen = {}

    def capture(self, handle, pairs, config=None, **kw):
        seen["top_k"] = config.top_k
        raise MechkitError("stop here", "test")

    monkeypatch.setattr(analysis.ComposeStudy, "__init__", capture)
    with pytest.raises(MechkitError, match="stop here"):
        mk.run("compose", model=model, out=tmp_path / "c", pairs="capitalize+swap", parts="components")
    handle = mk.load_model(model)
    assert seen["top_k"] == expected == min(5, handle.anatomy.n_layers * handle.anatomy.n_heads // 2)


@pytest.mark.parametrize("targets", [["neurons"], ["heads", "layers"], ["neurons", "heads", "layers"]])
def test_an_unreachable_budget_names_targets_only_where_some_are_left(targets):
    """It said "add targets (--target neurons,heads,layers)" to a run that already pruned all three; adding
    targets is no longer offered at all (red-team 54: it was not known to reach the budget, and did not)."""
    from mechkit.pruning.study import budget_fix

    fix = budget_fix(targets, [{"cost_ratio": 0.5}, {"cost_ratio": 0.41}], "flops")
    assert fix == "raise --budget (the cheapest plan tried reached 0.41)" and "--target" not in fix


ERROR_CALL = re.compile(r"(Error|BadParameter|UsageError)$")
NOT_OURS = {"--head", "--no-deps", "--force-reinstall"}  # `ray start --head`, `pip install --no-deps …`


def _messages():
    """Every string of every error constructed in mechkit/, cli/ and plugins/: (file, line, text)."""
    files = [*sorted((ROOT / "mechkit").rglob("*.py")), *sorted((ROOT / "cli").glob("*.py")),
             *sorted((ROOT / "plugins").glob("*.py"))]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if ERROR_CALL.search(name or ""):
                    text = " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                                    and isinstance(n.value, str))
                    yield f.relative_to(ROOT), node.lineno, text


def _commands():
    import click

    from mechkit.cli.main import cli

    ctx, found = click.Context(cli), {}

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])
        else:
            found[" ".join(path)] = {o for p in cmd.params for o in (*getattr(p, "opts", ()),
                                                                     *getattr(p, "secondary_opts", ()))}
    walk(cli, [])
    return found


def test_every_option_and_command_a_message_names_exists():
    """The audit of class 11 as a test: each ``--option`` in an error message exists, on the plugin's own
    command for a message in plugins/, on some command for one in the core; each `mechkit CMD` exists."""
    commands = _commands()
    every = set().union(*commands.values())
    groups = {name.split()[0] for name in commands}
    wrong, checked = [], 0
    for path, line, text in _messages():
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - NOT_OURS - {"--help"}
        plugin = path.stem.replace("_", "-") if path.parts[0] == "plugins" else None
        scope = commands.get(plugin, every)
        for cmd in re.findall(r"`mechkit ([a-z-]+(?: [a-z-]+)?)", text):
            if cmd not in commands and cmd not in groups and cmd.split()[0] not in commands:
                wrong.append(f"{path}:{line}: `mechkit {cmd}`")
        wrong += [f"{path}:{line}: {o}" for o in sorted(options - scope)]
        checked += 1
    assert checked > 500 and not wrong, wrong
