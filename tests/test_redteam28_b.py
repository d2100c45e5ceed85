"""Red-team pass 28 (b): a plugin's helper imported by name was not in its resume key, fixed.

F1: a plugin (in a file, or a notebook cell) that loads its helper with ``importlib.import_module("h")`` or
``__import__("h")`` kept one key when ``h.py`` was edited, so a kill, an edit and a rerun mixed the two
versions' steps (``{'v': [1, 2]}``). The string literal names a module as an ``import`` does, and is followed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import mechkit as mk
from mechkit.plugin_key import plugin_code

LOADS = {
    "importlib.import_module": "import importlib\n", "__import__": "",
    "from importlib import import_module": "from importlib import import_module\n",
}
CALL = {"importlib.import_module": "importlib.import_module('{m}')", "__import__": "__import__('{m}')",
        "from importlib import import_module": "import_module('{m}')"}

PLUGIN = """
class P(mk.Plugin):
    name, version, summary = "rt28b-byname", "0.1", "t"
    def run(self, ctx):
        def comp():
            return {call}.VALUE
        return mk.Result(results={{"v": ctx.step("a", comp)}}, finding="ok")
"""


def _helper(folder, name: str, value: int) -> None:
    (folder / f"{name}.py").write_text(f"VALUE = {value}\n")


@pytest.mark.parametrize("how", sorted(LOADS))
def test_a_file_plugins_helper_imported_by_name_edited_gets_another_key(tmp_path, monkeypatch, how):
    module, helper = f"rt28b_plug_{abs(hash(how)) % 10**6}", f"rt28b_help_{abs(hash(how)) % 10**6}"
    (tmp_path / f"{module}.py").write_text("import mechkit as mk\n" + LOADS[how] + textwrap.dedent(
        PLUGIN.format(call=CALL[how].format(m=helper))))
    _helper(tmp_path, helper, 1)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = __import__(module).P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        _helper(tmp_path, helper, 2)
        assert plugin_code(cls) != first
    finally:
        for name in (module, helper):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("how", sorted(LOADS))
def test_a_cells_helper_imported_by_name_edited_gets_another_key(tmp_path, monkeypatch, how):
    helper = f"rt28b_cellhelp_{abs(hash(how)) % 10**6}"
    _helper(tmp_path, helper, 1)
    monkeypatch.syspath_prepend(str(tmp_path))

    def cell():
        namespace = {"mk": mk}
        exec(compile(LOADS[how] + PLUGIN.format(call=CALL[how].format(m=helper)), "<cell>", "exec"), namespace)
        return namespace["P"]

    first = plugin_code(cell())
    assert plugin_code(cell()) == first
    _helper(tmp_path, helper, 2)
    assert plugin_code(cell()) != first
    sys.modules.pop(helper, None)


def test_a_relative_name_is_resolved_against_its_package(tmp_path, monkeypatch):
    pkg = tmp_path / "rt28b_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plug.py").write_text("import importlib\nimport mechkit as mk\n" + textwrap.dedent(
        PLUGIN.format(call="importlib.import_module('.helper', 'rt28b_pkg')")))
    _helper(pkg, "helper", 1)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = __import__("rt28b_pkg.plug").plug.P
        first = plugin_code(cls)
        _helper(pkg, "helper", 2)  # the package's files are read once per process: the import by name is followed
        assert plugin_code(cls) != first
    finally:
        for name in ("rt28b_pkg", "rt28b_pkg.plug", "rt28b_pkg.helper"):
            sys.modules.pop(name, None)


def test_a_killed_run_of_a_plugin_importing_its_helper_by_name_starts_fresh_after_an_edit(tmp_path):
    """The red team's case end to end: kill -9 after step s0, edit the helper, rerun: no mixed steps."""
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent("""
        import importlib, os, mechkit as mk
        class P(mk.Plugin):
            name, version, summary, options = "rt28b-dynkill", "0.0.1", "c", ()
            needs_model = False
            def run(self, ctx):
                out = []
                for i in range(2):
                    def comp(i=i):
                        if i == 1 and os.environ.get("RT28KILL"):
                            os.kill(os.getpid(), 9)
                        return importlib.import_module("rt28helper").VALUE
                    out.append(ctx.step(f"s{i}", comp))
                return mk.Result(results={"v": out}, finding="ok")
        print(mk.run(P, write=False).results["v"])
    """))
    _helper(tmp_path, "rt28helper", 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
           "MECHKIT_CACHE": str(tmp_path / "cache")}
    killed = subprocess.run([sys.executable, str(script)], env={**env, "RT28KILL": "1"}, capture_output=True,
                            text=True, cwd=tmp_path)
    assert killed.returncode == -9
    _helper(tmp_path, "rt28helper", 2)
    rerun = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip().splitlines()[-1] == "[2, 2]"
