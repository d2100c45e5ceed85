"""Red-team pass 23 (b): the resume key of a plugin's code, and the completion of a recording.

A plugin with no source file (a notebook cell, exec) was keyed by its class's bytecode alone, so a cell edited
in a default argument, a global it reads, a helper function it calls, a closure's value or a property's body
resumed on steps the old code computed; a single-file plugin's ``import myhelpers`` from its folder was not in
its key at all. ``Cache.completion`` completed a float32 recording with a bfloat16 model's activations (it
took the looser of the two tolerances), and refused a recording made with ``logits_to_keep`` (replayed
without it, every position's logits came back).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.plugin_key import plugin_code

# ---- K1: a plugin without a source file is keyed by what its code reaches --------------------------------

_PLUGIN = """
class P(mk.Plugin):
    name, version, summary = "rt23b-cell", "0.1", "t"
    def run(self, ctx{args}):
        return mk.Result(results={{"a": ctx.step("a", lambda: {reads})}}, finding="ok")
"""

CELLS = {
    "default argument": ("", _PLUGIN.format(args=", scale={v}", reads="scale")),
    "keyword-only default": ("", _PLUGIN.format(args=", *, scale={v}", reads="scale")),
    "global value": ("SCALE = {v}\n", _PLUGIN.format(args="", reads="SCALE")),
    "global dict": ("CONFIG = {'scale': {v}, 'name': 'x'}\n", _PLUGIN.format(args="", reads="CONFIG['scale']")),
    "helper function": ("def helper():\n    return {v}\n", _PLUGIN.format(args="", reads="helper()")),
    "helper of a helper": ("def inner():\n    return {v}\ndef helper():\n    return inner()\n",
                           _PLUGIN.format(args="", reads="helper()")),
    "helper class": ("class Helper:\n    def value(self):\n        return {v}\n",
                     _PLUGIN.format(args="", reads="Helper().value()")),
    "lambda in a global list": ("STEPS = [lambda: {v}]\n", _PLUGIN.format(args="", reads="STEPS[0]()")),
    "closure value": ("def make(k):\n" + textwrap.indent(_PLUGIN.format(args="", reads="k"), "    ")
                      + "    return P\nP = make({v})\n", ""),
    "property body": ("", """
class P(mk.Plugin):
    name, version, summary = "rt23b-cell", "0.1", "t"
    @property
    def scale(self):
        return {v}
    def run(self, ctx):
        return mk.Result(results={"a": ctx.step("a", lambda: self.scale)}, finding="ok")
"""),
    "staticmethod's global": ("SCALE = {v}\n", """
class P(mk.Plugin):
    name, version, summary = "rt23b-cell", "0.1", "t"
    @staticmethod
    def scale():
        return SCALE
    def run(self, ctx):
        return mk.Result(results={"a": ctx.step("a", self.scale)}, finding="ok")
"""),
    "big global edited at its start": ("BIG = [{v}] + list(range(1_000_000))\n",
                                       _PLUGIN.format(args="", reads="BIG[0]")),
    "global referring to itself": ("CFG = {'v': {v}}\nCFG['self'] = CFG\n",
                                   _PLUGIN.format(args="", reads="CFG['v']")),
}


def _cell(source: str, value: int) -> type:
    """The plugin class a notebook cell (exec, no source file) defines."""
    namespace = {"mk": mk, "torch": torch, "os": os}
    exec(compile(source.replace("{v}", str(value)), "<cell>", "exec"), namespace)
    return namespace["P"]


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_a_cell_edited_in_what_its_code_reaches_gets_another_key(kind):
    source = "".join(CELLS[kind])
    started = time.monotonic()
    first = plugin_code(_cell(source, 1))
    assert time.monotonic() - started < 20  # bounded work, a million-item global included
    assert plugin_code(_cell(source, 1)) == first  # the same cell: the same key (it resumes)
    assert plugin_code(_cell(source, 2)) != first, kind  # edited: another key (it starts fresh)


def test_a_user_module_a_cell_imports_is_in_the_key(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    helper = tmp_path / "rt23b_cellhelper.py"
    helper.write_text("VALUE = 1\n")
    lazy = tmp_path / "rt23b_lazyhelper.py"
    lazy.write_text("VALUE = 1\n")
    source = "import rt23b_cellhelper\n" + _PLUGIN.format(
        args="", reads="(rt23b_cellhelper.VALUE, __import__('os') and 0)") + textwrap.dedent("""
        def lazily():
            import rt23b_lazyhelper
            return rt23b_lazyhelper.VALUE
        P.lazily = staticmethod(lazily)
        """)
    try:
        plugin = _cell(source, 1)
        first = plugin_code(plugin)
        assert plugin_code(plugin) == first
        helper.write_text("VALUE = 2\n")  # the module the cell imported, edited on disk
        second = plugin_code(plugin)
        assert second != first
        lazy.write_text("VALUE = 2\n")  # a module imported inside a function (not imported yet)
        assert plugin_code(plugin) != second
    finally:
        for name in ("rt23b_cellhelper", "rt23b_lazyhelper"):
            sys.modules.pop(name, None)


def test_the_key_of_a_cell_is_the_same_in_another_process():
    """Sets iterate in another order and objects sit at other addresses in each process: the key does not."""
    script = textwrap.dedent("""
        import mechkit as mk, torch
        from mechkit.plugin_key import plugin_code
        ns = {"mk": mk, "torch": torch}
        exec(compile('''
        NAMES = {"alpha", "beta", "gamma", "delta"}
        class Obj:
            pass
        THING = Obj()
        THING.value = 3
        W = torch.arange(6.0)
        class P(mk.Plugin):
            name, version, summary = "rt23b-proc", "0.1", "t"
            def run(self, ctx, w=W):
                return mk.Result(results={"a": ctx.step("a", lambda: (sorted(NAMES), THING.value, w.sum()))})
        ''', "/tmp/ipykernel_%d/cell.py" % __import__("os").getpid(), "exec"), ns)
        print(plugin_code(ns["P"]))
    """)
    keys = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        keys.add(done.stdout.strip().splitlines()[-1])
    assert len(keys) == 1


_KILLED = """
import os, sys
import mechkit as mk
val, kill = int(sys.argv[1]), sys.argv[2] == "kill"
g = {"mk": mk, "os": os}
exec(compile(f"SCALE = {val}\\ndef helper():\\n    return {val}\\n"
"class P(mk.Plugin):\\n    name='rt23b-kill'; version='0.1'; summary='t'\\n"
f"    def run(self, ctx, scale={val}):\\n"
"        a = ctx.step('a', lambda: (scale, SCALE, helper()))\\n"
"        if os.environ.get('RT23B_KILL'):\\n            os._exit(9)\\n"
"        return mk.Result(results={'a': a, 'b': (scale, SCALE, helper())}, finding='x')\\n", "<cell>", "exec"), g)
print(mk.run(g["P"], model="tiny:llama", out=sys.argv[3], force=True).results)
"""


def test_a_cell_killed_after_a_step_and_edited_does_not_resume_the_old_step(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(_KILLED)
    root = str(Path(mk.__file__).resolve().parent.parent)
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": root}
    killed = subprocess.run([sys.executable, str(script), "1", "kill", str(tmp_path / "out")],
                            capture_output=True, text=True, env={**env, "RT23B_KILL": "1"}, timeout=300)
    assert killed.returncode == 9, killed.stderr[-2000:]
    again = subprocess.run([sys.executable, str(script), "2", "run", str(tmp_path / "out")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == "{'a': [2, 2, 2], 'b': [2, 2, 2]}"


# ---- K2: a single-file plugin's own modules ---------------------------------------------------------------

_FILE_PLUGIN = """
import mechkit as mk
{imports}

class P(mk.Plugin):
    name, version, summary = "rt23b-file", "0.1", "t"

    def run(self, ctx):
        {lazy}
        return mk.Result(results={{"a": ctx.step("a", lambda: {reads})}}, finding="ok")
"""

IMPORTS = {
    "import": ("import {h}", "", "{h}.helper()", "{h}"),
    "from-import": ("from {h} import helper", "", "helper()", "{h}"),
    "import inside run": ("", "import {h}", "{h}.helper()", "{h}"),
    "a helper's own import": ("import {h}", "", "{h}.helper()", "{h}_deep"),
    "a package's module": ("from {h}_pkg.mod import helper", "", "helper()", "{h}_pkg/mod"),
}


@pytest.mark.parametrize("kind", sorted(IMPORTS))
def test_a_single_file_plugins_own_imported_modules_are_in_its_key(kind, tmp_path, monkeypatch):
    imports, lazy, reads, edited = IMPORTS[kind]
    h = f"rt23b_h{sorted(IMPORTS).index(kind)}"
    (tmp_path / f"{h}_deep.py").write_text("VALUE = 1\n")
    (tmp_path / f"{h}.py").write_text(f"import {h}_deep\n\ndef helper():\n    return {h}_deep.VALUE\n")
    (tmp_path / f"{h}_pkg").mkdir()
    (tmp_path / f"{h}_pkg" / "__init__.py").write_text("")
    (tmp_path / f"{h}_pkg" / "mod.py").write_text("def helper():\n    return 1\n")
    plugin = f"rt23b_plug{sorted(IMPORTS).index(kind)}"
    (tmp_path / f"{plugin}.py").write_text(_FILE_PLUGIN.format(
        imports=imports.format(h=h), lazy=lazy.format(h=h), reads=reads.format(h=h)))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = __import__(plugin).P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        target = tmp_path / f"{edited.format(h=h)}.py"
        target.write_text(target.read_text() + "EDITED = True\n")  # edited between a kill and the rerun
        assert plugin_code(cls) != first
    finally:
        for name in [n for n in sys.modules if n.startswith((h, plugin))]:
            del sys.modules[name]


# ---- K3: a completion in another dtype or on another device ---------------------------------------------

TEXT = "hello world, the cat sat on the mat"


def _recorded(**kwargs):
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens(TEXT)
    with mk.record(m, "blocks.1.hook_resid_post") as cache:
        m(ids, **kwargs)
    return m, ids, cache


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_completion_after_the_model_changed_dtype_is_refused(dtype):
    m, _, cache = _recorded()
    m.model.to(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(MechkitError, match=f"recorded in float32 on cpu but the model now runs in {name}"):
        cache.completion("blocks.0.hook_resid_pre")
    with pytest.raises(MechkitError, match="complete it before changing the model's dtype"):
        cache.to_transformer_lens()


def test_a_completion_in_the_recorded_dtype_still_completes_and_the_check_names_the_device():
    m, ids, cache = _recorded()
    got = cache.completion("blocks.0.hook_resid_pre")["blocks.0.hook_resid_pre"]
    _, full = mk.run_with_cache(m, ids, "blocks.0.hook_resid_pre")
    assert torch.equal(got, full["blocks.0.hook_resid_pre"])
    values, kind = cache.marks[0]  # what the forward ran in: the logits' dtype and device, the weights' dtype
    assert kind == ("float32", "cpu", "float32")
    cache.marks[0] = (values, ("float32", "cuda:0", "float32"))  # as recorded on a GPU, completed on the CPU
    with pytest.raises(MechkitError, match="recorded in float32 on cuda:0 but the model now runs in float32 on cpu"):
        cache.completion("blocks.0.hook_resid_mid")


# ---- K4: a recording made with logits_to_keep ------------------------------------------------------------

@pytest.mark.parametrize("keep", [1, 3, "positions"])
def test_a_recording_made_with_logits_to_keep_completes(keep):
    keep = torch.tensor([0, 4, 7]) if keep == "positions" else keep
    m, ids, cache = _recorded(logits_to_keep=keep)
    got = cache.completion("blocks.0.hook_resid_pre")["blocks.0.hook_resid_pre"]
    _, full = mk.run_with_cache(m, ids, "blocks.0.hook_resid_pre")
    assert torch.equal(got, full["blocks.0.hook_resid_pre"])  # every position's activation, as recorded
    assert list(copy.deepcopy(cache).shaping[0]) == ["logits_to_keep"]  # kept by a copy
    with torch.no_grad():
        m.model.model.norm.weight.mul_(2)  # the check stays as strict: a weight edit since is refused
    with pytest.raises(MechkitError, match="the model now gives other logits"):
        cache.completion("blocks.0.hook_resid_mid")


def test_forwards_with_and_without_logits_to_keep_complete_together():
    m = mk.load_model("tiny:llama")
    first = m.to_tokens(TEXT)
    second = first.flip(1)
    with mk.record(m, "blocks.1.hook_resid_post") as cache:
        m(first, logits_to_keep=1)
        m(second)
    tl = cache.to_transformer_lens()
    assert tl["blocks.0.hook_resid_pre"].shape[0] == 2
