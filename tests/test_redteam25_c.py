"""Red-team pass 25 (c): what it found, fixed.

J1: on a dynamic RoPE trained for 16 positions, a plugin that only ran one 40-token forward was refused as
having left the model changed: the 16-token probe, no shorter than the trained length, kept the frequencies
that forward had grown. J2: ``rotary_emb.max_seq_len_cached = 10**6`` left behind passed (it was taken for
transformers' own bookkeeping), and every later long forward stopped growing its frequencies. Now a dynamic
RoPE's recorded length, frequencies and scaling are compared with what transformers' own update leaves, and
the probe runs every RoPE as loaded, putting back what it held.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import edit_plugin, forwards

FAMILIES = ("llama", "qwen2", "gemma2")


def _saved(path: Path, family: str, **overrides) -> str:
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model(family, **overrides)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    """``{(family, trained length): model folder}``: tiny models whose RoPE is dynamic past 8 or 16 positions,
    at or under the probe's 16 tokens (what the red team saved)."""
    root = tmp_path_factory.mktemp("dyn25")
    params = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    return {(f, n): _saved(root / f"{f}-{n}", f, max_position_embeddings=n, rope_parameters=params)
            for f in FAMILIES for n in (8, 16, 32)}


def _rope(h):
    return h.model.model.rotary_emb


def _run(edit, handle):
    return mk.run(edit_plugin(edit, "rt25c-edit"), model=handle, write=False)


def _refusal(edit, handle) -> str:
    with pytest.raises(MechkitError) as err:
        _run(edit, handle)
    return str(err.value)


# --- J1: a plugin's ordinary long forward on a model trained for no more than the probe's length ---------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("trained,lengths", [(16, (40,)), (16, (17,)), (8, (40,)), (8, (100, 20)), (16, (8, 40))])
def test_a_long_forward_on_a_dynamic_rope_trained_for_the_probe_length_passes(dynamic, family, trained, lengths):
    h = mk.load_model(dynamic[(family, trained)])
    run = _run(forwards(*lengths), h)
    assert all(run.report["checks"].values())
    assert int(_rope(h).max_seq_len_cached) == max(lengths)  # left as transformers left it: the probe put it back


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("length", [40, 60])
def test_the_probe_leaves_a_grown_rope_as_it_found_it(dynamic, family, length):
    h = mk.load_model(dynamic[(family, 32)])  # the probe's 16 tokens reset a RoPE trained for 32
    forwards(length)(h)
    grown = _rope(h).inv_freq.clone()
    _run(lambda m: None, h)
    assert int(_rope(h).max_seq_len_cached) == length
    assert torch.equal(_rope(h).inv_freq, grown) and not torch.equal(grown, _rope(h).original_inv_freq)


# --- J2: a dynamic RoPE's recorded length (or scaling) left as no forward leaves it ----------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("value", [10**6, 100, torch.tensor(10**6), 5])
def test_a_recorded_length_left_changed_is_refused_naming_it(dynamic, family, value):
    def edit(h):
        _rope(h).max_seq_len_cached = value

    said = _refusal(edit, mk.load_model(dynamic[(family, 16)]))
    assert "its rotary embedding model.rotary_emb: max_seq_len_cached was set to" in said, said
    assert "a state no forward of transformers leaves" in said and "reload the model" in said


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("trained", [16, 32])
def test_grown_frequencies_reset_by_hand_while_the_length_stays_are_refused(dynamic, family, trained):
    h = mk.load_model(dynamic[(family, trained)])
    forwards(40)(h)  # the caller's own long input, before the run

    def edit(m):
        _rope(m).register_buffer("inv_freq", _rope(m).original_inv_freq, persistent=False)

    said = _refusal(edit, h)
    assert "model.rotary_emb: inv_freq was changed while max_seq_len_cached stayed 40" in said, said


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [(40,), (40, 8), (8, 60)])
def test_what_a_forward_leaves_passes_where_the_same_state_set_by_hand_with_another_length_does_not(
        dynamic, family, lengths):
    h = mk.load_model(dynamic[(family, 32)])
    _run(forwards(*lengths), h)  # grown, or reset by the short one: transformers' own states pass

    def edit(m):
        forwards(*lengths)(m)
        _rope(m).max_seq_len_cached = int(_rope(m).max_seq_len_cached) + 7

    assert "max_seq_len_cached was set to" in _refusal(edit, h)


# --- J3: a number given for a text option is refused, not run as its digits ----------------------------------------


@pytest.mark.parametrize("plugin,option", [("attention", "prompt"), ("patch", "clean"), ("patch", "corrupted")])
@pytest.mark.parametrize("value", [float("nan"), 1.5, 7, ["a", "b"]])
def test_a_number_or_list_for_a_text_option_is_refused_in_one_line(plugin, option, value):
    with pytest.raises(MechkitError, match="is not text") as err:
        mk.run(plugin, model="tiny:llama", write=False, **{option: value})
    assert "\n" not in str(err.value) and f"--{option}" in str(err.value)
