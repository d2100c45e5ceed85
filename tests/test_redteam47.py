"""Red-team pass 47, fixed.

F1 (data loss): a ``--force`` write killed after it set the old set aside and before it moved anything in left the
names free; a file the user then made at one was replaced by the old one, a folder made the roll-back fail half-way
on a raw OSError, which the leftover cleaning swallowed before deleting the temporary folder holding the old set.
The roll-back now refuses, touching nothing, where a name it puts back is taken, and a temporary folder whose
journal is still there is never a leftover of its own. F2 (weights changed for good): an ``edit_weights`` object
still handed out weights after its context closed. F3: a parameter replaced inside ``edit_weights`` stayed
replaced. F4 (data loss): a user's small file named like a lock file was removed as a dead lock. F5
(over-refusal): a dict holding only the ``default`` chat template, which transformers saves and reloads as one
string, gave the tokenizer another identity after a save.
"""

from __future__ import annotations

import io
import os

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, recover
from mechkit.io.leftovers import clean_leftovers, stale_leftovers
from mechkit.model.checks.identity import tokenizer_sha256
from mechkit.model.headspec import Head
from tests.killed_write import killed_write


@pytest.fixture
def killed(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = killed_write(tmp_path, "first-move-in")
    assert not (out / "a.txt").exists() and not (out / "model").exists()  # all aside, nothing moved in
    return out


def test_a_users_file_where_the_old_set_goes_back_stops_the_roll_back_touching_nothing(killed):
    (killed / "model").mkdir()
    (killed / "model" / "NOTES.md").write_text("mine")
    (killed / "a.txt").write_text("mine")
    with pytest.raises(MechkitError, match="which that write did not put there, stands where its old files go back"):
        mk.run("inspect", model="tiny:llama", out=killed, force=True, console=Console(file=io.StringIO()))
    assert (killed / "a.txt").read_text() == "mine" and (killed / "model" / "NOTES.md").read_text() == "mine"
    (tmp,) = [p for p in killed.parent.iterdir() if ".tmp-" in p.name]
    assert (tmp / ".previous" / "model" / "config.json").read_text() == "{}"  # the old set still waits
    for name in ("a.txt", "model"):  # the fix, as said
        os.rename(killed / name, killed.parent / f"mine-{name}")
    assert recover(killed) and (killed / "a.txt").read_text() == "1"
    assert (killed / "model" / "config.json").read_text() == "{}" and not tmp.exists()


def test_a_sweep_never_deletes_the_old_set_of_a_journal_it_could_not_roll_back(killed, capsys):
    (killed / "a.txt").write_text("mine")
    (tmp,) = [p for p in killed.parent.iterdir() if ".tmp-" in p.name]
    assert tmp not in stale_leftovers(killed.parent)  # it goes with its journal, never on its own
    clean_leftovers(killed.parent)  # a sweep, as `cache clear leftovers` makes in the cache
    assert "stands where its old files go back" in capsys.readouterr().err
    assert (tmp / ".previous" / "a.txt").read_text() == "1" and (killed / "a.txt").read_text() == "mine"
    assert journal_path(killed).exists()


def test_an_edit_through_a_closed_edit_weights_is_refused():
    m = mk.load_model("tiny:gpt2")
    name = "transformer.h.0.mlp.c_fc.weight"
    before = m.model.get_parameter(name).detach().clone()
    with mk.edit_weights(m) as w:
        w.named(name).add_(1)
    for late in (lambda: w.named(name), lambda: w.zero_head_output(Head(0, 1)),
                 lambda: w.param(m.model.transformer.h[0].mlp.c_fc)):
        with pytest.raises(MechkitError, match="this edit_weights context has closed"):
            late()
    assert torch.equal(before, m.model.get_parameter(name))


def test_a_parameter_replaced_inside_edit_weights_is_put_back():
    m = mk.load_model("tiny:gpt2")
    embed = m.model.get_input_embeddings()
    param, values = embed.weight, embed.weight.detach().clone()
    logits = m(torch.tensor([[1, 2, 3]]))
    with mk.edit_weights(m) as w:
        w.param(embed).add_(1)
        embed.weight = torch.nn.Parameter(embed.weight.detach() * 7)
    assert embed.weight is param and torch.equal(embed.weight, values)
    assert torch.equal(m(torch.tensor([[1, 2, 3]])), logits)


def test_a_users_file_named_like_a_lock_is_never_removed_as_a_dead_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".notes.mechkit-lock").write_text("my notes")
    (out / ".model.mechkit-lock").write_text("999999\n")  # a killed run's: its pid, nobody holds it
    mk.run("inspect", model="tiny:llama", out=out, force=True, console=Console(file=io.StringIO()))
    assert (out / ".notes.mechkit-lock").read_text() == "my notes"
    assert not (out / ".model.mechkit-lock").exists()


def test_a_default_only_dict_template_has_the_identity_it_has_after_a_save(tmp_path):
    m = mk.load_model("tiny:llama")
    m.tokenizer.chat_template = {"default": "{{ 'D' }}"}
    m.model.save_pretrained(tmp_path / "m")
    m.tokenizer.save_pretrained(tmp_path / "m")
    again = mk.load_model(str(tmp_path / "m"))
    assert again.tokenizer.chat_template == "{{ 'D' }}"  # transformers' own round trip
    assert tokenizer_sha256(again.tokenizer) == tokenizer_sha256(m.tokenizer)
    m.tokenizer.chat_template = {"default": "{{ 'D' }}", "tool_use": "{{ 'T' }}"}
    assert tokenizer_sha256(m.tokenizer) != tokenizer_sha256(again.tokenizer)
