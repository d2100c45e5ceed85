"""Red-team pass 49 (a), fixed.

F1 (silently wrong): ``Scheduler.load``, ``TaskVector.load`` and ``ActivationVector.load`` read a killed
``--force`` write's uncommitted file; each now rolls its run's half set back first, as a model load and
``report show`` do. F2/F3 (over-refusal): the roll-back took an entry the write moved in by its inode (and a
file's time), so a ``cp -a`` copy of the folder, or a ``touch``, made it refuse, one entry per rerun; entries are
now known by what they hold (a small file by its content, a large one by its size and time, a link by its
target), and a refusal names them all at once. F4 (silently wrong): ``cache list`` counted a journal that
``cache clear`` could not roll back. F5 (data loss): a user's note under a lock's name was truncated and deleted
by a run. F6 (wrong fix): ``edit_weights`` suggested a llama weight's name on every model.
"""

from __future__ import annotations

import io
import os
import shutil
from types import SimpleNamespace

import pytest
from rich.console import Console

import mechkit as mk
from mechkit.actvec.vector import ActivationVector
from mechkit.adapt.scheduler import Scheduler
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path, recover
from mechkit.io.leftovers import clean_leftovers, stale_leftovers
from mechkit.taskarith.vector import TaskVector
from tests.killed_write import killed_write


@pytest.mark.parametrize(("name", "load"), [
    ("scheduler.json", lambda out: Scheduler.load(out)),
    ("v.safetensors", lambda out: TaskVector.load(out / "v.safetensors")),
    ("f.safetensors", lambda out: ActivationVector.load(out / "f.safetensors")),
])
def test_an_artifact_read_from_a_half_installed_run_is_the_committed_one(tmp_path, monkeypatch, name, load):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    out = killed_write(tmp_path, f"after-{name}", old={name: "OLD", "report.json": "{}"},
                       new={name: "NEW", "report.json": "{}"}, writer="adapt")
    assert (out / name).read_text() == "NEW"  # the killed write's, uncommitted
    with pytest.raises(MechkitError):  # neither is a real artifact: what matters is what was read
        load(out)
    assert (out / name).read_text() == "OLD" and not journal_path(out).exists()


def _copy_tree(tmp_path):
    """The killed state copied as ``cp -a`` does: new inodes, the same contents and times."""
    shutil.copytree(tmp_path, tmp_path.with_name(tmp_path.name + "-copy"), symlinks=True)
    shutil.rmtree(tmp_path)
    os.rename(tmp_path.with_name(tmp_path.name + "-copy"), tmp_path)


def test_a_copy_or_a_touch_of_the_killed_writes_entries_still_rolls_back(tmp_path):
    out = killed_write(tmp_path, "after-model")
    (tmp_path / "killed.py").unlink()
    _copy_tree(tmp_path)
    os.utime(out / "a.txt")  # touch
    assert recover(out) and (out / "a.txt").read_text() == "1" and (out / "model" / "config.json").read_text() == "{}"


def test_every_entry_the_user_changed_is_named_at_once(tmp_path):
    out = killed_write(tmp_path, "after-model")
    (out / "model" / "config.json").write_text('{"mine": 1}')  # the killed write's file, edited by the user
    (out / "model" / "notes.md").write_text("mine")
    with pytest.raises(MechkitError, match="which that write did not put there") as err:
        recover(out)
    assert f"{out / 'model' / 'config.json'}, {out / 'model' / 'notes.md'}, which" in str(err.value)
    assert err.value.fix == f"move those out of {out}, then rerun"
    assert (out / "model" / "config.json").read_text() == '{"mine": 1}' and journal_path(out).exists()


def test_a_journal_no_clear_can_roll_back_is_not_counted_as_a_leftover(tmp_path, capsys):
    out = killed_write(tmp_path, "after-model")
    (out / "a.txt").write_text("mine")  # the user's now: the roll-back refuses
    assert stale_leftovers(tmp_path) == []  # neither the journal nor the old set beside it
    assert clean_leftovers(tmp_path) == [] and (out / "a.txt").read_text() == "mine"
    assert "which that write did not put there" in capsys.readouterr().err


def test_a_users_note_under_a_locks_name_is_refused_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / ".run.mechkit-lock").write_text("my notes")
    with pytest.raises(MechkitError, match="a file that is not a lock"):
        mk.run("inspect", model="tiny:llama", out=tmp_path / "run", console=Console(file=io.StringIO()))
    assert (tmp_path / ".run.mechkit-lock").read_text() == "my notes"


def test_a_weight_name_not_found_is_fixed_with_one_of_this_models():
    m = mk.load_model("tiny:gpt2")
    with pytest.raises(MechkitError) as err, mk.edit_weights(m) as w:
        w.named("nope.weight")
    example = err.value.fix.split("e.g. ")[1].split()[0]
    assert example in dict(m.model.named_parameters())


# --- pass 49 (b) -------------------------------------------------------------------------------------------------


def _mqa(tmp_path):
    """tiny:llama with one key/value head shared by its four query heads (multi-query attention)."""
    import transformers

    m = mk.load_model("tiny:llama")
    config = transformers.LlamaConfig(**{**m.model.config.to_dict(), "num_key_value_heads": 1})
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "mqa")
    m.tokenizer.save_pretrained(tmp_path / "mqa")
    return tmp_path / "mqa"


def test_gqa_group_on_one_kv_group_per_layer_is_refused_and_its_fix_prunes(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    model = _mqa(tmp_path)
    common = dict(model=str(model), guide="magnitude", tasks="capitalize", n=2, calib=2, repeats=1,
                  console=Console(file=io.StringIO()))
    for level in ({"sparsity": "0.6", "target": "heads"},  # a budget searches mixes with neurons or layers (pass 54)
                  {"budget": 0.8, "budget_unit": "flops", "target": "neurons,heads"}):
        with pytest.raises(MechkitError, match="has one such group per layer") as err:
            mk.run("prune", gqa="group", out=tmp_path / "o", **common, **level)
        assert err.value.fix.startswith("drop --gqa group")
    run = mk.run("prune", sparsity="0.6", target="heads", out=tmp_path / "fixed", **common)
    assert run.report["results"]["rows"][0]["plan"]["counts"]["heads"] > 0


def test_a_sensitivity_spread_removes_the_channels_its_fraction_asks():
    import numpy as np

    from mechkit.pruning.guides import Scores
    from mechkit.pruning.select import make_plan, removes_nothing, select_neurons

    rng = np.random.default_rng(0)
    assert sum(map(len, select_neurons(rng.random((2, 256)), 0.002, "global", np.full(2, 0.002)).values())) == 1
    a = SimpleNamespace(n_layers=4, n_heads=4, n_kv_heads=2, n_groups=2, d_mlp=100)
    scores = Scores(mlp=rng.random((4, 100)), heads=np.ones((4, 4)), layers=np.array([.1, .2, 5, 6.]), guide="x")
    plan = make_plan(scores, a, {"layers": 0.5, "neurons": 0.3}, "sensitivity", "slot", True,
                     np.array([0.01, 0.02, 1.0, 1.0]))
    assert plan.layers == [0, 1] and set(plan.mlp) <= {2, 3} and sum(map(len, plan.mlp.values())) == 60
    assert removes_nothing(a, {"neurons": 0.001}, "sensitivity") is not None  # 0.001 x 400 rounds to none: said


@pytest.mark.parametrize("text", ["0", "-0.0", "1e-400", "neurons=0"])
def test_a_zero_sparsity_is_refused(text):
    from mechkit.pruning import parse_levels

    with pytest.raises(MechkitError, match=r"is outside \(0, 1\)"):
        parse_levels(text, ["neurons"])


def test_a_target_left_out_of_a_small_level_gets_a_fraction_that_removes_some(tmp_path):
    with pytest.raises(MechkitError, match="gives it no fraction") as err:
        mk.run("prune", model="tiny:llama", target="neurons,heads", sparsity="neurons=0.01",
               out=tmp_path / "o", console=Console(file=io.StringIO()))
    assert "--sparsity neurons=0.01,heads=0.5" in err.value.fix


def test_a_fraction_no_value_below_one_reaches_says_drop_the_target():
    from mechkit.pruning.select import removes_nothing

    a = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=1, n_groups=4, d_mlp=64)
    why, fix = removes_nothing(a, {"heads": 0.3}, "uniform", "group")  # heads alone: dropping it leaves no target
    assert "no fraction below 1 would" in why and fix == "prune what this model can lose instead: --target neurons"
    assert removes_nothing(a, {"heads": 0.3, "neurons": 0.3}, "uniform", "group")[1] == "drop heads from --target"


def test_a_scheduler_refused_on_a_one_block_model_never_sends_the_user_to_adapt_there(monkeypatch):
    import mechkit.adapt.scheduler as scheduler

    monkeypatch.setattr(scheduler, "structure_identity", lambda h: {"n_layers": 1})
    sched = scheduler.Scheduler.__new__(scheduler.Scheduler)
    sched.model = {"architecture": "LlamaForCausalLM", "n_layers": 2}
    with pytest.raises(MechkitError, match="calibrated on another model") as err:
        sched.check_model(SimpleNamespace(model=SimpleNamespace()))
    assert "cannot calibrate one on a model with fewer than 2 blocks" in err.value.fix
