"""Declared options: type, bounds, choices and parsers checked before the model loads, one line each.

The last tests hand every built-in plugin, on the command line, bad values derived from each
option's own declaration and check that each is refused with one line and exit code 2, that
nothing is written and that no model is ever loaded.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import mechkit as mk
from mechkit import registry
from mechkit.errors import MechkitError, PluginError
from mechkit.options import (
    Bounds,
    Choices,
    ExecutorChoice,
    ExistingPath,
    Grid,
    GuideList,
    HeadSpec,
    IntRanges,
    NumberList,
    Option,
    OptionError,
    OrAuto,
    Paths,
    RayAddress,
    SparsityLevels,
    TargetList,
    TaskList,
    Text,
    parse_lambdas,
)
from mechkit.options.option import MAX_COUNT
from mechkit.options.resolve import resolve_options

BUILTINS = sorted(name for name, entry in registry.entries().items() if entry.dist == "mechkit")

# --- Option: types, bounds, finiteness, choices ------------------------------------------------------------


def _refusal(opt: Option, value) -> str:
    with pytest.raises(OptionError) as info:
        opt.check(value)
    message = str(info.value)
    assert "\n" not in message and opt.flag in message and " — " in message, message
    return message


def test_bounds_are_inclusive_by_default():
    opt = Option("batch_size", int, 16, "Prompts per pass.", min=1, max=64)
    assert opt.check(1) == (1, 1) and opt.check("64") == (64, 64)
    assert _refusal(opt, 0) == "--batch-size 0 is below 1 — pass --batch-size from 1 to 64"
    assert _refusal(opt, "65") == "--batch-size 65 is above 64 — pass --batch-size from 1 to 64"
    assert _refusal(Option("batch_size", int, 16, min=1), "0") == \
        "--batch-size 0 is below 1 — pass --batch-size 1 or more"


def test_exclusive_bounds_refuse_the_bound_itself():
    opt = Option("lr", float, 1e-4, min=0, min_exclusive=True, max=1, max_exclusive=True)
    assert opt.check("1e-12")[0] == 1e-12 and opt.check(0.999)[0] == 0.999
    assert "is not above 0" in _refusal(opt, 0) and "is not below 1" in _refusal(opt, "1")
    assert Bounds(0, 1, True, True).describe() == "0<x<1" and Bounds(min=1).describe() == "x>=1"
    assert Bounds(max=3).describe() == "x<=3" and Bounds(0, 1).describe() == "0<=x<=1"


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", float("nan"), float("inf")])
def test_floats_must_be_finite(text):
    assert "not a finite number" in _refusal(Option("scale", float, 1.0), text)


def test_infinity_where_the_option_says_it_is_meaningful():
    opt = Option("max_norm", float, math.inf, finite=False, min=0)
    assert opt.check("inf")[0] == math.inf and opt.check(2)[0] == 2.0
    assert "not a finite number" in _refusal(opt, "nan")  # nan is never a value
    assert "below 0" in _refusal(opt, "-inf")


def test_values_from_python_and_from_the_command_line_coerce_alike(tmp_path):
    n = Option("n", int, 30)
    assert n.check("7") == n.check(7) == n.check(7.0) == (7, 7)
    for bad in ("7.5", 7.5, True, "", "seven", [7]):
        assert "is not a whole number" in _refusal(n, bad)
    x = Option("x", float, 1.0)
    assert x.check(2) == (2.0, 2.0) and isinstance(x.check(2)[0], float) and x.check(" 1e-3 ")[0] == 1e-3
    text = Option("shots", str, "0")
    assert text.check(0)[0] == "0" and text.check([0, 5])[0] == "0,5" and text.check(tmp_path)[0] == str(tmp_path)
    assert "is not text" in _refusal(text, {"a": 1})
    flag = Option("save", bool, False)
    assert flag.check("yes")[0] is True and flag.check("0")[0] is False and flag.check(1)[0] is True
    assert "true or false" in _refusal(flag, "maybe")


def test_choices_and_required():
    mode = Option("mode", str, "zero", choices=("zero", "mean"))
    assert mode.check("mean")[0] == "mean" and mode.check(None)[0] is None
    assert _refusal(mode, "evaporate") == "--mode must be one of zero, mean, got 'evaporate' — pass --mode zero"
    vectors = Option("vectors", str, None, required=True, parse=Paths(count=2))
    assert "--vectors is required" in _refusal(vectors, None)


def test_option_error_is_a_plugin_error_and_a_value_error():
    with pytest.raises(OptionError) as info:
        Option("n", int, 1, min=1).check(0)
    assert isinstance(info.value, PluginError) and isinstance(info.value, ValueError)
    assert info.value.exit_code == 2


def test_parser_errors_name_the_flag_the_value_and_the_fix():
    opt = Option("sweep", str, None, parse=NumberList(int, min=1, example="5,10"))
    assert _refusal(opt, "5,x") == ("--sweep '5,x': 'x' is not a whole number — use comma-separated whole numbers, "
                                    "each 1 or more, like 5,10")

    def strict(text: str) -> int:  # a third-party parser raising a plain ValueError
        if text != "ok":
            raise ValueError("must be ok")
        return 1

    custom = Option("thing", str, "ok", "The thing.", parse=strict)
    assert custom.check("ok") == ("ok", 1)
    assert _refusal(custom, "no") == "--thing 'no': must be ok — pass --thing TEXT: The thing"


def test_option_and_its_old_positional_form_and_reexports():
    from mechkit.plugin import Option as PluginOption

    assert mk.Option is PluginOption is Option
    opt = Option("from_report", str, None, "Read scores.", None, False, "from")
    assert opt.flag == "--from" and opt.help == "Read scores." and opt.min is None
    with pytest.raises(TypeError):
        Option("n", int, 1, "", None, False, None, 1)  # bounds are keyword-only


# --- parsers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[0], [3, 0, 3], [1, 2, 3, 10], [25, 5]])
def test_number_list_round_trips(values):
    text = ",".join(map(str, values))
    assert NumberList(int)(text) == tuple(values)
    assert NumberList(int, sort=True)(text) == tuple(sorted(set(values)))
    assert NumberList(float)(text) == tuple(float(v) for v in values)
    assert NumberList(int)(" , ".join(map(str, values)) + ",") == tuple(values)  # spaces, a trailing comma


def test_number_list_bounds_and_empties():
    assert NumberList(int, allow_empty=True)("") == () and NumberList(int, allow_empty=True)(" ") == ()
    for parser, text, word in [(NumberList(int), "", "no numbers"), (NumberList(int, allow_empty=True), ",", "no numbers"),
                               (NumberList(int, min=1), "3,0", "0 is below 1"),
                               (NumberList(int, max=8), "9", "9 is above 8"),
                               (NumberList(float), "1,nan", "not a finite"), (NumberList(int), "1.5", "whole number")]:
        with pytest.raises(OptionError, match=word):
            parser(text)
    assert NumberList(int, min=1, max=8)("1,8") == (1, 8)  # inclusive


def _old_parse_shots(text: str) -> tuple[int, ...]:
    """``mechkit.taskarith.finetune.parse_shots`` as the plugins used it: the reference for ``--shots``."""
    try:
        shots = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        shots = ()
    if not shots or min(shots) < 0:
        raise ValueError(text)
    return shots


def _old_parse_ks(text: str | None, default: int) -> list[int]:
    """``parse_ks`` as plugins/ablate.py had it: the reference for ``ablate --sweep``."""
    if not text:
        return [default]
    ks = sorted({int(x) for x in text.split(",") if x.strip()})
    if not ks or ks[0] < 1:
        raise ValueError(text)
    return ks


@pytest.mark.parametrize("plugin", ["finetune", "taskvec-sweep"])
def test_declared_shots_accept_exactly_what_parse_shots_accepted(plugin):
    declared = {opt.name: opt for opt in registry.get(plugin).options}["shots"]
    for text in ["0", "0,3", "3,0", "0, 3", "5,5", "0,", "10"]:
        assert declared.check(text)[1] == _old_parse_shots(text), text
    for text in ["", "x", "-1", "0,-2", "1.5", ","]:
        with pytest.raises(ValueError):
            _old_parse_shots(text)
        with pytest.raises(OptionError):
            declared.check(text)


def test_declared_sweep_accepts_exactly_what_parse_ks_accepted():
    declared = {opt.name: opt for opt in registry.get("ablate").options}["sweep"]
    for text in ["5,10,20", "20,5,5", "1", " 3 , 2 ", "4,,6", None, ""]:
        assert (list(declared.check(text)[1] or ()) or [7]) == _old_parse_ks(text, 7), text
    for text in ["five", "0,5", "-1", "1.5", ",", " "]:
        with pytest.raises(ValueError):
            _old_parse_ks(text, 7)
        if text != " ":  # blank text is "no sweep" now, as "" always was
            with pytest.raises(OptionError):
                declared.check(text)


def _old_parse_lambdas(text: str) -> list[float]:
    """The grammar as plugins/taskvec_sweep.py had it, the reference the λ grid must match."""
    if ":" in text:
        start, stop, step = (float(x) for x in text.split(":"))
        if step <= 0 or stop < start:
            raise ValueError
        n = int(round((stop - start) / step)) + 1
        values = [round(start + i * step, 10) for i in range(n) if start + i * step <= stop + 1e-9]
    else:
        values = [float(x) for x in text.split(",") if x.strip()]
    if not values:
        raise ValueError
    return sorted(dict.fromkeys(values))


@pytest.mark.parametrize("text", ["-1:1.5:0.1", "-1:1.5:0.5", "0:1:0.3", "-2:2:0.25", "0:0:1", "1,0,1",
                                  "-1,0,0.5,1", " 1 , 2 ", "0.1:0.7:0.2", "-1:1:1", "3", "1e-3:2e-3:1e-4"])
def test_lambda_grid_keeps_the_old_grammar(text):
    assert parse_lambdas(text) == _old_parse_lambdas(text)


@pytest.mark.parametrize("text", ["1:0:0.1", "0:1:0", "0:1:-1", "", ",", "a:b:c", "1:2", "0:1:0.1:4", "x",
                                  "nan", "inf", "0:inf:0.1", "nan:1:0.1", "0:1:1e-320", "0:20000:1"])
def test_lambda_grid_refuses_with_one_line(text):
    with pytest.raises(OptionError) as info:
        parse_lambdas(text)
    assert "\n" not in str(info.value) and " — " in str(info.value)
    assert isinstance(info.value, MechkitError)


def test_lambda_grid_start_stop_step_equals_its_listed_values():
    for start, stop, step in [(-1, 1.5, 0.1), (0, 2, 0.5), (-3, -1, 1)]:
        listed = ",".join(str(v) for v in parse_lambdas(f"{start}:{stop}:{step}"))
        assert parse_lambdas(listed) == parse_lambdas(f"{start}:{stop}:{step}")
    assert len(Grid(max_points=5)("0:4:1")) == 5
    with pytest.raises(OptionError, match="more than 5"):
        Grid(max_points=5)("0:5:1")


def test_int_ranges():
    parser = IntRanges()
    assert parser("12-14,3").values == (3, 12, 13, 14) and parser("5").values == (5,)
    assert parser("all").resolve(3) == [0, 1, 2] and parser("0-2,1").resolve(3) == [0, 1, 2]
    with pytest.raises(OptionError, match="out of range: the model has 3 layers"):
        parser("1-3").resolve(3)
    for bad in ["", "x", "-1", "3-1", "1-", "a-b", "1.5", "1--2"]:
        with pytest.raises(OptionError):
            parser(bad)


def test_task_list():
    assert TaskList()("swap+capitalize, swap,swap") == ["capitalize+swap", "swap"]
    assert TaskList(count=2, unique=False)("swap,swap") == ["swap", "swap"]
    assert TaskList(allow_empty=True)("") == []
    with pytest.raises(OptionError, match="takes one task id, got 2"):
        TaskList(count=1)("capitalize,swap")
    assert TaskList(count=1)("capitalize,capitalize") == ["capitalize"]  # a repeat is one task
    with pytest.raises(MechkitError, match="unknown task"):
        TaskList()("capitalise")
    with pytest.raises(MechkitError):
        TaskList()("")


def test_paths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    b.mkdir()
    assert Paths(count=2)(f"{a},{b}") == [str(a), str(b)] and ExistingPath()(str(b)) == str(b)
    for parser, text in [(Paths(count=2), str(a)), (Paths(count=2), f"{a},{tmp_path / 'c'}"), (Paths(), ""),
                         (ExistingPath(), ""), (ExistingPath(), str(tmp_path / "c"))]:
        with pytest.raises(OptionError):
            parser(text)


# --- the runner: params faithful, parsed values for the plugin ---------------------------------------------


class Echo(mk.Plugin):
    name, version, summary = "echo", "0.0.1", "test plugin echoing its parsed options"
    needs_model = False
    options = (Option("sweep", str, None, parse=NumberList(int, min=1, sort=True)),
               Option("n", int, 3, min=1), Option("tasks", str, "swap", parse=TaskList()))

    def run(self, ctx):
        return mk.Result(results={"parsed": dict(ctx.options), "params": dict(ctx.params)})


def test_report_params_keep_the_text_and_the_plugin_gets_parsed_values():
    run = mk.run(Echo, write=False, sweep="10,5,10", n="4", tasks="swap+capitalize")
    assert run.report["params"] == {"sweep": "10,5,10", "n": 4, "tasks": "swap+capitalize"}
    assert run.results["parsed"] == {"sweep": [5, 10], "n": 4, "tasks": ["capitalize+swap"]}
    assert resolve_options(Echo, {}) == ({"sweep": None, "n": 3, "tasks": "swap"},
                                         {"sweep": None, "n": 3, "tasks": ["swap"]})
    with pytest.raises(OptionError, match="--n 0 is below 1"):
        mk.run(Echo, write=False, n=0)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_default_passes_its_own_declaration(name):
    for opt in registry.get(name).options:
        if not opt.required:
            opt.check(opt.default)


# --- every built-in plugin, bad values from its declarations, on the command line --------------------------

GARBAGE = "garbage-value"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _outside(opt_or_parser) -> list[str]:
    """Numbers just outside the declared bounds, plus 0 and -1 where those are outside."""
    b = opt_or_parser.bounds
    out = []
    if b.min is not None:
        out.append(_fmt(b.min if b.min_exclusive else b.min - 1))
    if b.max is not None:
        out.append(_fmt(b.max if b.max_exclusive else b.max + 1))
    for v in (0, -1):  # outside by the declaration's own numbers, not by asking the checks
        low = b.min is not None and (v < b.min or (b.min_exclusive and v == b.min))
        high = b.max is not None and (v > b.max or (b.max_exclusive and v == b.max))
        if low or high:
            out.append(str(v))
    return out


def bad_values(opt: Option) -> list[str]:
    """Values the declaration itself says are wrong (never asking the checks what they refuse)."""
    if opt.is_flag:
        return []
    bad: list[str] = []
    if opt.type in (int, float):
        bad += ["", GARBAGE, "1,2", "nan"] + _outside(opt)
        if opt.type is int and opt.min is not None and opt.max is None:
            bad += [str(MAX_COUNT + 1)]  # every count has a ceiling
        bad += ["1.5", "inf"] if opt.type is int else (["inf", "-inf"] if opt.finite else [])
    elif opt.type is bool:
        bad += ["maybe", ""]
    if opt.choices:
        bad += ["bogus-choice", ""]
    p = opt.parse
    if isinstance(p, OrAuto):  # "auto" or what its inner parser takes: the inner parser's bad values
        p = p.inner
    if isinstance(p, NumberList):
        bad += [GARBAGE, "1,x", ","] + ([] if p.allow_empty else [""]) + _outside(p)
        bad += ["1.5", "nan"] if p.kind is int else ["nan", "inf"]
    elif isinstance(p, Grid):
        bad += [GARBAGE, "", "1:0:0.1", "0:1:0", "0:1:-1", "nan", "inf", "0:inf:0.1", "1:2",
                f"0:{p.max_points}:1"]
    elif isinstance(p, IntRanges):
        bad += [GARBAGE, "", "-1", "3-1", "1-", "a-b"]
    elif isinstance(p, TaskList):
        bad += [GARBAGE, "capitalize,nope"] + ([] if p.allow_empty else [""])
        ids = ["capitalize", "swap", "two-sum", "past-tense"]
        if p.count is not None:
            bad += [",".join(ids[:p.count + 1])] + ([",".join(ids[:p.count - 1])] if p.count > 1 else [])
    elif isinstance(p, HeadSpec):
        bad += [GARBAGE, "", ",", "a.b", "layer:-1", "-0.0", "induction:-1"]
    elif isinstance(p, Choices):
        bad += [GARBAGE, "", ",", f"{p.choices[0]},bogus-choice"]
    elif isinstance(p, Text):
        bad += ["", "   ", "x" * (p.max_chars + 1)]
    elif isinstance(p, Paths):
        bad += [GARBAGE, ""] + ([",".join(f"/nonexistent/{i}" for i in range(p.count))] if p.count else [])
    elif isinstance(p, ExistingPath):
        bad += ["", "/nonexistent/report.json"]
    elif isinstance(p, GuideList):
        bad += [GARBAGE, "", ",", "random,nope", "wanda@bogus", "nope@global", "@global"]
    elif isinstance(p, TargetList):
        bad += [GARBAGE, "", ",", "neurons,mlp"]
    elif isinstance(p, SparsityLevels):
        bad += [GARBAGE, "", ",", "1", "1.5", "-0.1", "nan", "inf", "0.2,x", "neurons=", "bogus=0.2",
                "neurons=1", "neurons=0.2,0.3"]
    elif isinstance(p, RayAddress):
        bad += [GARBAGE, "", "head-node", "host:", ":6379", "host:0", "host:70000", "ray://host"]
    # ExecutorChoice refuses only "ray" where Ray is not installed: its bad values are the choices' own
    return list(dict.fromkeys(bad))


PARSER_KINDS = (OrAuto, NumberList, Grid, IntRanges, TaskList, Choices, HeadSpec, Paths, ExistingPath, GuideList, TargetList, SparsityLevels,
                RayAddress, ExecutorChoice, Text)
"""Every kind of parser :func:`bad_values` derives cases for; a declaration with another kind fails the fuzz."""


CASES = [(name, opt, value) for name in BUILTINS for opt in registry.get(name).options for value in bad_values(opt)]
print(f"test_options: {len(CASES)} bad inputs over {len(BUILTINS)} built-in plugins")


def _flag(plugin: str, name: str) -> str:
    return {o.name: o for o in registry.get(plugin).options}[name].flag


def _required(plugin: str, tmp_path: Path, skip: str) -> dict[str, str]:
    """Valid values for the plugin's required options (existing files for a ``Paths`` parser)."""
    values = {}
    for opt in registry.get(plugin).options:
        if opt.required and opt.name != skip and isinstance(opt.parse, TaskList):
            values[opt.name] = "capitalize"
            continue
        if opt.required and opt.name != skip:
            assert isinstance(opt.parse, Paths), f"derive a valid value for {plugin} {opt.flag}"
            files = [tmp_path / f"{opt.name}{i}" for i in range(opt.parse.count or 1)]
            for f in files:
                f.write_text("")
            values[opt.name] = ",".join(map(str, files))
    return values


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every bad value must be refused before."""
    from mechkit.model import loading

    def boom(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", boom)
    monkeypatch.setattr("mechkit.model.load_model", boom)


def test_fuzz_covers_every_plugin_and_kind_of_declaration():
    names = {name for name, _, _ in CASES}
    assert names == set(BUILTINS) and {"prune", "icl-vectors"} <= names  # those through types and choices
    assert len(CASES) >= 540, len(CASES)
    for name in BUILTINS:
        declared = [o for o in registry.get(name).options if o.min is not None or o.parse is not None]
        assert declared, f"{name} declares no bounds or parsers"
        for opt in declared:
            assert opt.parse is None or isinstance(opt.parse, PARSER_KINDS), \
                f"{name} {opt.flag}: teach bad_values about {type(opt.parse).__name__}"
    for name in ("prune", "icl-vectors"):  # every option but the flags is fuzzed
        fuzzed = {opt.name for plugin, opt, _ in CASES if plugin == name}
        assert fuzzed == {o.name for o in registry.get(name).options if not o.is_flag}, (name, sorted(fuzzed))
    parsed = {type(opt.parse) for name, opt, _ in CASES if name in ("prune", "icl-vectors")}
    assert {GuideList, TargetList, SparsityLevels, TaskList, IntRanges, NumberList, ExistingPath} <= parsed
    bounded = {(name, opt.name) for name, opt, _ in CASES if opt.min is not None}
    assert {("prune", "budget"), ("prune", "calib"), ("icl-vectors", "shots"), ("icl-vectors", "n_cie")} <= bounded


@pytest.mark.parametrize("name", BUILTINS)
def test_bad_values_are_one_line_exit_2_before_the_model_loads(name, tmp_path, no_model):
    from mechkit.cli.main import cli

    runner = CliRunner()
    out = tmp_path / "out"
    cases = [(opt, value) for plugin, opt, value in CASES if plugin == name]
    slow = []
    for opt, value in cases:
        required = _required(name, tmp_path, skip=opt.name)  # so only the bad value is wrong
        args = [a for k, v in required.items() for a in (_flag(name, k), v)]
        t = time.perf_counter()
        result = runner.invoke(cli, [name, "--model", "llama", "--out", str(out), *args, opt.flag, value])
        took = time.perf_counter() - t
        lines = result.stderr.strip().splitlines()
        what = f"{name} {opt.flag} {value!r}: exit {result.exit_code}, stderr {result.stderr!r}"
        assert result.exit_code == 2, what
        assert len(lines) == 1 and lines[0].startswith("mechkit: error:") and opt.flag in lines[0], what
        assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), what
        assert result.stdout == "" and not out.exists(), what
        with pytest.raises(OptionError, match=re.escape(opt.flag)):  # the same from Python, before any model
            mk.run(name, model="llama", write=False, **required, **{opt.name: value})
        if took > 1.0:
            slow.append((opt.flag, value, round(took, 2)))
    assert len(slow) <= 1, slow  # the first case may pay for imports (the task registry)


def test_click_usage_and_type_errors_are_one_line_exit_2(tmp_path, no_model):
    from mechkit.cli.main import cli

    runner = CliRunner()
    for args, needle in [(["inspect", "--seed", "abc"], "--seed"), (["inspect", "--nope", "1"], "--nope"),
                         (["no-such-command"], "No such command"), (["inspect", "--n"], "--n")]:
        result = runner.invoke(cli, [*args, "--out", str(tmp_path / "out")] if args[0] == "inspect" else args)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("mechkit: error:"), result.stderr
        assert needle in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", BUILTINS)
def test_help_shows_bounds_and_choices(name):
    from mechkit.cli.main import cli

    result = CliRunner().invoke(cli, [name, "--help"], terminal_width=250, max_content_width=250)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for opt in registry.get(name).options:
        assert opt.flag in text
        if opt.bounds:
            assert opt.bounds.describe() in text, (opt.flag, opt.bounds.describe())
        for choice in opt.choices or ():
            assert choice in text


def test_help_and_errors_stay_clear_of_torch():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from mechkit.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['ablate', '--help']); assert r.exit_code == 0, r.output; "
            "r = CliRunner().invoke(cli, ['ablate', '--n', '0']); assert r.exit_code == 2, r.output; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_declared_type_reports_through_click_as_our_one_line():
    from mechkit.cli.plugin_command import declared_option

    command = click.Command("x", params=[declared_option(Option("n", int, 3, "N.", min=1))],
                            callback=lambda n: click.echo(f"n={n}"))
    assert CliRunner().invoke(command, ["--n", "5"]).output == "n=5\n"
    with pytest.raises(OptionError, match="--n 0 is below 1"):
        command.main(["--n", "0"], standalone_mode=False)

