"""Red-team pass 16 (b): what a confirming pass on option refusals and their fixes found (issue 32, class 11).

A refusal of several options ignored for one reason named the first alone, and its fix "drop it" dropped that
one: the rerun was refused for the next (``sweep --method attribution --executor ray --workers 2``: "drop it"
for --executor, then --workers). Now the refusal names them all, and its drop fix drops them all.
"""

from __future__ import annotations

import re

import pytest

from mechkit.options.option import OptionError


def _checks(plugin: str, options: dict) -> None:
    """The option checks a run makes before the model loads: the plugin's own, then the execution check."""
    from mechkit import registry
    from mechkit.executors import check_execution
    from mechkit.options.resolve import resolve_options

    params, _ = resolve_options(registry.get(plugin), options)
    check_execution(params)


def _dropped(plugin: str, options: dict, alternative: str) -> dict:
    """``options`` without the flags a "drop --a, --b and --c" alternative names."""
    from mechkit import registry

    names = {o.flag: o.name for o in registry.get(plugin).options}
    words = re.fullmatch(r"drop (.+)", alternative.strip())
    assert words, alternative
    flags = re.split(r", | and ", words.group(1))
    assert all(flag in names for flag in flags), alternative
    return {k: v for k, v in options.items() if k not in {names[flag] for flag in flags}}


SEVERAL_IGNORED = [  # (plugin, options, the options ignored for one reason, the other alternative's edit)
    ("sweep", {"method": "attribution", "executor": "ray", "workers": 2}, ("--executor", "--workers"),
     {"method": "both"}),
    ("prune", {"budget": 0.5, "executor": "ray", "workers": 2}, ("--executor", "--workers"), {"budget": None}),
    ("select-tasks", {"target": "capitalize", "executor": "ray", "workers": 2}, ("--executor", "--workers"),
     {"validate": True}),
    ("select-tasks", {"target": "capitalize", "executor": "ray", "workers": 2, "ray_address": "auto"},
     ("--executor", "--ray-address", "--workers"), None),
    ("ablate", {"heads": "0.1", "top_k": 3, "sweep": "1,2"}, ("--top-k", "--sweep"), None),
    ("ablate", {"heads": "0.1", "n_seqs": 5, "seg_len": 9}, ("--n-seqs", "--seg-len"), None),
]


@pytest.mark.parametrize(("plugin", "options", "flags", "other"), SEVERAL_IGNORED)
def test_a_refusal_of_several_ignored_options_names_them_all_and_its_fix_runs(plugin, options, flags, other):
    with pytest.raises(OptionError) as err:
        _checks(plugin, options)
    message, fix = str(err.value), err.value.fix
    assert all(flag in message for flag in flags), message
    first, _, rest = fix.partition(", or ")
    fixed = _dropped(plugin, options, first)
    assert all(fixed.get(o) is None for o in ("executor", "workers", "ray_address")) or plugin == "ablate"
    assert len(fixed) == len(options) - len(flags)
    _checks(plugin, fixed)  # the drop fix refuses nothing now
    if other is not None:  # the other alternative keeps every option, now read
        edited = {k: v for k, v in {**options, **other}.items() if v is not None}
        _checks(plugin, edited)


def test_one_ignored_option_keeps_its_drop_it_fix():
    with pytest.raises(OptionError) as err:
        _checks("sweep", {"method": "attribution", "workers": 2})
    assert "(and so would" not in str(err.value)
    assert err.value.fix.startswith("drop it, or pass --method both and add --executor ray")


def test_a_default_fix_drops_every_option_named():
    from mechkit.options import Option
    from mechkit.options.unused import refuse_ignored

    class Demo:
        options = (Option("top_k", int, 10, min=1), Option("sweep", str, None), Option("n", int, 5))

    with pytest.raises(OptionError) as err:
        refuse_ignored(Demo, {"top_k": 3, "sweep": "1,2", "n": 5}, ("top_k", "sweep", "n"), "ranks heads")
    assert str(err.value).startswith("--top-k ranks heads, so it would be ignored (and so would --sweep)")
    assert err.value.fix == "drop --top-k and --sweep"


# --- Option values no check refused (issue 32, option-value fuzz) ---

NONE_FOR_A_VALUE = [("ablate", "heads"), ("adapt", "tasks"), ("adapt", "budgets"), ("compose", "parts"),
                    ("finetune", "checkpoint_every"), ("prune", "target"), ("prune", "guide"), ("sweep", "n"),
                    ("shuffle", "seeds"), ("select-tasks", "validate")]


@pytest.mark.parametrize(("plugin", "name"), NONE_FOR_A_VALUE)
def test_none_for_an_option_with_a_value_by_default_is_one_line(plugin, name):
    """None where the option has no "none" value raised TypeError or AttributeError in the option checks (or
    passed them and failed mid-run); now one line, whose fix (leave it out) runs."""
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    cls = registry.get(plugin)
    required = {o.name: "capitalize" for o in cls.options if o.required}
    with pytest.raises(OptionError, match=r"None: it takes .*, not None") as err:
        resolve_options(cls, {**required, name: None})
    assert "leave it out (default: " in err.value.fix
    resolve_options(cls, required)


def test_none_stays_the_value_of_an_option_whose_default_is_none():
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    params, _ = resolve_options(registry.get("ablate"), {"top_k": None, "from_report": None})
    assert params["top_k"] is None and params["from_report"] is None


@pytest.mark.parametrize(("plugin", "name", "value"), [
    ("ablate", "from_report", "x" * 300), ("attention", "from_report", "y/" * 3000),
    ("icl-vectors", "load_vector", "z" * 5000), ("taskvec-sweep", "vectors", "a.safetensors," + "b" * 400)])
def test_a_path_the_system_cannot_look_up_is_refused_as_that_option(plugin, name, value):
    """A name too long for the file system raised OSError from the option check, which the command line
    reported as "cannot write …: choose a shorter --out" (no --out was given)."""
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    with pytest.raises(OptionError) as err:
        resolve_options(registry.get(plugin), {name: value})
    assert "--out" not in str(err.value) and "--out" not in err.value.fix
    assert "cannot be looked up" in str(err.value) or "does not exist" in str(err.value)


def test_a_long_from_on_the_command_line_names_from_not_out(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["ablate", "--model", "tiny:llama", "--from", "x" * 300])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "cannot be looked up" in result.output and "shorter --out" not in result.output


# --- Model specs and paths the system cannot look up (issue 32, class 2: refused in one line before work) ---

@pytest.mark.parametrize("spec", ["x" * 300, "x" * 300 + ".gguf", "a/" + "x" * 300, "a/b--c", "org/name-"])
def test_a_model_spec_no_path_or_hub_id_can_be_is_one_line_about_the_model(spec):
    """A name too long for the file system was "cannot write …: choose a shorter --out" (no --out given); an
    org/name the hub's rules refuse raised huggingface_hub's HFValidationError."""
    import mechkit as mk
    from mechkit.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as err:
        mk.load_model(spec)
    assert "--out" not in str(err.value) and "org/name" in err.value.fix


def test_a_home_no_user_has_is_one_line(monkeypatch):
    import mechkit as mk
    from mechkit.errors import ModelLoadError
    from mechkit.model.sources.peek import spec_config

    assert spec_config("~no-such-user-rt16b/model") is None  # the loader says why
    with pytest.raises(ModelLoadError, match="no home directory"):
        mk.load_model("~no-such-user-rt16b/model")


def test_from_expands_the_home_as_model_does(monkeypatch, tmp_path):
    """``--model ~/d`` loads; ``--from ~/d`` was "does not exist"."""
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "detect").mkdir()
    _, parsed = resolve_options(registry.get("ablate"), {"from_report": "~/detect", "top_k": 1})
    assert parsed["from_report"] == str(tmp_path / "detect")


@pytest.mark.parametrize("spec", ["~nosuchuser/x", "x" * 300, "x" * 300 + "/config"])
def test_a_model_spec_with_an_out_is_one_line_about_the_model_not_the_out(tmp_path, monkeypatch, spec):
    """With --out given, the runner's check of the run's inputs looked the spec up first: ``~nosuchuser`` raised
    RuntimeError as a traceback and a too-long name gave "choose a shorter --out"."""
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["inspect", "--model", spec, "--out", "o"])
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and "shorter --out" not in result.output
    assert "model" in result.output or "~nosuchuser" in result.output
    assert not (tmp_path / "o").exists()
