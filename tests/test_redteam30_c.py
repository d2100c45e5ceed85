"""Red-team pass 30 (c): what it found in the resume key, the unchanged check and one-line messages, fixed.

K1: a helper ``runpy.run_path("helper.py")`` runs from the working directory was keyed by the file beside the
plugin, so an edit of the one that ran mixed two versions' steps. K2: code ``exec`` reads from a literal file
not named ``.py`` (``exec(open("helpers.txt").read())``) was not in the key. R1: a LongRoPE model loaded in
bfloat16 was refused after a plain long forward (its float32 long set copied into a bfloat16 buffer matched no
value the check computed). R2: a property on the rotary class supplying the long set passed. M1: ``one_line``
escaped every non-printable character, so a path with a no-break space in a fix could not be used as shown.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, one_line
from mechkit.plugin_key import plugin_code
from tests.conftest import LONGROPE, edit_plugin, forwards, tiny_model_dir

# --- K1 / K2: files a plugin runs by name -----------------------------------------------------------------------------

PLUGIN = """
import mechkit as mk
{pre}
class P(mk.Plugin):
    name, version, summary = "rt30c-runs", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"v": ctx.step("a", lambda: {call})}}, finding="ok")
"""

CASES = {
    "run_path from the working directory": ("import runpy", "runpy.run_path('{h}.py')['VALUE']", ".py", "cwd"),
    "exec of a .txt file": ("", "(lambda g: (exec(open('{h}.txt').read(), g), g['VALUE'])[1])({{}})", ".txt", "cwd"),
    "exec of a .txt file beside the plugin": (
        "import os\nHERE = os.path.dirname(os.path.abspath(__file__))",
        "(lambda g: (exec(open(os.path.join(HERE, '{h}.txt')).read(), g), g['VALUE'])[1])({{}})", ".txt", "plugin"),
    "compile of a .cfg file": ("", "eval(compile(open('{h}.cfg').read(), 'h', 'eval'))", ".cfg", "cwd"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_file_the_plugin_runs_by_its_name_is_in_the_key(tmp_path, monkeypatch, case):
    pre, call, suffix, where = CASES[case]
    tag = sorted(CASES).index(case)
    module, helper = f"rt30c_plug_{tag}", f"rt30c_help_{tag}"
    (tmp_path / "plug").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "plug" / f"{module}.py").write_text(textwrap.dedent(PLUGIN.format(pre=pre, call=call.format(h=helper))))
    folder = tmp_path / ("work" if where == "cwd" else "plug")
    text = "1" if suffix == ".cfg" else "VALUE = 1\n"
    (folder / f"{helper}{suffix}").write_text(text)
    if where == "cwd":
        (tmp_path / "plug" / f"{helper}{suffix}").write_text(text)  # a same-named file beside the plugin: not the one run
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    monkeypatch.chdir(tmp_path / "work")
    try:
        cls = __import__(module).P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        (folder / f"{helper}{suffix}").write_text(text.replace("1", "2"))
        assert plugin_code(cls) != first
    finally:
        sys.modules.pop(module, None)


def test_a_data_file_named_outside_exec_leaves_the_key_alone(tmp_path, monkeypatch):
    """A file the plugin reads as data (not code) is an input the key does not cover (stated in safety.md)."""
    (tmp_path / "rt30c_data.py").write_text(textwrap.dedent(PLUGIN.format(
        pre="", call="open('notes.txt').read()")))
    (tmp_path / "notes.txt").write_text("one")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__("rt30c_data").P
        first = plugin_code(cls)
        (tmp_path / "notes.txt").write_text("two")
        assert plugin_code(cls) == first
    finally:
        sys.modules.pop("rt30c_data", None)


# --- R1 / R2: a LongRoPE's long set -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("long") / "m", "phi3", **LONGROPE)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("lengths", [(40,), (40, 8), (8, 40)])
def test_a_half_precision_longrope_passes_a_plain_long_forward(longrope_dir, dtype, lengths):
    h = mk.load_model(str(longrope_dir), dtype=dtype)
    run = mk.run(edit_plugin(forwards(*lengths), "rt30c-fw"), model=h, write=False)
    assert all(run.report["checks"].values())


def test_a_half_precision_longrope_edit_is_still_refused(longrope_dir):
    h = mk.load_model(str(longrope_dir), dtype="bfloat16")

    def edit(m):
        forwards(40)(m)
        m.model.model.rotary_emb.inv_freq.mul_(1.5)

    with pytest.raises(MechkitError, match="rotary_emb.inv_freq holds other values"):
        mk.run(edit_plugin(edit, "rt30c-edit"), model=h, write=False)


@pytest.mark.parametrize("supplied", ["property", "tensor", "None"])
def test_anything_on_the_rotary_class_under_the_long_sets_name_is_refused(longrope_dir, supplied):
    h = mk.load_model(str(longrope_dir))
    forwards(40)(h)
    rope_class = type(h.model.model.rotary_emb)
    value = {"property": property(lambda s: torch.full((8,), 0.5), lambda s, v: None),
             "tensor": torch.ones(8), "None": None}[supplied]

    def edit(m):
        rope_class.long_inv_freq = value

    try:
        with pytest.raises(MechkitError, match="long_inv_freq was set on the class Phi3RotaryEmbedding"):
            mk.run(edit_plugin(edit, "rt30c-class"), model=h, write=False)
    finally:
        del rope_class.long_inv_freq


# --- M1: one line, and a path shown as it is ------------------------------------------------------------------------


@pytest.mark.parametrize("text,shown", [
    ("/tmp/a\u00a0dir", "/tmp/a\u00a0dir"), ("/tmp/caf\u00e9", "/tmp/caf\u00e9"), ("/tmp/x\u200dy", "/tmp/x\u200dy"),
    ("a\nb", "a\\nb"), ("a\rb", "a\\rb"), ("a\x1b[2Jb", "a\\x1b[2Jb"), ("a\u2028b", "a\\u2028b"), ("a\x85b", "a\\x85b"),
])
def test_one_line_escapes_only_what_breaks_the_line(text, shown):
    assert one_line(text) == shown
    assert str(MechkitError(f"cannot write {text}", "fix")) == f"cannot write {shown} — fix"


def test_a_fix_naming_a_path_with_a_no_break_space_can_be_used_as_shown(tmp_path):
    from tests.conftest import cli_in_process

    out = tmp_path / "lk\u00a0dir"
    os.symlink(tmp_path / "nowhere", tmp_path / ".lk\u00a0dir.mechkit-lock")
    result = cli_in_process("detect", "--model", "tiny:llama", "--out", str(out), "--force")
    assert result.returncode == 2
    assert str(tmp_path / ".lk\u00a0dir.mechkit-lock") in result.stderr


# --- W1: a user's returned path is linked, never moved, until the report is in place ------------------------------

KILLED = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import mechkit as mk
    import mechkit.io.atomic as atomic
    from tests.conftest import returning_files
    real = atomic.umask_modes
    def die(folder, fsync=False):  # the commit's last step before the rename: kill -9 here
        os.kill(os.getpid(), 9)
    atomic.umask_modes = die
    mk.run(returning_files({"m": Path(sys.argv[1])}, "rt30c-kill"), out=Path(sys.argv[2]))
""")


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_users_path_survives_a_kill_during_the_write_and_the_next_clean_up(tmp_path, kind):
    import subprocess

    src = tmp_path / "mine"
    if kind == "folder":
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "thesis.txt").write_text("precious")
    else:
        src.write_text("precious")
    os.chmod(src / "sub" / "thesis.txt" if kind == "folder" else src, 0o600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", KILLED, str(src), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, cwd=str(Path(__file__).parent.parent), timeout=300)
    assert done.returncode == -9, done.stderr
    held = src / "sub" / "thesis.txt" if kind == "folder" else src
    assert held.read_text() == "precious" and (held.stat().st_mode & 0o777) == 0o600
    from mechkit.io.leftovers import clean_leftovers

    clean_leftovers(tmp_path)  # the killed writer's temporary folder beside --out goes; the user's path stays
    assert held.read_text() == "precious"
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_after_the_commit_the_source_is_gone_and_the_reports_copy_has_the_umasks_mode(tmp_path):
    from mechkit.io.atomic import file_mode

    src = tmp_path / "mine"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"w")
    os.chmod(src / "sub" / "w.bin", 0o600)
    from tests.conftest import returning_files

    out = mk.run(returning_files({"m": src}, "rt30c-commit"), out=tmp_path / "out").out_dir
    assert not src.exists()
    copied = out / "m" / "sub" / "w.bin"
    assert copied.read_bytes() == b"w" and (copied.stat().st_mode & 0o777) == file_mode()
    assert copied.stat().st_nlink == 1
