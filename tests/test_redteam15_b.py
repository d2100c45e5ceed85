"""Red-team pass 15 (issue 32), helper B: prune's --sparsity naming a unit type --target leaves out (pruned
anyway), the refit options where only whole layers go, finetune's file-size check that held the loaded dtype
and not the float32 model or checkpoint it writes, and ``save_model=True`` under ``write=False``.

Each test names the case that failed before its fix.
"""

from __future__ import annotations

import re

import pytest

import mechkit as mk
from mechkit import registry
from mechkit.errors import MechkitError
from mechkit.options import OptionError
from mechkit.options.resolve import resolve_options
from tests.conftest import file_size_limit

SMALL = dict(guide="magnitude", tasks="capitalize", n=2, calib=2, repeats=1, timing_batch=2, shots=2)


@pytest.mark.parametrize("target, sparsity, outside", [
    ("heads", "neurons=0.3", "neurons"),
    ("heads", "heads=0.3,neurons=0.1", "neurons"),
    ("layers", "layers=0.5,heads=0.2", "heads"),
])
def test_a_sparsity_naming_a_unit_type_outside_target_is_refused(target, sparsity, outside):
    """prune --target heads --sparsity neurons=0.3 pruned neurons (parameters 107,200 -> 92,544) under a report
    and option checks that went by --target heads."""
    with pytest.raises(OptionError, match=f"prunes {outside}, and --target {target} leaves it out") as err:
        resolve_options(registry.get("prune"), {"target": target, "sparsity": sparsity})
    assert f"--target {target},{outside}" in err.value.fix and f"drop {outside}=" in err.value.fix
    for fixed in re.findall(r"\(([^()]*)\)", err.value.fix):  # each fix runs: (--target T [--sparsity S])
        options = {"target": target, "sparsity": sparsity} | dict(re.findall(r"--(target|sparsity) (\S+)", fixed))
        resolve_options(registry.get("prune"), options)


@pytest.mark.parametrize("plugin, options, flag", [
    ("prune", {"target": "layers", "ridge": 0.5}, "--ridge"),
    ("prune", {"target": "layers", "sequential": True}, "--sequential"),
    ("prune", {"target": "layers", "budget": 0.5, "ridge": 0.5}, "--ridge"),
    ("prune", {"target": "layers", "reconstruct": "mean"}, "--reconstruct mean"),
    ("adapt", {"prune_targets": "layers", "prune_reconstruct": "mean"}, "--prune-reconstruct mean"),
])
def test_refit_options_where_only_whole_layers_go_are_refused(plugin, options, flag):
    """Removing whole blocks leaves no projection to refit and no removed output to stand in for: --ridge,
    --sequential and --reconstruct mean ran without effect and the report named the refit."""
    with pytest.raises(OptionError, match=f"^{flag} .*whole layers alone, so it would be ignored"):
        resolve_options(registry.get(plugin), options)


@pytest.mark.parametrize("plugin, options", [
    ("prune", {"target": "layers", "reconstruct": "none"}),
    ("prune", {"target": "layers,neurons", "sequential": True}),
    ("prune", {"target": "layers,heads", "reconstruct": "mean"}),
    ("adapt", {"prune_targets": "layers,heads", "prune_reconstruct": "mean"}),
    ("adapt", {"prune_targets": "layers", "prune_reconstruct": "none"}),
])
def test_refits_that_apply_are_still_accepted(plugin, options):
    resolve_options(registry.get(plugin), options)


def test_finetune_holds_the_float32_model_to_the_file_size_limit_before_training(tmp_path):
    """A bfloat16 model under a ulimit -f between its own size and the float32 size it is saved in passed the
    check, trained, then failed writing model.safetensors."""
    handle = mk.load_model("tiny:llama", device="cpu", dtype="bfloat16")
    loaded = sum(p.numel() * p.element_size() for p in handle.model.parameters())
    with file_size_limit(loaded + 1000), pytest.raises(MechkitError, match="would be at least"):
        mk.run("finetune", model=handle, out=tmp_path / "ft", steps=2, batch_size=2, eval_n=2, checkpoint_every=0)
    assert not (tmp_path / "ft").exists()


def test_finetune_holds_its_checkpoint_to_the_file_size_limit_before_training(tmp_path):
    """Full fine-tuning under a ulimit -f the float32 model fits but its checkpoint (weights and two AdamW
    moments) does not: refused at the first checkpoint, after the training steps before it."""
    handle = mk.load_model("tiny:llama", device="cpu")
    model = registry.get("finetune").saved_model_bytes({}, handle)
    run = dict(steps=4, batch_size=2, eval_n=2, checkpoint_every=2)
    with file_size_limit(model + 50_000), pytest.raises(MechkitError, match="the checkpoint finetune writes"):
        mk.run("finetune", model=handle, out=tmp_path / "ft", **run)
    assert not (tmp_path / "ft").exists()
    with file_size_limit(model + 50_000):  # LoRA checkpoints only its adapters: the same limit passes
        mk.run("finetune", model=handle, out=tmp_path / "lora", method="lora", **run)
    assert (tmp_path / "lora" / "model.safetensors").is_file()


def test_save_model_under_write_false_is_refused():
    """mk.run("prune", save_model=True, write=False) built the pruned model and dropped it (the Run holds no
    files): the option was silently ignored."""
    with pytest.raises(MechkitError, match="write=False writes nothing, so save_model=True") as err:
        mk.run("prune", model="tiny:llama", write=False, target="layers", sparsity="0.5", save_model=True, **SMALL)
    assert "drop save_model=" in err.value.fix


def test_a_sparsity_naming_a_unit_type_twice_is_refused():
    """prune --sparsity neurons=0.3,neurons=0.2 ran one level at neurons=0.2: the 0.3 was dropped unsaid (a
    grid of one unit type is fractions with --target, which still passes)."""
    with pytest.raises(OptionError, match="names neurons twice") as err:
        resolve_options(registry.get("prune"), {"target": "neurons", "sparsity": "neurons=0.3,neurons=0.2"})
    assert err.value.fix.endswith("(--target neurons --sparsity 0.3,0.2)")  # the user's own fractions
    resolve_options(registry.get("prune"), {"target": "neurons", "sparsity": "0.3,0.2"})
