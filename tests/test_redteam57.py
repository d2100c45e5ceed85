"""Red-team pass 57, fixed.

- ``TaskVector.save("notes/.")`` replaced the user's file ``notes`` (``Path`` drops a trailing ``/.`` as it drops
  ``/``); readers read ``report.json/.`` and ``TaskVector.load``/``ActivationVector.load`` read ``file/``.
- A path holding a lone surrogate (``"\\ud800"``, from Python only) raised a raw UnicodeEncodeError from every reader
  and writer; ``" "`` was refused as an empty path.
- ``--sparsity 0.3,0.5`` on a 2-layer model (one layer each) gave two rows of one plan, and the past-reach fix could
  make such a pair; ``--guide magnitude,magnitude@global`` under ``--allocation global`` measured the same rows twice.
- The API's refusal of ``~/x`` told Python users to write ``$HOME/runs/name`` (a folder named ``$HOME``).
"""

from __future__ import annotations

import io
import os
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.actvec.vector import ActivationVector
from mechkit.adapt.scheduler import Scheduler
from mechkit.errors import MechkitError
from mechkit.options.option import OptionError
from mechkit.pruning.select import fit_levels, parse_levels, same_effect
from mechkit.taskarith.vector import TaskVector
from mechkit.taskselect import rho


def test_a_save_to_a_name_ending_in_dot_never_replaces_the_file_of_that_name(tmp_path):
    (tmp_path / "notes").write_text("mine\n")
    vector = TaskVector({"w": torch.ones(3)})
    for given in ("notes/.", "notes/./", "new/."):
        with pytest.raises(MechkitError, match="which names a directory"):
            vector.save(f"{tmp_path}/{given}")
    assert (tmp_path / "notes").read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_readers_never_read_a_file_through_a_name_that_names_a_folder(tmp_path):
    vector = TaskVector({"w": torch.ones(3)})
    vector.save(tmp_path / "v.safetensors")
    mk.run("inspect", model="tiny:llama", out=tmp_path / "r", console=Console(file=io.StringIO()))
    for call in (lambda: TaskVector.load(f"{tmp_path}/v.safetensors/"),
                 lambda: ActivationVector.load(f"{tmp_path}/v.safetensors/"),
                 lambda: mk.load_report(f"{tmp_path}/r/report.json/."),
                 lambda: rho.load_report(f"{tmp_path}/r/report.json/.")):
        with pytest.raises(MechkitError, match="names a folder") as err:
            call()
        assert err.value.fix.startswith("name the file itself")
    assert mk.load_report(f"{tmp_path}/r/.").report["plugin"] == "inspect"  # a folder's own . is fine


def test_a_character_no_file_name_can_hold_is_one_line_everywhere(tmp_path):
    bad = f"{tmp_path}/\ud800"
    handle = mk.load_model("tiny:llama")
    for call in (lambda: mk.load_report(bad), lambda: rho.load_report(bad), lambda: TaskVector.load(bad),
                 lambda: Scheduler.load(bad), lambda: TaskVector({"w": torch.ones(1)}).save(bad),
                 lambda: mk.run("inspect", model=handle, out=bad, console=Console(file=io.StringIO()))):
        with pytest.raises(MechkitError, match="a character no file name can hold"):
            call()


def test_a_blank_name_is_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mk.run("inspect", model="tiny:llama", out=tmp_path / " ", console=Console(file=io.StringIO()))
    assert mk.load_report(" ").report["plugin"] == "inspect"


def test_the_api_refusal_of_a_tilde_names_a_path_that_works(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MechkitError, match="starts with ~") as err:
        TaskVector({"w": torch.ones(1)}).save("~/v.safetensors")
    assert err.value.fix == f"write the full path, e.g. {os.path.join(str(tmp_path), 'runs', 'name')}"


TWO_LAYERS = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=64)


def test_two_levels_removing_the_same_units_are_one_and_the_fix_never_makes_such_a_pair():
    why, fix = same_effect(TWO_LAYERS, parse_levels("0.3,0.5", ["layers"]))
    assert fix == "keep one (--sparsity 0.3)"
    assert same_effect(TWO_LAYERS, parse_levels("0.3", ["layers"])) is None
    why, fix = fit_levels(TWO_LAYERS, parse_levels("0.3,0.99", ["layers"]))
    assert fix == "drop 0.99 (the most it can remove, 0.5, removes what 0.3 does) (--sparsity 0.3)"


def test_prune_refuses_two_labels_of_one_plan_and_a_guide_named_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = dict(model="tiny:gpt2", tasks="capitalize", n=2, calib=2, shots=1, repeats=1,
                  console=Console(file=io.StringIO()))
    with pytest.raises(OptionError, match="0.3 and 0.5 remove the same units"):
        mk.run("prune", out=tmp_path / "a", guide="magnitude", target="layers", sparsity="0.3,0.5", **common)
    with pytest.raises(OptionError, match="names magnitude twice with the allocation global") as err:
        mk.run("prune", out=tmp_path / "b", guide="magnitude,magnitude@global,random@uniform", allocation="global",
               sparsity="0.3", **common)
    assert err.value.fix == "name it once (--guide magnitude,random@uniform)"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
