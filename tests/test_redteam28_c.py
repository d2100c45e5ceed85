"""Red-team pass 28 (c): the two minor items pass 27 left open, fixed.

M1: deleting a LongRoPE's cached long set (``long_inv_freq``, a plain attribute transformers recomputes from the
config when it is missing) was refused as a removed buffer. M2: ``rope_type`` set on a default RoPE was refused
naming ``max_seq_len_cached`` ("was deleted"), which the edit had only moved into what is compared apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import LONGROPE, edit_plugin, forwards, tiny_model_dir


def _run(edit, handle):
    return mk.run(edit_plugin(edit, "rt28c-edit"), model=handle, write=False)


def _refusal(edit, handle) -> str:
    with pytest.raises(MechkitError) as err:
        _run(edit, handle)
    return str(err.value)


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("long") / "m", "phi3", **LONGROPE)


def _rope(h):
    return h.model.model.rotary_emb


@pytest.mark.parametrize("before", [(), (40,), (8,)])
def test_a_longrope_long_set_dropped_passes_and_the_next_long_forward_computes_it_again(longrope_dir, before):
    h = mk.load_model(str(longrope_dir))
    forwards(40)(h)
    kept = _rope(h).long_inv_freq.clone()

    def drop(m):
        forwards(*before)(m)
        del _rope(m).long_inv_freq

    run = _run(drop, h)
    assert all(run.report["checks"].values())
    forwards(40)(h)  # transformers computes it afresh: the same values, so the model reads as before
    assert torch.equal(_rope(h).long_inv_freq, kept)


def test_a_longrope_long_set_replaced_after_a_drop_is_still_refused(longrope_dir):
    h = mk.load_model(str(longrope_dir))
    forwards(40)(h)

    def edit(m):
        del _rope(m).long_inv_freq
        _rope(m).long_inv_freq = torch.ones(8)

    assert "its buffer model.rotary_emb.long_inv_freq holds other values" in _refusal(edit, h)


def test_the_short_set_removed_is_still_refused(longrope_dir):
    h = mk.load_model(str(longrope_dir))
    said = _refusal(lambda m: delattr(_rope(m), "original_inv_freq"), h)
    assert "original_inv_freq was removed" in said


@pytest.mark.parametrize("kind", ["dynamic", "linear", "yarn"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rope_type_set_on_a_default_rope_is_named(family, kind):
    def edit(m):
        _rope(m).rope_type = kind

    said = _refusal(edit, mk.load_model(f"tiny:{family}"))
    assert f"model.rotary_emb.rope_type changed ('default' -> '{kind}')" in said
    assert "max_seq_len_cached" not in said


def test_an_attribute_set_or_deleted_alone_is_still_named():
    def add(m):
        _rope(m).extra_flag = True

    assert "model.rotary_emb.extra_flag was set and not put back" in _refusal(add, mk.load_model("tiny:llama"))


# --- M3 (pass 28 b): a value holding a newline split a refusal over two lines -------------------------------------


@pytest.mark.parametrize("plugin,options", [
    ("ablate", {"from_report": "3\n"}), ("attention", {"from_report": "a\nb"}), ("patch", {"task": "3\n"}),
    ("icl-vectors", {"load_vector": "x\ny"}), ("patch", {"task": "ioi\r\x1b[2J"}),
])
def test_a_refusal_quoting_a_value_with_control_characters_is_one_line(plugin, options):
    with pytest.raises(MechkitError) as err:
        mk.run(plugin, model="tiny:llama", write=False, **options)
    said = str(err.value)
    assert "\n" not in said and "\r" not in said and "\x1b" not in said
    assert "\\n" in said or "\\r" in said


def test_the_cli_prints_such_a_refusal_on_one_line(tmp_path):
    from tests.conftest import cli_in_process

    result = cli_in_process("ablate", "--model", "tiny:llama", "--from", "3\nx", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "3\\nx" in lines[0], result.stderr
    assert not (tmp_path / "o").exists()
