"""Red-team pass 24 (b): the resume key of a plugin's code, past what pass 23's walk of a cell's globals saw.

An object with a repr of its own (a dataclass, an ``nn.Module``) was keyed by that repr, so a method edited or
other weights between a kill and the rerun resumed on steps the old code computed; a helper function kept in
a set was keyed by its name; a set's hash order (a dict built from a set, a dataclass holding one, an object
array's pointers) made the key another each process, so a rerun never resumed; an installed helper package
outside a fixed list of libraries was not in the key at all; a nested tensor raised out of the key; and every
object was asked for ``tobytes``, running a user's ``__getattr__``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.plugin_key import plugin_code
from tests.conftest import kill_then_rerun

_PLUGIN = """
class P(mk.Plugin):
    name, version, summary = "rt24b-cell", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"a": ctx.step("a", lambda: {reads})}}, finding="ok")
"""


def _cell(source: str, value: object = 1) -> type:
    """The plugin class a notebook cell (exec, no source file) defines."""
    namespace = {"mk": mk, "torch": torch, "np": np, "os": os}
    exec(compile(source.replace("{v}", str(value)), "<cell>", "exec"), namespace)
    return namespace["P"]


# ---- R1/R2: an object's methods and state, a set's functions ---------------------------------------------

EDITS = {
    "dataclass method": ("import dataclasses\n@dataclasses.dataclass\nclass C:\n    k: int = 1\n"
                         "    def f(self):\n        return {v}\nCFG = C()\n", "CFG.f()"),
    "method behind a custom repr": ("class C:\n    def __repr__(self):\n        return 'C()'\n"
                                    "    def f(self):\n        return {v}\nOBJ = C()\n", "OBJ.f()"),
    "attribute behind a custom repr": ("class C:\n    def __repr__(self):\n        return 'C()'\n"
                                       "OBJ = C()\nOBJ.k = {v}\n", "OBJ.k"),
    "slot behind a custom repr": ("class C:\n    __slots__ = ('k',)\n    def __repr__(self):\n        return 'C()'\n"
                                  "OBJ = C()\nOBJ.k = {v}\n", "OBJ.k"),
    "module weights": ("torch.manual_seed({v})\nPROBE = torch.nn.Linear(4, 4)\n", "PROBE.weight.sum().item()"),
    "submodule weights": ("torch.manual_seed({v})\nNET = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),"
                          " torch.nn.Linear(4, 2))\n", "NET(torch.ones(4)).sum().item()"),
    "bound method's instance": ("torch.manual_seed({v})\nSTEP = torch.nn.Linear(4, 4).forward\n",
                                "STEP(torch.ones(4)).sum().item()"),
    "helper in a frozenset": ("def helper():\n    return {v}\nHELPERS = frozenset([helper])\n",
                              "[f() for f in HELPERS][0]"),
    "helper in a set": ("def helper():\n    return {v}\nHELPERS = {helper}\n", "[f() for f in HELPERS][0]"),
    "helper in a set in a dict": ("def helper():\n    return {v}\nREG = {'steps': frozenset([helper])}\n",
                                  "[f() for f in REG['steps']][0]"),
    "long string's end": ("TEXT = 'x' * 20000 + '{v}'\n", "TEXT[-1]"),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_an_objects_method_state_or_a_sets_function_edited_gets_another_key(kind):
    pre, reads = EDITS[kind]
    source = pre + _PLUGIN.format(reads=reads)
    first = plugin_code(_cell(source, 1))
    assert plugin_code(_cell(source, 1)) == first  # the same cell: it resumes
    assert plugin_code(_cell(source, 2)) != first, kind  # edited between the kill and the rerun: it starts fresh


def test_a_cell_with_an_edited_helper_in_a_set_killed_after_a_step_does_not_resume_it(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import mechkit as mk
        val = int(sys.argv[1]); g = {"mk": mk, "os": os}
        exec(compile(f'''
        def helper():
            return {val}
        HELPERS = frozenset([helper])
        class P(mk.Plugin):
            name = "rt24b-set"; version = "0.1"; summary = "t"
            def run(self, ctx):
                a = ctx.step("a", lambda: [f() for f in HELPERS][0])
                if os.environ.get("RT24B_KILL"):
                    os._exit(9)
                return mk.Result(results={{"a": a, "b": [f() for f in HELPERS][0]}}, finding="x")
        ''', "<cell>", "exec"), g)
        print(mk.run(g["P"], model="tiny:llama", out=sys.argv[2], force=True).results)
    """))
    assert kill_then_rerun(script, tmp_path, "1", "2", "RT24B_KILL") == "{'a': 2, 'b': 2}"


# ---- R3/R4: the same cell gets the same key in another process -------------------------------------------

SEEDED = {
    "dict from a set": "D = {k: len(k) for k in {'alpha', 'beta', 'gamma', 'delta', 'eps', 'zeta'}}\n",
    "dict.fromkeys of a set": "D = dict.fromkeys({'alpha', 'beta', 'gamma', 'delta'}, 0)\n",
    "dataclass holding a set": "import dataclasses\n@dataclasses.dataclass\nclass C:\n    tasks: set\n"
                               "D = C({'alpha', 'beta', 'gamma', 'delta'})\n",
    "SimpleNamespace holding a set": "import types\nD = types.SimpleNamespace(names={'alpha', 'beta', 'gamma'})\n",
    "object with a repr printing a set": "class C:\n    def __init__(self):\n        self.s = {'alpha', 'beta', 'gamma'}\n"
                                         "    def __repr__(self):\n        return repr(self.s)\nD = C()\n",
    "set of functions": "def f():\n    return 1\ndef g():\n    return 2\ndef h():\n    return 3\n"
                        "D = frozenset([f, g, h])\n",
    "dict keyed by a set's functions": "def f():\n    return 1\ndef g():\n    return 2\n"
                                       "D = {fn: fn.__name__ for fn in {f, g}}\n",
    "object array": "D = np.array(['cat', 'dog', 'bird'], dtype=object)\n",
}


def test_the_key_of_a_cell_holding_hash_ordered_values_is_the_same_in_another_process():
    script = textwrap.dedent("""
        import json, sys, numpy as np, torch, mechkit as mk
        from mechkit.plugin_key import plugin_code
        cases = json.loads(sys.argv[1])
        plugin = '''
        class P(mk.Plugin):
            name, version, summary = "rt24b-proc", "0.1", "t"
            def run(self, ctx):
                return mk.Result(results={"a": ctx.step("a", lambda: D)}, finding="ok")
        '''
        for kind, pre in sorted(cases.items()):
            ns = {"mk": mk, "torch": torch, "np": np}
            exec(compile(pre + plugin, "<cell>", "exec"), ns)
            print(kind, "=", plugin_code(ns["P"]))
    """)
    import json

    keys = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script, json.dumps(SEEDED)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        keys.append(dict(line.split(" = ") for line in done.stdout.strip().splitlines() if " = " in line))
    assert sorted(keys[0]) == sorted(SEEDED)
    differ = [kind for kind in SEEDED if keys[0][kind] != keys[1][kind]]
    assert differ == []  # each resumes in a new process


def test_an_object_array_is_keyed_by_its_items_not_their_addresses():
    source = "LABELS = np.array([''.join(['c', 'a', 't']), '{v}'], dtype=object)\n" + _PLUGIN.format(reads="list(LABELS)")
    first, again = _cell(source, "dog"), _cell(source, "dog")  # equal items at other addresses, both alive
    assert plugin_code(again) == plugin_code(first)
    assert plugin_code(_cell(source, "bird")) != plugin_code(first)


# ---- R5: an installed helper package outside mechkit's list of libraries ---------------------------------

def _site(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "rt24b_mylab").mkdir(parents=True)
    (site / "rt24b_mylab" / "__init__.py").write_text(
        "def helper():\n    return 1\n\nclass Scaler:\n    def value(self):\n        return 1\n")
    info = site / "rt24b_mylab-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rt24b-mylab\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("rt24b_mylab\n")
    (site / "rt24b_loose.py").write_text("def helper():\n    return 1\n")  # no distribution claims it
    monkeypatch.syspath_prepend(str(site))
    return site


INSTALLED = {
    "module global": ("import rt24b_mylab\n", "rt24b_mylab.helper()", "mylab"),
    "imported function": ("from rt24b_mylab import helper\n", "helper()", "mylab"),
    "imported class's instance": ("from rt24b_mylab import Scaler\nS = Scaler()\n", "S.value()", "mylab"),
    "module without a distribution": ("from rt24b_loose import helper\n", "helper()", "loose"),
}


@pytest.mark.parametrize("kind", sorted(INSTALLED))
def test_an_installed_helper_upgraded_between_a_kill_and_the_rerun_gets_another_key(kind, tmp_path, monkeypatch):
    site = _site(tmp_path, monkeypatch)
    pre, reads, which = INSTALLED[kind]
    try:
        plugin = _cell(pre + _PLUGIN.format(reads=reads))
        first = plugin_code(plugin)
        assert plugin_code(plugin) == first
        if which == "mylab":  # pip install -U rt24b-mylab
            (site / "rt24b_mylab-1.0.dist-info" / "METADATA").write_text(
                "Metadata-Version: 2.1\nName: rt24b-mylab\nVersion: 1.1\n")
        else:
            (site / "rt24b_loose.py").write_text("def helper():\n    return 2\n")
        assert plugin_code(plugin) != first
    finally:
        for name in ("rt24b_mylab", "rt24b_loose"):
            sys.modules.pop(name, None)


def test_a_single_file_plugins_installed_helper_upgraded_gets_another_key(tmp_path, monkeypatch):
    site = _site(tmp_path, monkeypatch)
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "rt24b_fileplug.py").write_text("import mechkit as mk\nimport rt24b_mylab\n\n" + textwrap.dedent(
        _PLUGIN.format(reads="rt24b_mylab.helper()")))
    monkeypatch.syspath_prepend(str(folder))
    try:
        cls = __import__("rt24b_fileplug").P
        first = plugin_code(cls)
        (site / "rt24b_mylab-1.0.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: rt24b-mylab\nVersion: 2.0\n")
        assert plugin_code(cls) != first
    finally:
        for name in ("rt24b_mylab", "rt24b_fileplug"):
            sys.modules.pop(name, None)


# ---- R6/R7: reading a user object never raises out of the key, nor runs its __getattr__ -----------------

RAISING = {
    "nested tensor": "D = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])\n",
    "raising __getattr__": "class C:\n    def __getattr__(self, name):\n        raise RuntimeError('lazy load failed')\n"
                           "D = C()\n",
    "raising __len__ of a list subclass": "class L(list):\n    def __len__(self):\n        raise RuntimeError('no')\n"
                                          "D = L([1, 2])\n",
    "raising items of a dict subclass": "class M(dict):\n    def items(self):\n        raise RuntimeError('no')\n"
                                        "    def __iter__(self):\n        raise RuntimeError('no')\n"
                                        "    def __len__(self):\n        raise RuntimeError('no')\nD = M(a=1)\n",
    "raising __iter__ of a list subclass": "class L(list):\n    def __iter__(self):\n        raise RuntimeError('no')\n"
                                           "D = L([1, 2])\n",
    "raising __getattribute__": "class C:\n    def __getattribute__(self, name):\n        raise RuntimeError('no')\n"
                                "D = [C()]\n",
}


@pytest.mark.parametrize("kind", sorted(RAISING))
def test_a_global_that_raises_when_read_does_not_raise_out_of_the_key(kind):
    source = RAISING[kind] + _PLUGIN.format(reads="D")
    first = plugin_code(_cell(source))
    assert plugin_code(_cell(source)) == first


def test_sparse_nested_and_meta_tensors_are_keyed_without_raising():
    source = textwrap.dedent("""
        SPARSE = torch.tensor([[0.0, {v}], [0.0, 0.0]]).to_sparse()
        CSR = torch.tensor([[0.0, {v}], [0.0, 0.0]]).to_sparse_csr()
        NESTED = torch.nested.nested_tensor([torch.ones(2), torch.full((3,), {v}.0)])
        META = torch.empty(3, 4, device="meta")
    """) + _PLUGIN.format(reads="(SPARSE, CSR, NESTED, META)")
    first = plugin_code(_cell(source, 1))
    assert plugin_code(_cell(source, 1)) == first
    assert plugin_code(_cell(source, 2)) != first


def test_the_key_never_runs_a_user_objects_getattr():
    source = textwrap.dedent("""
        CALLS = []
        class Lazy:
            def __getattr__(self, name):
                CALLS.append(name)  # a lazy loader: reading it loads the data
                raise AttributeError(name)
        class Watched:
            def __getattribute__(self, name):
                CALLS.append(name)
                return object.__getattribute__(self, name)
        D = (Lazy(), Watched(), {'x': Lazy()}, frozenset([Watched()]))
    """) + _PLUGIN.format(reads="D")
    namespace = {"mk": mk, "torch": torch}
    exec(compile(source, "<cell>", "exec"), namespace)
    plugin_code(namespace["P"])
    assert namespace["CALLS"] == []


def test_a_tensor_past_the_byte_bound_is_told_apart_by_a_sample_and_the_walk_stays_bounded():
    source = textwrap.dedent("""
        BIG_DICT = {str(i): i for i in range(300_000)}
        BIG_SET = {str(i) for i in range(300_000)}
        FUNCTIONS = frozenset((lambda i=i: i) for i in range(500))
        TENSORS = {str(i): torch.zeros(1000, 1000) for i in range(100)}
        WEIGHTS = torch.full((20_000_000,), {v}.0)
    """) + _PLUGIN.format(reads="(BIG_DICT, BIG_SET, FUNCTIONS, TENSORS, WEIGHTS)")
    plugin = _cell(source, 1)
    started = time.monotonic()
    first = plugin_code(plugin)
    assert time.monotonic() - started < 30  # a million items and 480 MB of tensors: bounded work
    assert plugin_code(plugin) == first
    assert plugin_code(_cell(source, 2)) != first  # 80 MB of other weights, past the 64 MB bound
