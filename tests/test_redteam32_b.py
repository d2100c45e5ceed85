"""Red-team pass 32 (b): what it found, fixed.

A model with a short learned position table (GPT-2 built with ``n_positions=40``): finetune's rows past it were a
raw IndexError; prune's fixed 256-token perplexity window made it unprunable; ``mk.show_attention`` ranked heads
on 25-token segments and told the caller to lower a ``seg_len`` it does not take; the generic refusal of a long
forward said "truncate or split the text" where no text was given; a bound below the least segment suggested
``--seg-len 1``. The resume key: ``re.compile``/``model.eval()`` counted as running code, so every constant naming
a file of the user's (a log it writes, a data file of gigabytes) was read into the key; a helper loaded by
``SourceFileLoader`` was missed. ``--tasks repeat-tokens`` from the CLI was told to call a Python function.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.plugin_key import plugin_code
from tests.conftest import cli_in_process, tiny_model_dir


@pytest.fixture(scope="module")
def gpt2_40(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("g40") / "m", "gpt2", n_positions=40)


def test_finetune_rows_past_the_position_table_are_one_line(tmp_path):
    done = cli_in_process("finetune", "--model", "tiny:gpt2", "--task", "capitalize", "--steps", "1", "--shots", "40",
                          "--batch-size", "2", "--out", str(tmp_path / "ft"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "longer than the model's context" in done.stderr


def test_perplexity_windows_fit_a_short_position_table(gpt2_40):
    from mechkit.pruning.cost import perplexity

    handle = mk.load_model(str(gpt2_40))
    assert perplexity(handle, "The cat sat on the mat. " * 20) is not None


def test_show_attention_ranks_heads_on_segments_that_fit(gpt2_40):
    view = mk.show_attention(str(gpt2_40), "hello there", heads="induction", top_k=2)
    assert len(view.patterns.heads) == 2


def test_a_forward_past_the_table_names_what_a_user_can_change(gpt2_40):
    import torch

    handle = mk.load_model(str(gpt2_40))
    with pytest.raises(MechkitError) as err:
        handle(torch.ones((1, 41), dtype=torch.long))
    assert "truncate or split" not in str(err.value) and "a model with a longer context" in str(err.value)


def test_a_table_too_short_for_any_segment_says_so():
    from mechkit.tasks import repeated_random_tokens
    from mechkit.tasks.prompt import TaskOptionError

    with pytest.raises(TaskOptionError) as err:
        repeated_random_tokens(259, n_seqs=1, seg_len=2, n_positions=3)
    assert "--seg-len (seg_len=) to 1" not in str(err.value) and "more positions" in str(err.value)


PLUGIN = """
import re
import mechkit as mk
LOG = "{log}"
NUM = re.compile(r"\\\\d+")
class P(mk.Plugin):
    name, version, summary = "rt32b-log", "0.1", "t"
    def run(self, ctx):
        ctx.model.model.eval()
        return mk.Result(results={{"v": ctx.step("a", lambda: 1)}}, finding="ok")
"""


def test_a_file_the_plugin_writes_leaves_its_key_alone_beside_re_compile_and_eval(tmp_path, monkeypatch):
    (tmp_path / "rt32b_logplug.py").write_text(textwrap.dedent(PLUGIN.format(log="progress.log")))
    (tmp_path / "progress.log").write_text("one\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__("rt32b_logplug").P
        first = plugin_code(cls)
        (tmp_path / "progress.log").write_text("one\ntwo\n")
        assert plugin_code(cls) == first
    finally:
        sys.modules.pop("rt32b_logplug", None)


def test_a_helper_loaded_by_source_file_loader_is_in_the_key(tmp_path, monkeypatch):
    (tmp_path / "rt32b_sfl.py").write_text(textwrap.dedent("""
        import importlib.machinery
        import mechkit as mk
        class P(mk.Plugin):
            name, version, summary = "rt32b-sfl", "0.1", "t"
            def run(self, ctx):
                mod = importlib.machinery.SourceFileLoader("helpers_a2", "helpers_a2.txt").load_module()
                return mk.Result(results={"v": ctx.step("a", lambda: mod.VALUE)}, finding="ok")
    """))
    (tmp_path / "helpers_a2.txt").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        cls = __import__("rt32b_sfl").P
        first = plugin_code(cls)
        (tmp_path / "helpers_a2.txt").write_text("VALUE = 2\n")
        assert plugin_code(cls) != first
    finally:
        sys.modules.pop("rt32b_sfl", None)


def test_a_huge_file_a_constant_names_is_keyed_by_size_not_read(tmp_path, monkeypatch):
    import mechkit.plugin_key as pk

    (tmp_path / "rt32b_big.py").write_text(textwrap.dedent("""
        import mechkit as mk
        DATA = "big.bin"
        class P(mk.Plugin):
            name, version, summary = "rt32b-big", "0.1", "t"
            def run(self, ctx):
                exec("x = 1")
                return mk.Result(results={"v": 1}, finding="ok")
    """))
    (tmp_path / "big.bin").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(pk.reach.Reach, "BYTES", 1024)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    read = []
    real = pk.Path.read_bytes
    monkeypatch.setattr(pk.Path, "read_bytes", lambda self: (read.append(self.name), real(self))[1])
    try:
        plugin_code(__import__("rt32b_big").P)
    finally:
        sys.modules.pop("rt32b_big", None)
    assert "big.bin" not in read


def test_repeat_tokens_from_the_cli_is_told_a_cli_fix(tmp_path):
    done = cli_in_process("ablate", "--model", "tiny:gpt2", "--tasks", "repeat-tokens", "--n", "1",
                          "--out", str(tmp_path / "a"))
    assert done.returncode == 2 and "pick a text task for --tasks" in done.stderr
