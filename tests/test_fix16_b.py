"""Fixes of issue 32 (helper 16 b): `cache clear` deletes only run-steps folders mechkit marked when it made
them; every fix a refusal offers passes the option checks; prune refuses a target part it was given no
sparsity for, and calibration options it would not read; adapt on a model pruned in layers."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from mechkit.io.disk_cache import RUN_MARKER, clear_cache, is_entry, list_cache
from mechkit.plugin import RunContext


def _user_folder(runs: Path, name: str, files: dict[str, str]) -> Path:
    folder = runs / name
    folder.mkdir(parents=True)
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


USER_FOLDERS = [  # a user's folders named like a run key, holding only .json files
    ("0123456789abcdef", {"results.json": '{"acc": 0.9}'}),
    ("deadbeefdeadbeef", {"a.json": "{}", "b.json": "[]"}),
    ("00000000", {"metrics.json": "1"}),
]


@pytest.mark.parametrize(("name", "files"), USER_FOLDERS)
def test_a_users_hex_named_folder_of_json_survives_clear(monkeypatch, tmp_path, name, files):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = _user_folder(tmp_path / "runs", name, files)
    assert not is_entry("runs", folder)
    rows = {e.name: e for e in list_cache(tmp_path)}
    assert "runs" not in rows
    unmarked = [e for e in rows.values() if e.kind == "not mechkit's"]
    assert len(unmarked) == 1 and name in unmarked[0].source
    clear_cache(all_entries=True, root=tmp_path)
    with pytest.raises(Exception, match="no cache entry"):
        clear_cache([f"runs/{name}"], root=tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    assert all((folder / f).read_text() == t for f, t in files.items())


@pytest.mark.parametrize("how", ["all", "runs", "named"])
def test_a_real_runs_steps_folder_is_marked_and_cleared(monkeypatch, tmp_path, how):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    user = _user_folder(tmp_path / "runs", "0123456789abcdef", {"results.json": "{}"})
    resume = tmp_path / "runs" / "fedcba9876543210"
    ctx = RunContext(model=None, params={}, seed=0, resume_dir=resume, console=Console(file=io.StringIO()))
    assert ctx.step("one", lambda: 1) == 1 and ctx.step("two", lambda: [2]) == [2]
    assert json.loads((resume / RUN_MARKER).read_text())["mechkit"] == "run steps"
    assert is_entry("runs", resume)
    assert any(e.name == "runs" and "1 run(s)" in e.source for e in list_cache(tmp_path))
    names = {"all": (), "runs": ["runs"], "named": ["runs/fedcba9876543210"]}[how]
    removed = clear_cache(names, all_entries=how == "all", root=tmp_path)
    assert removed and not resume.exists()
    assert (user / "results.json").read_text() == "{}"


def test_a_scratch_folder_marks_the_run_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    resume = tmp_path / "runs" / "aaaaaaaaaaaaaaaa"
    scratch = RunContext(model=None, params={}, seed=0, resume_dir=resume, console=Console(file=io.StringIO())).scratch("finetunes")
    (scratch / "ft-0123456789abcdef").mkdir(parents=True)
    (scratch / "ft-0123456789abcdef" / "checkpoint.safetensors").write_bytes(b"")  # a unit's checkpoint (select-tasks)
    assert is_entry("runs", resume)
    clear_cache(["runs"], root=tmp_path)
    assert not resume.exists()


def test_cache_lists_total_counts_only_what_clear_would_free(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    _user_folder(tmp_path / "runs", "0123456789abcdef", {"big.json": "x" * 5000})
    resume = tmp_path / "runs" / "fedcba9876543210"
    RunContext(model=None, params={}, seed=0, resume_dir=resume, console=Console(file=io.StringIO())).step("one", lambda: 1)
    out = CliRunner().invoke(cli, ["cache", "list"]).output
    ours = sum(f.stat().st_size for f in resume.rglob("*") if f.is_file())
    assert ours < 1000 and "runs (unmarked)" in out
    assert f"total: {ours} B (not counting the unmarked folders)" in out


# --- Every fix a refusal offers passes the option checks (issue 32, class 11) ---

def _checks(plugin: str, options: dict) -> None:
    """The option checks a run makes before the model loads: the plugin's own, then the execution check."""
    from mechkit import registry
    from mechkit.executors import check_execution
    from mechkit.options.resolve import resolve_options

    params, _ = resolve_options(registry.get(plugin), options)
    check_execution(params)


_STEP = re.compile(r"\b(drop|pass|add) (--[a-z-]+)(?: ([^\s,()-][^\s,()]*))?")


def _apply(plugin: str, options: dict, refused: str, alternative: str) -> dict:
    """``options`` with one offered alternative applied, read from its words: ``drop it`` (the refused option),
    ``drop --X``, ``pass --X [V]``, ``add --X V``. A word after a flag option (``pass --validate and``) is no value."""
    from mechkit import registry

    flags = {"--" + o.name.replace("_", "-"): o for o in registry.get(plugin).options}
    fixed = dict(options)
    if alternative.strip().startswith("drop it"):
        fixed.pop(refused)
    for verb, flag, value in _STEP.findall(alternative):
        name = flags[flag].name
        if verb == "drop":
            fixed.pop(name, None)
        else:
            fixed[name] = True if flags[flag].type is bool else value
    return fixed


REFUSED_WITH_TWO_FIXES = [  # (plugin, options, the option refused)
    ("prune", {"budget": 0.5, "workers": 2}, "workers"),
    ("sweep", {"method": "attribution", "workers": 2}, "workers"),
    ("select-tasks", {"target": "capitalize", "workers": 2}, "workers"),
    ("select-tasks", {"target": "capitalize", "ray_address": "auto"}, "ray_address"),
    ("sweep", {"method": "attribution", "ray_address": "auto"}, "ray_address"),
    ("prune", {"budget": 0.5, "ray_address": "auto"}, "ray_address"),
]


@pytest.mark.parametrize(("plugin", "options", "refused"), REFUSED_WITH_TWO_FIXES)
def test_each_offered_fix_passes_the_option_checks(plugin, options, refused):
    from mechkit.options.option import OptionError

    with pytest.raises(OptionError) as err:
        _checks(plugin, options)
    fix = err.value.fix
    alternatives = fix.split(", or ")
    assert len(alternatives) == 2 and "--executor ray" in alternatives[1], fix
    for alternative in alternatives:
        fixed = _apply(plugin, options, refused, alternative)
        assert fixed != options
        if fixed.get("ray_address") == "auto":  # a reachable cluster is not this test's to have
            fixed.pop("ray_address")
        _checks(plugin, fixed)  # refuses nothing now


def test_the_fix_adds_no_executor_where_ray_is_given():
    from mechkit.options.option import OptionError

    with pytest.raises(OptionError) as err:
        _checks("sweep", {"method": "attribution", "workers": 2, "executor": "ray"})
    assert "--executor ray" not in err.value.fix.split(", or ")[1]


# --- A --target part that --sparsity TARGET=F pairs give no fraction is refused ---

@pytest.mark.parametrize(("target", "sparsity", "missing", "extra"), [
    ("neurons,heads", "neurons=0.3", "heads", {"gqa": "group"}),
    ("neurons,heads", "neurons=0.3", "heads", {"protect_top_k": 2, "guide": "induction"}),
    ("neurons,heads,layers", "heads=0.3,neurons=0.2", "layers", {}),
    ("heads,layers", "layers=0.25", "heads", {}),
    ("neurons,layers", "layers=0.25", "neurons", {}),
])
def test_a_target_part_without_a_fraction_is_refused_and_each_fix_runs(target, sparsity, missing, extra):
    from mechkit.options.option import OptionError

    options = {"target": target, "sparsity": sparsity, **extra}
    with pytest.raises(OptionError, match=f"names {missing}, and --sparsity {sparsity} gives it no fraction") as err:
        _checks("prune", options)
    fixes = re.findall(r"\(([^()]*)\)", err.value.fix)
    assert len(fixes) == 2, err.value.fix
    for fixed in fixes:  # (--sparsity S), then (--target T) with "and drop --gqa" after it where given
        applied = options | dict(re.findall(r"--(target|sparsity) (\S+)", fixed))
        tail = err.value.fix.split(fixed + ")")[1]
        for flag in re.findall(r"and drop --([a-z-]+)", tail):
            applied.pop(flag.replace("-", "_"))
        _checks("prune", applied)


@pytest.mark.parametrize("target", ["neurons,heads", "neurons,heads,layers", "heads,layers"])
def test_a_bare_fraction_is_every_targets(target):
    """``--sparsity 0.3`` gives each --target part 0.3: nothing left out, nothing refused."""
    from mechkit.options.pruning import SparsityLevels

    assert SparsityLevels()("0.3").resolve(target.split(",")) == [dict.fromkeys(target.split(","), 0.3)]
    _checks("prune", {"target": target, "sparsity": "0.3", "gqa": "group"})


@pytest.mark.parametrize(("options", "flag"), [
    ({"target": "layers", "sparsity": "layers=0.2", "gqa": "group"}, "--gqa"),
    ({"target": "neurons", "sparsity": "neurons=0.3", "gqa": "group"}, "--gqa"),
    ({"target": "heads", "sparsity": "heads=0.3", "allocation": "sensitivity"}, "--allocation"),
])
def test_an_add_a_target_fix_gives_it_a_fraction_too(options, flag):
    from mechkit.options.option import OptionError

    with pytest.raises(OptionError, match=f"^{flag}") as err:
        _checks("prune", options)
    added = err.value.fix.split(", or add ")[1].split(": ", 1)[1]
    fixed = options | dict(re.findall(r"--(target|sparsity) (\S+)", added))
    assert fixed["sparsity"] != options["sparsity"]
    _checks("prune", fixed)


# --- --calib-text-weight where nothing reads the calibration statistics ---

@pytest.mark.parametrize("options", [
    {"guide": "magnitude,random", "reconstruct": "none", "calib_text_weight": 0.9},
    {"guide": "random", "reconstruct": "none", "calib_text_weight": 0.0, "target": "neurons,heads"},
    {"guide": "magnitude", "reconstruct": "none", "calib_text_weight": 0.2, "target": "heads"},
    {"guide": "random", "reconstruct": "none", "calib_text_weight": 0.2, "target": "layers"},
])
def test_an_unread_calib_text_weight_is_refused_and_each_fix_runs(options):
    from mechkit.options.option import OptionError

    with pytest.raises(OptionError, match="^--calib-text-weight mixes text") as err:
        _checks("prune", options)
    drop, other = err.value.fix.split(", or ")
    _checks("prune", {k: v for k, v in options.items() if k != "calib_text_weight"})
    fixed = dict(options)
    if "--reconstruct" in other:
        fixed["reconstruct"] = "mean"
    else:
        fixed["guide"] = other.split("--guide ")[1]
    _checks("prune", fixed)


@pytest.mark.parametrize("options", [  # each reads the calibration statistics: accepted
    {"guide": "magnitude", "reconstruct": "none", "target": "layers"},  # magnitude's layer scores
    {"guide": "wanda,random", "reconstruct": "none"},
    {"guide": "magnitude", "reconstruct": "mean"},
    {"guide": "magnitude", "reconstruct": "none", "allocation": "sensitivity"},
    {"guide": "magnitude", "reconstruct": "none", "budget": 0.5},
])
def test_a_read_calib_text_weight_is_accepted(options):
    _checks("prune", {**options, "calib_text_weight": 0.9, "calib": 4})


# --- adapt on a model pruned in layers alone ---

@pytest.fixture(scope="module")
def deep_llama(tmp_path_factory):
    """A 4-block tiny llama saved as a directory (tiny:llama has 2 blocks: pruning one leaves too few for adapt)."""
    from mechkit.model.sources.tiny import tiny_model

    model, tokenizer = tiny_model("llama", num_hidden_layers=4)
    folder = tmp_path_factory.mktemp("deep") / "model"
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


ADAPT_FAST = dict(tasks="capitalize,past-tense", n=2, calib=2, budgets="0.7", margin=0.05, repeats=1,
                  prune_budgets="")


@pytest.mark.parametrize("sparsity", ["0.25", "0.5"])
def test_adapt_runs_on_a_model_pruned_in_layers(monkeypatch, tmp_path, deep_llama, sparsity):
    import mechkit as mk
    from mechkit.runner import pruned_kinds

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    mk.run("prune", model=str(deep_llama), out=tmp_path / "p", target="layers", sparsity=sparsity, guide="random",
           reconstruct="none", n=2, calib=2, repeats=1, save_model=True)
    pruned = mk.load_model(str(tmp_path / "p" / "model"))
    assert pruned_kinds(pruned) == {"layers"} and pruned.anatomy.n_layers == 4 - round(4 * float(sparsity))
    run = mk.run("adapt", model=pruned, out=tmp_path / "a", **ADAPT_FAST)
    row = run.results["rows"][0]
    assert row["budget"] == 0.7 and 0 < row["adaptive"]["latency_ratio"] < 2
    assert 0 <= row["adaptive"]["mean_accuracy"] <= 1 and row["adaptive"]["inputs"] > 0


# --- --gqa group without KV groups, refused from the config before the model loads ---

def _config_only_dir(tmp_path: Path, **config) -> Path:
    """A directory holding a config.json and no weights: any load of it fails, so a refusal naming --gqa
    came before the load."""
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


MHA_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], num_attention_heads=4,
                 num_key_value_heads=4, hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=300)


@pytest.mark.parametrize("plugin, options", [
    ("prune", {"target": "heads", "gqa": "group"}),
    ("prune", {"target": "neurons,heads", "gqa": "group"}),
    ("shuffle", {"gqa": "group"}),
])
@pytest.mark.parametrize("spec", ["tiny:gpt2", "tiny:gpt_neox", "mha-dir"])
def test_gqa_group_without_kv_groups_is_refused_before_the_load(monkeypatch, tmp_path, plugin, options, spec):
    import mechkit as mk
    from mechkit.options.option import OptionError

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    model = str(_config_only_dir(tmp_path, **MHA_LLAMA)) if spec == "mha-dir" else spec
    with pytest.raises(OptionError, match="config has one KV head per query head") as err:
        mk.run(plugin, model=model, write=False, **options)
    fixed = {k: v for k, v in options.items() if k != "gqa"}
    assert err.value.fix.startswith("drop --gqa group")
    from mechkit import registry
    from mechkit.options.resolve import resolve_options
    from mechkit.runner import check_config

    check_config(resolve_options(registry.get(plugin), fixed)[1], model)  # the fix passes this check


@pytest.mark.parametrize("spec, config, expected", [
    ("tiny:llama", None, True),
    ("tiny:gpt2", None, False),
    ("dir", {**MHA_LLAMA, "num_key_value_heads": 2}, True),
    ("dir", MHA_LLAMA, False),
    ("dir", {**MHA_LLAMA, "mechkit_pruning": {"head_keep": {}}}, None),  # a pruned model: the load tells
    ("dir", {"model_type": "falcon", "num_attention_heads": 4, "multi_query": True}, None),
])
def test_a_config_says_kv_groups_only_where_it_is_plain(tmp_path, spec, config, expected):
    from mechkit.model.sources.peek import has_kv_groups, spec_config

    model = str(_config_only_dir(tmp_path, **config)) if spec == "dir" else spec
    assert has_kv_groups(spec_config(model)) is expected


@pytest.mark.parametrize("spec", ["llama", "smollm2", "toy:induction", "org/name", "missing-dir", "tiny:nope"])
def test_no_config_is_read_where_it_is_not_cheap(monkeypatch, tmp_path, spec):
    """Nor from a folder bearing the embedded model's name: the loader loads the embedded model for it."""
    from mechkit.model.sources.peek import spec_config

    monkeypatch.chdir(tmp_path)
    if ":" not in spec:
        Path(spec).mkdir(parents=True)
        (Path(spec) / "config.json").write_text(json.dumps(MHA_LLAMA))
    assert (spec_config(spec) is None) == (spec not in ("org/name", "missing-dir"))
