"""Red-team pass 34 (a): what it found, fixed.

F1: a folder the user put where mechkit's file was inside a returned folder (``m/a.txt`` made a folder) was
deleted by a ``--force`` rerun, whether the new set wrote that name or not. F2: a plugin returning the run's own
``--model`` folder given as ``~/md`` had it moved into the report (the protected input was read as
``<cwd>/~/md``). F3: a user's file in a subfolder of a returned folder was refused only after the work. F4: the
public ``write_report`` on a full disk raised a raw OSError.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import put_files, returning_files


@pytest.mark.parametrize("second", [{"sub/x.txt": "2", "a.txt": "2"}, {"sub/x.txt": "2"}])
def test_a_users_folder_where_mechkits_file_was_is_refused_not_deleted(tmp_path, second):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/x.txt": "1", "a.txt": "1"})}, "rt34a"), out=out)
    os.remove(out / "m" / "a.txt")
    put_files(out / "m" / "a.txt", {"data.csv": "precious"})
    with pytest.raises(MechkitError, match="where it wrote another of the set"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", second)}, "rt34a"), out=out, force=True)
    assert (out / "m" / "a.txt" / "data.csv").read_text() == "precious"


def test_the_runs_model_folder_given_with_a_tilde_is_refused(tmp_path, monkeypatch):
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path / "home" / "md")
    byte_tokenizer().save_pretrained(tmp_path / "home" / "md")
    monkeypatch.chdir(tmp_path)

    class Returns(mk.Plugin):
        name, version, summary = "rt34a-model", "0.1", "x"

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files={"model": Path(ctx.model.source)})

    with pytest.raises(MechkitError, match="an input of the run"):
        mk.run(Returns, model="~/md", out=tmp_path / "out")
    assert (tmp_path / "home" / "md" / "config.json").is_file()


def test_a_users_file_in_a_returned_subfolder_is_refused_before_the_work(tmp_path):
    calls = []

    class Works(mk.Plugin):
        name, version, summary, needs_model = "rt34a-late", "0.1", "x", False

        def run(self, ctx):
            calls.append(1)
            return mk.Result(results={"a": 1}, files={"m": put_files(tmp_path / f"p{len(calls)}", {"sub/x.txt": "1"})})

    out = tmp_path / "out"
    mk.run(Works, out=out)
    (out / "m" / "sub" / "note.txt").write_text("mine")
    with pytest.raises(MechkitError, match="inside a subfolder of m"):
        mk.run(Works, out=out, force=True)
    assert calls == [1] and (out / "m" / "sub" / "note.txt").read_text() == "mine"


def test_write_report_on_a_full_disk_is_one_line_and_keeps_the_source(tmp_path, monkeypatch):
    import shutil

    from mechkit.report import build_report, write_report

    src = put_files(tmp_path / "src", {"sub/f.bin": "x" * 100})
    real = shutil.copy2

    def full(a, b, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(b))

    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    monkeypatch.setattr(shutil, "copy2", full)
    rep = build_report(plugin="p", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                       results={"s": 1}, artifacts=[], timings={})
    with pytest.raises(MechkitError, match="no space left"):
        write_report(tmp_path / "out", rep, files={"data": src})
    monkeypatch.setattr(shutil, "copy2", real)
    assert (src / "sub" / "f.bin").read_text() == "x" * 100 and not (tmp_path / "out").exists()


# --- pass 34 (b): the resume key's reading of builtins ------------------------------------------------------------

KEY_PLUGIN = """
{pre}
import mechkit as mk
HELPER = "h.txt"
LOG = "run.log"
class P(mk.Plugin):
    name, version, summary = "rt34b-key", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"v": ctx.step("a", lambda: {call})}}, finding="ok")
"""


def _key_of(tmp_path, monkeypatch, module, pre, call):
    import sys
    import textwrap

    from mechkit.plugin_key import plugin_code

    (tmp_path / f"{module}.py").write_text(textwrap.dedent(KEY_PLUGIN.format(pre=pre, call=call)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__(module).P
        return lambda: plugin_code(cls)
    finally:
        sys.modules.pop(module, None)


@pytest.mark.parametrize("method", ["eval", "exec"])
def test_a_method_named_like_the_builtin_does_not_hide_it(tmp_path, monkeypatch, method):
    (tmp_path / "h.txt").write_text("1")
    call = "eval(open(HELPER).read())" if method == "eval" else "(exec(open(HELPER).read()), 1)[1]"
    key = _key_of(tmp_path, monkeypatch, f"rt34b_m_{method}",
                  f"class Helper:\n    def {method}(self):\n        return 0", call)
    first = key()
    (tmp_path / "h.txt").write_text("2")
    assert key() != first


@pytest.mark.parametrize("pre", ["import re\ncompile = re.compile", "import re\nclass Q:\n    def load_source(self, p):\n        return p"])
def test_a_name_bound_otherwise_is_not_a_runner(tmp_path, monkeypatch, pre):
    (tmp_path / "run.log").write_text("one\n")
    tag = "assign" if "=" in pre.splitlines()[1] else "method"
    key = _key_of(tmp_path, monkeypatch, f"rt34b_b_{tag}", pre, "compile('[0-9]+') and 1" if tag == "assign"
                  else "(lambda self: self.load_source(LOG))(Q()) and 1")
    first = key()
    (tmp_path / "run.log").write_text("one\ntwo\n")
    assert key() == first
