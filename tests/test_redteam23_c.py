"""Red-team pass 23 (c): what it found, fixed.

C1: the unchanged check compared the handle's and the tokenizer's objects and attributes but not their classes,
so ``obj.__class__ = Sub`` (a same-named subclass reversing ``to_tokens`` or the tokenizer's ``__call__``) passed.
C2: the config fields a save records (``architectures``, ``dtype``, ``transformers_version``) were skipped
whatever their value. C3: ``--layers 0-99999999999`` was expanded before any bound (24 GB, then an OOM kill),
and a list of counts took any size. C4/C5: ``adapt --n 1 --shots 0`` left a task no held-out prompt: a numpy
traceback, or a NaN accuracy refused after the whole study as if the weights were NaN. C6: a file's copy of a
computed buffer (``rotary_emb.inv_freq``) with other values was dropped without a word.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from mechkit.options import OptionError
from tests.conftest import cli_in_process, edit_plugin

ROOT = Path(__file__).resolve().parents[1]


def _refusal(edit) -> str:
    with pytest.raises(MechkitError) as err:
        mk.run(edit_plugin(edit, "rt23c-edit"), model=mk.load_model("tiny:llama"), write=False)
    return str(err.value)


# --- C1: classes swapped on the handle, its tokenizer and the objects it holds -----------------------------------


_SWAPPED: list = []  # (object, its class): put back after each test (a handle's backend is shared by every handle)


@pytest.fixture(autouse=True)
def _classes_put_back():
    yield
    while _SWAPPED:
        obj, base = _SWAPPED.pop()
        obj.__class__ = base


def _swap(obj, **methods):
    """``obj.__class__`` set to a same-named subclass of its class with ``methods`` overriding."""
    base = type(obj)
    sub = type(base.__name__, (base,), {name: make(base) for name, make in methods.items()})
    sub.__qualname__ = base.__qualname__
    _SWAPPED.append((obj, base))
    obj.__class__ = sub


def _flip_call(base):
    def __call__(self, *a, **k):
        out = base.__call__(self, *a, **k)
        if "input_ids" in out and torch.is_tensor(out["input_ids"]):
            out["input_ids"] = out["input_ids"].flip(-1)
        return out
    return __call__


def _flip_tokens(base):
    return lambda self, *a, **k: base.to_tokens(self, *a, **k).flip(-1)


@pytest.mark.parametrize("edit,where", [
    (lambda h: _swap(h.tokenizer, __call__=_flip_call), "handle.tokenizer"),
    (lambda h: _swap(h, to_tokens=_flip_tokens), "the handle"),
    (lambda h: _swap(h.backend), "handle.backend"),
    (lambda h: _swap(h.anatomy), "handle.anatomy"),
])
def test_a_class_swapped_on_the_handle_or_what_it_holds_is_refused(edit, where):
    assert f"the class of {where}" in _refusal(edit)


@pytest.mark.parametrize("edit,words", [
    (lambda h: _swap(h.model.config), "the class of its config was swapped"),
    (lambda h: _swap(h.model.generation_config), "the class of its generation_config was swapped"),
])
def test_a_class_swapped_on_the_models_config_is_refused(edit, words):
    assert words in _refusal(edit)


def test_a_class_swapped_and_put_back_passes_and_the_reported_repro_is_refused():
    def put_back(h):
        base = type(h.tokenizer)
        _swap(h.tokenizer, __call__=_flip_call)
        h.tokenizer.__class__ = base

    run = mk.run(edit_plugin(put_back, "rt23c-edit"), model=mk.load_model("tiny:llama"), write=False)
    assert all(run.report["checks"].values())

    class P(mk.Plugin):  # the report's repro as given
        name, version, summary = "rt", "0.1", "t"

        def run(self, ctx):
            t = ctx.model.tokenizer
            base = type(t)

            class E(base):
                def __call__(s, *a, **k):
                    o = base.__call__(s, *a, **k)
                    o["input_ids"] = o["input_ids"].flip(-1)
                    return o

            E.__name__ = base.__name__
            t.__class__ = E
            return mk.Result(results={"x": 1}, finding="x")

    with pytest.raises(MechkitError, match="the class of handle.tokenizer .* was swapped"):
        mk.run(P, model=mk.load_model("tiny:llama"), write=False)


# --- C2: the config fields a save records ------------------------------------------------------------------------


def _set_config(field, value):
    return lambda h: setattr(h.model.config, field, value)


@pytest.mark.parametrize("field,value", [("architectures", ["GPT2LMHeadModel"]),
                                         ("architectures", ["LlamaForCausalLM", "GPT2LMHeadModel"]),
                                         ("dtype", "float16"), ("dtype", torch.bfloat16),
                                         ("transformers_version", "0.0.1")])
def test_a_saved_record_set_to_what_no_save_writes_is_refused(field, value):
    assert f"its config field {field} was set to" in _refusal(_set_config(field, value))


def test_a_saved_record_set_on_a_modules_own_config_is_refused_too():
    h = mk.load_model("tiny:llama")  # a config only one module holds, there before the run
    attn = h.model.model.layers[0].self_attn
    attn.config = type(h.model.config).from_dict(h.model.config.to_dict())

    def edit(m):
        m.model.model.layers[0].self_attn.config.architectures = ["GPT2LMHeadModel"]

    with pytest.raises(MechkitError, match=r"its config field architectures was set to \[.GPT2LMHeadModel.\] \(was None\), not what save_pretrained"):
        mk.run(edit_plugin(edit, "rt23c-edit"), model=h, write=False)


@pytest.mark.parametrize("field,saved,foreign", [("architectures", ["LlamaForCausalLM"], ["LlamaAttention"]),
                                                 ("dtype", "float32", "int8"),
                                                 ("dtype", torch.float32, torch.float64),
                                                 ("transformers_version", "installed", "99.0.0")])
def test_what_save_pretrained_writes_passes_and_nothing_else(field, saved, foreign):
    import transformers

    saved = transformers.__version__ if saved == "installed" else saved
    run = mk.run(edit_plugin(_set_config(field, saved), "rt23c-edit"), model=mk.load_model("tiny:llama"),
                 write=False)
    assert all(run.report["checks"].values())
    assert f"its config field {field} was set to" in _refusal(_set_config(field, foreign))


# --- C3: ranges and counts bounded before anything is built ------------------------------------------------------


def _under_memory_limit(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter limited to 1 GiB of address space: a range expanded to billions of indices
    ends in MemoryError there (the old code), not on the machine."""
    script = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n" + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


@pytest.mark.parametrize("text", ["0-99999999999", "3,99999999999", "0-3,100001-100002", "7-" + "9" * 30])
def test_a_huge_layer_range_is_one_line_naming_the_option_without_expanding_it(text):
    done = _under_memory_limit(f"""
        from mechkit.options import Option, OptionError
        from mechkit.options.parsers import IntRanges
        try:
            Option("layers", str, "all", parse=IntRanges()).check({text!r})
        except OptionError as err:
            print("REFUSED", err)
    """)
    assert done.returncode == 0 and "MemoryError" not in done.stderr, done.stderr[-400:]
    assert "REFUSED --layers" in done.stdout and "no model has that many" in done.stdout
    assert "use all, a range like 12-24" in done.stdout


def test_ranges_up_to_the_bound_parse_and_one_past_it_is_refused():
    from mechkit.options.parsers import MAX_INDEX, IntRanges

    assert IntRanges()("0-3,8").values == (0, 1, 2, 3, 8)
    assert IntRanges()(f"{MAX_INDEX - 1}-{MAX_INDEX}").values == (MAX_INDEX - 1, MAX_INDEX)
    with pytest.raises(OptionError, match="no model has that many"):
        IntRanges()(f"{MAX_INDEX}-{MAX_INDEX + 1}")


@pytest.mark.parametrize("plugin,flag,value", [("compose", "shots", "0,99999999999"),
                                               ("ablate", "sweep", "5,10,99999999999"),
                                               ("taskvec-sweep", "shots", "99999999999"),
                                               ("adapt", "token_layers", "1,5000000")])
def test_a_count_list_past_max_count_is_refused_like_a_count_option(plugin, flag, value):
    from mechkit import registry

    option = next(o for o in registry.get(plugin).options if o.name == flag)
    with pytest.raises(OptionError, match=r"is more than 1,000,000 — a count that large is a typo"):
        option.check(value)


def test_counts_up_to_max_count_and_declared_bounds_are_kept():
    from mechkit.options.parsers import NumberList

    assert NumberList(int, min=0)("0,1000000") == (0, 1000000)
    assert NumberList(int, min=0, max=10**9)("99999999") == (99999999,)  # a declared max is the plugin's
    assert NumberList(float, min=0)("1e12") == (1e12,)  # not a count
    with pytest.raises(OptionError, match="1000001 is more than 1,000,000"):
        NumberList(int, min=0)("1000001")


# --- C4/C5: adapt with a task left no held-out prompt ------------------------------------------------------------


@pytest.mark.parametrize("tasks,n,seed", [(["past-tense"], 1, 0), (["capitalize", "past-tense", "country-capital"], 1, 0),
                                          (["past-tense", "capitalize"], 1, 0)])
def test_a_task_left_no_held_out_prompt_is_refused_before_any_work_with_fixes_that_work(tiny_llama, tasks, n, seed):
    from mechkit.adapt import AdaptConfig, AdaptStudy

    config = AdaptConfig(n=n, shots=0, n_calib=2, repeats=1, seed=seed)
    with pytest.raises(MechkitError) as err:
        AdaptStudy(tiny_llama, tasks, config)
    text = str(err.value)
    assert "no held-out prompt is left for past-tense" in text and "--shots 1" in text
    named = int(re.search(r"--n (\d+) \(n=\1\) or more", text).group(1))
    for fixed in (AdaptConfig(n=named, shots=0, n_calib=2, repeats=1, seed=seed),
                  AdaptConfig(n=named + 3, shots=0, n_calib=2, repeats=1, seed=seed),
                  AdaptConfig(n=n, shots=1, n_calib=2, repeats=1, seed=seed)):
        assert all(AdaptStudy(tiny_llama, tasks, fixed).test.values())  # each fix named leaves every task some


def test_the_cli_refuses_in_one_line_before_the_study(tmp_path):
    done = cli_in_process("adapt", "--model", "tiny:llama", "--tasks", "past-tense", "--n", "1", "--shots", "0",
                          "--calib", "2", "--repeats", "1", "--budgets", "0.5,0.7,1.0", "--out", str(tmp_path / "a"))
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in said
    assert "no held-out prompt is left for past-tense" in said and "NaN" not in said
    assert not (tmp_path / "a" / "report.json").exists()


# --- C6: a file's copy of a buffer the model computes ------------------------------------------------------------


def _model_dir(path: Path, family: str, extra: dict) -> Path:
    from safetensors.torch import load_file, save_file

    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model(family)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    tensors = {**load_file(path / "model.safetensors"), **extra}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _buffer(family: str, name: str) -> torch.Tensor:
    from mechkit.model.sources.tiny import tiny_model

    return dict(tiny_model(family)[0].named_buffers())[name].clone()


@pytest.mark.parametrize("family,name,value", [
    ("llama", "model.rotary_emb.inv_freq", lambda b: torch.ones_like(b)),
    ("llama", "model.rotary_emb.inv_freq", lambda b: b * 2),
    ("llama", "model.rotary_emb.inv_freq", lambda b: b[:4]),
    ("qwen2", "model.rotary_emb.inv_freq", lambda b: b + 1),
    ("phi3", "model.rotary_emb.inv_freq", lambda b: b / 2),
    ("gpt_neox", "gpt_neox.rotary_emb.inv_freq", lambda b: b.flip(0)),
])
def test_a_file_buffer_with_other_values_than_the_model_computes_is_refused(tmp_path, family, name, value):
    d = _model_dir(tmp_path / "m", family, {name: value(_buffer(family, name)).contiguous()})
    with pytest.raises(ModelLoadError, match=f"holds {name} with other values"):
        mk.load_model(str(d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_an_equal_copy_of_a_buffer_loads_and_one_off_by_a_step_is_refused(tmp_path, dtype):
    name = "model.rotary_emb.inv_freq"
    d = _model_dir(tmp_path / "m", "llama", {name: _buffer("llama", name).to(dtype)})
    h = mk.load_model(str(d))
    assert torch.equal(h.model.model.rotary_emb.inv_freq, _buffer("llama", name))
    off = _buffer("llama", name) * 1.1  # rope frequencies a tenth off: another model than config.json computes
    with pytest.raises(ModelLoadError, match="with other values"):
        mk.load_model(str(_model_dir(tmp_path / "off", "llama", {name: off.to(dtype)})))
