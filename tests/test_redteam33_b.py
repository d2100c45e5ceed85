"""Red-team pass 33 (b): what it found, fixed.

F1: a model with fewer than 16 learned positions could run no plugin (the unchanged check's probe was 16
tokens). F2: adapt on a 40-position model was a raw IndexError (its timed forward skipped the handle's checks).
F3–F7 (the resume key): ``exec`` reached through an alias of ``builtins`` or an aliased import, a loader under
another name or given a constant, and ``from re import compile`` taken for the builtin; a file past the key's
bound ended the reading of every later one. F8: finetune at ``--shots 0`` was told to use fewer shots. F10:
``repeated_random_tokens`` took any ``n_positions``.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from mechkit.plugin_key import plugin_code
from tests.conftest import cli_in_process, tiny_model_dir


def _short(tmp_path_factory, n):
    return tiny_model_dir(tmp_path_factory.mktemp(f"g{n}") / "m", "gpt2", n_positions=n)


@pytest.fixture(scope="module")
def g12(tmp_path_factory):
    return _short(tmp_path_factory, 12)


@pytest.fixture(scope="module")
def g40(tmp_path_factory):
    return _short(tmp_path_factory, 40)


def test_a_model_of_twelve_positions_runs_a_plugin(g12, tmp_path):
    done = cli_in_process("inspect", "--model", str(g12), "--seq-len", "8", "--repeats", "1", "--out", str(tmp_path / "i"))
    assert done.returncode == 0, done.stderr


def test_adapt_on_a_short_table_is_one_line(g40, tmp_path):
    done = cli_in_process("adapt", "--model", str(g40), "--out", str(tmp_path / "a"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "IndexError" not in done.stderr


def test_finetune_at_no_shots_is_not_told_fewer_shots(g40, tmp_path):
    done = cli_in_process("finetune", "--model", str(g40), "--steps", "1", "--shots", "0", "--out", str(tmp_path / "f"))
    assert done.returncode == 2 and "fewer --shots" not in done.stderr and "longer context" in done.stderr


@pytest.mark.parametrize("bad", ["40", True, -5, 40.5])
def test_repeated_tokens_refuse_a_bad_position_count(bad):
    from mechkit.tasks import repeated_random_tokens
    from mechkit.tasks.prompt import TaskOptionError

    with pytest.raises(TaskOptionError, match="n_positions must be a whole number"):
        repeated_random_tokens(259, n_seqs=1, seg_len=2, n_positions=bad)


RUNS = {
    "builtins alias": ("import builtins as b", "b.exec(open('h.txt').read(), g)"),
    "exec imported under a name": ("from builtins import exec as run", "run(open('h.txt').read(), g)"),
    "__builtins__ attribute": ("import builtins\n__builtins__ = builtins", "__builtins__.exec(open(HELPER).read(), g)"),
    "loader under a name": ("from importlib.machinery import SourceFileLoader as L",
                            "g.update(vars(L('h', 'h.txt').load_module()))"),
    "loader given a constant": ("import importlib.machinery as m",
                                "g.update(vars(m.SourceFileLoader('h', HELPER).load_module()))"),
    "run_path given a constant": ("import runpy", "g.update(runpy.run_path(HELPER))"),
}

PLUGIN = """
import mechkit as mk
{pre}
HELPER = "h.txt"
class P(mk.Plugin):
    name, version, summary = "rt33b-key", "0.1", "t"
    def run(self, ctx):
        def a():
            g = {{}}
            {call}
            return g["VALUE"]
        return mk.Result(results={{"v": ctx.step("a", a)}}, finding="ok")
"""


@pytest.mark.parametrize("case", sorted(RUNS))
def test_a_helper_run_by_any_name_is_in_the_key(tmp_path, monkeypatch, case):
    tag = sorted(RUNS).index(case)
    pre, call = RUNS[case]
    (tmp_path / f"rt33b_k{tag}.py").write_text(textwrap.dedent(PLUGIN.format(pre=pre, call=call)))
    (tmp_path / "h.txt").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__(f"rt33b_k{tag}").P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        (tmp_path / "h.txt").write_text("VALUE = 2\n")
        assert plugin_code(cls) != first
    finally:
        sys.modules.pop(f"rt33b_k{tag}", None)


def test_compile_imported_from_re_is_not_the_builtin(tmp_path, monkeypatch):
    (tmp_path / "rt33b_re.py").write_text(textwrap.dedent("""
        from re import compile
        import mechkit as mk
        NUM = compile(r"[0-9]+")
        LOG = "run.log"
        class P(mk.Plugin):
            name, version, summary = "rt33b-re", "0.1", "t"
            def run(self, ctx):
                return mk.Result(results={"v": ctx.step("a", lambda: 1)}, finding="ok")
    """))
    (tmp_path / "run.log").write_text("one\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__("rt33b_re").P
        first = plugin_code(cls)
        (tmp_path / "run.log").write_text("one\ntwo\n")
        assert plugin_code(cls) == first
    finally:
        sys.modules.pop("rt33b_re", None)


def test_a_file_past_the_bound_leaves_later_files_keyed_by_their_bytes(tmp_path, monkeypatch):
    import mechkit.plugin_key as pk

    (tmp_path / "rt33b_big.py").write_text(textwrap.dedent("""
        import importlib
        import mechkit as mk
        BIG = "big.bin"
        HELPER = "h.txt"
        class P(mk.Plugin):
            name, version, summary = "rt33b-big", "0.1", "t"
            def run(self, ctx):
                g = {}
                exec(open(HELPER).read(), g)
                return mk.Result(results={"v": importlib.import_module("rt33b_hm").X + g["VALUE"]}, finding="ok")
    """))
    (tmp_path / "big.bin").write_bytes(b"\\0" * 4096)
    (tmp_path / "h.txt").write_text("VALUE = 1\n")
    (tmp_path / "rt33b_hm.py").write_text("X = 1\n")
    monkeypatch.setattr(pk.reach.Reach, "BYTES", 1024)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__("rt33b_big").P
        first = plugin_code(cls)
        (tmp_path / "h.txt").write_text("VALUE = 2\n")
        second = plugin_code(cls)
        (tmp_path / "rt33b_hm.py").write_text("X = 2\n")
        assert first != second != plugin_code(cls)
    finally:
        sys.modules.pop("rt33b_big", None)
