"""Red-team pass 14 (issue 32), helper B: a cache location naming a user with no home, fixes that named an
option already given or one never given, and the file-size check that refused a pruned model for the dense
model's size.

Each test names the case that failed before its fix.
"""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit import registry
from mechkit.errors import MechkitError
from mechkit.io.disk_cache import cache_root
from mechkit.options import OptionError
from mechkit.options.resolve import resolve_options
from tests.conftest import cli_in_process, file_size_limit

NO_HOME = "~mechkit-rt14-no-such-user"


@pytest.mark.parametrize("variable, value", [("MECHKIT_CACHE", f"{NO_HOME}/cache"), ("XDG_CACHE_HOME", NO_HOME)])
def test_a_cache_location_naming_a_user_without_a_home_is_one_line(monkeypatch, variable, value):
    """MECHKIT_CACHE='~nosuchuser/x' raised RuntimeError ("Could not determine home directory") from every
    command, `cache list` included: a traceback."""
    monkeypatch.delenv("MECHKIT_CACHE", raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(MechkitError, match="names no user with a home directory") as err:
        cache_root()
    assert f"set ${variable} to an absolute path" in err.value.fix
    result = cli_in_process("cache", "list")
    assert result.returncode != 0 and "names no user" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("options", [
    {"representation": "actvec", "position": "mean"},
    {"representation": "lora-grad", "layer": 0},
])
def test_a_representation_option_under_validate_without_the_rho_table_names_transfer_seeds(options):
    """select-tasks --representation actvec --position mean --validate --transfer-seeds 0 said "pass
    --validate", which was already given: the fix that helps is --transfer-seeds 1 or more."""
    cls = registry.get("select-tasks")
    given = {"target": "capitalize", **options, "validate": True, "transfer_seeds": 0}
    with pytest.raises(OptionError) as err:
        resolve_options(cls, given)
    assert "--transfer-seeds 1 or more" in err.value.fix and "pass --validate" not in err.value.fix
    resolve_options(cls, {**given, "transfer_seeds": 1})  # the fix, applied, is accepted
    with pytest.raises(OptionError, match="pass --validate"):  # without --validate, --validate is the fix
        resolve_options(cls, {"target": "capitalize", **options})


def test_budgets_without_the_default_prune_budget_get_a_fix_that_works():
    """adapt --budgets 0.5,0.9 was refused for --prune-budgets 0.7, an option the user never gave, with the fix
    "drop them from --prune-budgets"; the line now says it is the default and names a value that works."""
    cls = registry.get("adapt")
    with pytest.raises(OptionError, match=r"0\.7 unless given") as err:
        resolve_options(cls, {"budgets": "0.5,0.9"})
    assert "--prune-budgets 0.9" in err.value.fix and "--prune-budgets ''" in err.value.fix
    resolve_options(cls, {"budgets": "0.5,0.9", "prune_budgets": "0.9"})
    resolve_options(cls, {"budgets": "0.5,0.9", "prune_budgets": ""})


PRUNE = dict(guide="magnitude", sparsity="0.9", tasks="capitalize", n=2, calib=2, shots=1, repeats=1,
             timing_batch=2, save_model=True)


def test_the_pruned_models_size_floor_is_below_the_saved_model_and_the_dense_one(tmp_path):
    """The floor the file-size check holds a pruned model to: never above what prune saves."""
    handle = mk.load_model("tiny:llama", device="cpu")
    cls = registry.get("prune")
    dense = registry.get("finetune").saved_model_bytes({}, handle)
    floors = {t: cls.saved_model_bytes({"target": t.split(",")}, handle) for t in ("neurons", "heads", "layers",
                                                                                  "neurons,heads")}
    assert all(0 < f < dense for f in floors.values())
    assert floors["layers"] <= floors["neurons,heads"] <= min(floors["neurons"], floors["heads"])
    mk.run("prune", model=handle, out=tmp_path / "run", **PRUNE)
    assert floors["neurons"] <= (tmp_path / "run" / "model" / "model.safetensors").stat().st_size


def test_a_pruned_model_that_fits_the_file_size_limit_is_not_refused_for_the_dense_size(tmp_path):
    """prune --sparsity 0.9 --save-model under ulimit -f 300 kB was refused ("would be 428800 bytes": the dense
    model) though the model it saves is 255 kB; a limit below even the floor is still refused before the work."""
    handle = mk.load_model("tiny:llama", device="cpu")
    dense = registry.get("finetune").saved_model_bytes({}, handle)
    floor = registry.get("prune").saved_model_bytes({"target": ["neurons"]}, handle)
    mk.run("prune", model=handle, out=tmp_path / "probe", **PRUNE)
    saved = (tmp_path / "probe" / "model" / "model.safetensors").stat().st_size
    limit = (saved + dense) // 2  # the saved model fits, the dense one would not
    with file_size_limit(limit):
        mk.run("prune", model=handle, out=tmp_path / "fits", **PRUNE)
    assert (tmp_path / "fits" / "model" / "model.safetensors").stat().st_size == saved
    with file_size_limit(floor - 1), pytest.raises(MechkitError, match=f"at least {floor} bytes"):
        mk.run("prune", model=handle, out=tmp_path / "refused", **PRUNE)
    assert not (tmp_path / "refused").exists()


def test_checkpoint_every_beyond_a_single_step_names_a_value_that_exists():
    """finetune --steps 1 --checkpoint-every 5 said "pass --checkpoint-every below 1, or 0 for none": below 1 is
    0, which is none."""
    cls = registry.get("finetune")
    with pytest.raises(OptionError) as err:
        resolve_options(cls, {"steps": 1, "checkpoint_every": 5})
    assert "below 1" not in err.value.fix and "--checkpoint-every 0" in err.value.fix
    resolve_options(cls, {"steps": 1, "checkpoint_every": 0})


def test_the_size_floor_on_a_mixture_of_experts_leaves_its_refusal_to_prune(tmp_path):
    """The floor is computed before the plugin runs: on a mixture of experts (no dense MLP) --target neurons
    must still get prune's one line, not an error from the floor."""
    from mechkit.errors import UnsupportedArchitectureError
    from tests.test_moe import _model

    m = _model("mixtral")
    with pytest.raises(UnsupportedArchitectureError, match="no dense MLP neurons"):
        mk.run("prune", model=m, out=tmp_path / "run", **{**PRUNE, "sparsity": "0.25"})
    assert registry.get("prune").saved_model_bytes({"target": ["heads"]}, m) > 0
