"""Red-team pass 48, fixed.

F1 (silently wrong): loading ``OUT/model`` after a ``--force`` write of ``OUT`` was killed read the killed write's
uncommitted model: the roll-back before a read looked for a journal beside the folder read only, and ``OUT``'s
sits beside ``OUT``. The folders above are asked too. F3 (data loss): a file or link the user put, after the kill,
at a name the killed write had moved in was deleted by the roll-back; the journal now records each entry's inode,
and a roll-back refuses, touching nothing, where a name holds another entry. (b) F1 (over-refusal): a chat
template with CRLF line ends, which a save and a load give back with LF, gave a saved copy another identity. F2
(wrong fix): a scheduler refused on a pruned model sent the user to ``mechkit adapt``, which refuses that model.
F3 (silently wrong): a --sparsity rounding to no unit gave a row labelled with it and a "pruned" model equal to the
dense one; heads and channels were chosen inside layers removed whole, counted toward the fraction and removed
nothing.
"""

from __future__ import annotations

import io
import os
from types import SimpleNamespace

import pytest
from rich.console import Console

import mechkit as mk
import mechkit.adapt.scheduler as scheduler
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, recover
from mechkit.io.outlock import settle_interrupted
from mechkit.model.checks.identity import tokenizer_sha256
from mechkit.options.option import OptionError
from mechkit.pruning.select import removes_nothing
from tests.killed_write import killed_write


def test_reading_a_folder_inside_a_half_installed_set_rolls_the_set_back_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = killed_write(tmp_path, "after-model")
    assert (out / "model" / "config.json").read_text() == '{"new": 1}'  # the killed write's, uncommitted
    settle_interrupted(out / "model")  # what mk.load_model(OUT/model) does first
    assert (out / "model" / "config.json").read_text() == "{}" and (out / "a.txt").read_text() == "1"
    assert not journal_path(out).exists()


@pytest.mark.parametrize("put", ["file", "link", "folder"])
def test_an_entry_the_user_put_at_a_moved_in_name_is_never_rolled_back(tmp_path, put):
    out = killed_write(tmp_path, "after-model")
    target = tmp_path / "mine.png"
    target.write_text("my figure")
    (out / "a.txt").unlink()  # the killed write's a.txt, moved in: the user replaces it
    if put == "file":
        (out / "a.txt").write_text("my own")
    elif put == "link":
        (out / "a.txt").symlink_to(target)
    else:
        (out / "a.txt").mkdir()
    with pytest.raises(MechkitError, match="which that write did not put there"):
        recover(out)
    assert os.path.lexists(out / "a.txt") and target.read_text() == "my figure" and journal_path(out).exists()
    if put == "file":
        assert (out / "a.txt").read_text() == "my own"


def test_the_same_folder_renamed_away_and_back_still_rolls_back(tmp_path):
    out = killed_write(tmp_path, "after-model")
    os.rename(out / "model", tmp_path / "elsewhere")
    os.rename(tmp_path / "elsewhere", out / "model")  # the very entry the write moved in
    assert recover(out) and (out / "model" / "config.json").read_text() == "{}"


# --- pass 48 (b) -------------------------------------------------------------------------------------------------


def _prune(tmp_path, name, **options):
    return mk.run("prune", model="tiny:llama", guide="magnitude", tasks="capitalize", n=4, calib=2, repeats=1,
                  out=tmp_path / name, console=Console(file=io.StringIO()), **options)


def test_a_sparsity_that_removes_nothing_is_refused_before_the_work_and_its_fix_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OptionError, match="--sparsity layers=0.1 removes no layer of this 2-layer model") as err:
        _prune(tmp_path, "nothing", target="layers", sparsity="0.1", save_model=True)
    assert err.value.fix == "give it 0.5 or more (--sparsity layers=0.5)" and not (tmp_path / "nothing").exists()
    run = _prune(tmp_path, "fixed", target="layers", sparsity="layers=0.5")
    assert run.report["results"]["rows"][0]["plan"]["counts"]["layers"] == 1


def test_heads_and_channels_are_chosen_in_the_layers_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    plan = _prune(tmp_path, "all", target="neurons,heads,layers", sparsity="0.3").report["results"]["rows"][0]["plan"]
    removed = set(plan["layers"])
    assert removed and not removed & {int(k) for k in [*plan["heads"], *plan["mlp"]]}, plan
    assert plan["counts"]["heads"] > 0 and plan["counts"]["mlp_channels"] > 0


@pytest.mark.parametrize(("level", "allocation", "said"), [  # tiny:llama: 2 layers of 4 heads, 128 channels
    ({"layers": 0.1}, "global", "removes no layer of this 2-layer model"),
    ({"heads": 0.05}, "uniform", "removes no head of this model's layers"),  # 0.05 x 4 per layer
    ({"heads": 0.05}, "global", "removes no head of this model"),  # 0.05 x 8
    ({"neurons": 0.001}, "global", "removes no MLP channel of this model"),
])
def test_removes_nothing_names_the_smallest_fraction_that_removes_one(level, allocation, said):
    anatomy = mk.load_model("tiny:llama").anatomy
    found = removes_nothing(anatomy, level, allocation)
    assert found is not None and said in found[0], found
    target = next(iter(level))
    smallest = float(found[1].split()[2])  # "give it X or more (--sparsity ...)"
    assert removes_nothing(anatomy, {target: smallest}, allocation) is None  # the fix, as said, removes one


def test_a_scheduler_refused_on_a_pruned_model_never_sends_the_user_to_adapt_there(monkeypatch):
    structure = SimpleNamespace(mlp_keep=None, head_keep={0: [0, 3]})
    handle = SimpleNamespace(model=SimpleNamespace(_mechkit_structure=structure))
    monkeypatch.setattr(scheduler, "structure_identity", lambda h: {"head_counts": [2, 4]})
    sched = scheduler.Scheduler.__new__(scheduler.Scheduler)
    sched.model = {"architecture": "LlamaForCausalLM", "head_counts": [4, 4]}
    with pytest.raises(MechkitError, match="calibrated on another model") as err:
        sched.check_model(handle)
    assert "cannot calibrate one on a model with pruned neurons or heads" in err.value.fix


def test_a_chat_template_with_crlf_keeps_its_identity_through_a_save(tmp_path):
    m = mk.load_model("tiny:llama")
    m.tokenizer.chat_template = "{% for m in messages %}{{ m.content }}\r\n{% endfor %}"
    m.model.save_pretrained(tmp_path / "m")
    m.tokenizer.save_pretrained(tmp_path / "m")
    again = mk.load_model(str(tmp_path / "m"))
    assert "\r" not in again.tokenizer.chat_template  # transformers' own round trip
    assert tokenizer_sha256(again.tokenizer) == tokenizer_sha256(m.tokenizer)
