"""Red-team pass 56, fixed: three wrong fixes of the pruning refusals, and a guide list taken as given.

- "prune what this model can lose instead: --target X" kept the user's ``--sparsity``, whose pairs named the old
  target or whose fraction X could not take: the fix now gives X its fitted fractions.
- ``--budget`` with targets this model cannot lose a unit of (``--target layers`` on a 1-layer model) searched, then
  offered fixes that could not help; it is refused before the search, naming a target to add.
- The protection refusal of layers offered "drop layers" beside neurons where the heads were blocked too.
- ``--guide magnitude,magnitude`` measured the same rows twice; ``--guide magnitude@`` ran labelled ``magnitude@``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from mechkit.errors import MechkitError
from mechkit.options import unread
from mechkit.options.option import OptionError
from mechkit.pruning.guides import Scores
from mechkit.pruning.select import fit_levels, make_plan, parse_guides, parse_levels
from tests.rho_tool import rho_tool

ONE_LAYER = SimpleNamespace(n_layers=1, n_heads=4, n_kv_heads=2, n_groups=2, d_mlp=128, is_moe=False)
ONE_HEAD = SimpleNamespace(n_layers=2, n_heads=1, n_kv_heads=1, n_groups=1, d_mlp=128, is_moe=False)


@pytest.mark.parametrize("anatomy,target,text,fix", [
    (ONE_LAYER, "layers", "layers=0.5", "(--target neurons --sparsity neurons=0.5)"),
    (ONE_HEAD, "heads", "0.999", "(--target neurons --sparsity neurons=0.992)"),
    (ONE_LAYER, "layers", "0.2,0.999", "(--target neurons --sparsity 0.2,0.99)"),
])
def test_another_unit_type_is_offered_with_fractions_it_takes(anatomy, target, text, fix):
    allocations = ("global",)
    why, said = fit_levels(anatomy, parse_levels(text, [target]), allocations)
    assert said == f"prune what this model can lose instead {fix}"
    new_target, sparsity = fix.strip("()").removeprefix("--target ").split(" --sparsity ")
    assert fit_levels(anatomy, parse_levels(sparsity, [new_target]), allocations) is None  # applied: it runs


def test_a_budget_on_targets_the_model_cannot_lose_is_refused_before_the_search():
    with pytest.raises(OptionError, match="searches no plan on this model: it cannot lose layers") as err:
        unread.budget_on_model(ONE_LAYER, ["layers"])
    assert err.value.fix == "add neurons to --target (--target layers,neurons)"
    unread.budget_on_model(ONE_LAYER, ["layers", "neurons"])  # the fix: a mix to search


def test_drop_layers_is_not_offered_beside_neurons_where_protection_blocks_the_heads():
    anatomy = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=8)
    every = tuple((layer, h) for layer in range(2) for h in range(4))
    scores = Scores(np.zeros((2, 8)), np.arange(8.0).reshape(2, 4), np.array([0.1, 5.0]), "induction", every)
    level = {"neurons": 0.3, "heads": 0.5, "layers": 0.5}
    with pytest.raises(MechkitError, match="hold none of the 8 heads") as err:
        make_plan(scores, anatomy, level, "global", strict=True)
    assert "drop layers" not in err.value.fix
    with pytest.raises(MechkitError, match="hold none of the 8 heads") as err:
        make_plan(scores, anatomy, {"neurons": 0.3, "layers": 0.5}, "global", strict=True)
    assert err.value.fix.endswith("or drop layers from --target")  # neurons alone beside it: they run


def test_a_guide_list_drops_repeats_and_refuses_an_empty_allocation():
    assert parse_guides("magnitude,magnitude,random") == ["magnitude", "random"]
    with pytest.raises(MechkitError, match="no allocation after @ in --guide 'magnitude@'") as err:
        parse_guides("magnitude@")
    assert "magnitude@ALLOCATION" in err.value.fix


# --- pass 56 (a) ---------------------------------------------------------------------------------------------------


def test_an_empty_path_is_no_run_and_a_nul_byte_no_folder(tmp_path, monkeypatch):
    import mechkit as mk
    from mechkit.adapt.scheduler import Scheduler
    from tests.conftest import cli_in_process

    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.json").write_text("{}")  # "" had read the working directory's
    (tmp_path / "scheduler.json").write_text("{}")
    for call in (lambda: mk.load_report(""), lambda: mk.load_report(b""), lambda: Scheduler.load(""),
                 lambda: mk.load_model("tiny:llama", offload_folder="")):
        with pytest.raises(MechkitError, match="empty path, which names no file"):
            call()
    with pytest.raises(MechkitError, match="NUL byte"):
        mk.load_model("tiny:llama", offload_folder="o\0f")
    done = cli_in_process("report", "show", "")
    assert done.returncode == 2 and "empty path" in done.stderr


def test_a_file_named_with_a_trailing_slash_is_not_read(tmp_path):
    import mechkit as mk

    mk.run("inspect", model="tiny:llama", out=tmp_path / "r", console=_quiet())
    with pytest.raises(MechkitError, match="names a folder \\(it ends with / or .\\)") as err:
        mk.load_report(f"{tmp_path}/r/report.json/")
    assert err.value.fix == f"name the file itself ({tmp_path}/r/report.json)"
    assert mk.load_report(f"{tmp_path}/r/").report["plugin"] == "inspect"  # a folder's slash is fine


def test_a_task_vector_save_takes_only_a_bool_force_and_a_tuple_of_inputs(tmp_path):
    import torch

    from mechkit.taskarith.vector import TaskVector

    vector = TaskVector({"w": torch.ones(3)})
    vector.save(tmp_path / "v.safetensors")
    before = (tmp_path / "v.safetensors").stat().st_mtime_ns
    with pytest.raises(MechkitError, match="force must be True or False, not str"):
        vector.save(tmp_path / "v.safetensors", force="no")  # truthy: it had replaced the vector
    with pytest.raises(MechkitError, match="inputs must be a tuple of paths, not str"):
        vector.save(tmp_path / "w.safetensors", inputs=str(tmp_path / "x.safetensors"))
    assert (tmp_path / "v.safetensors").stat().st_mtime_ns == before and not (tmp_path / "w.safetensors").exists()


def test_the_rho_tools_json_never_names_another_runs_file_or_a_models(tmp_path, monkeypatch):

    import mechkit as mk

    tool = rho_tool()
    (tmp_path / "run").mkdir()
    mk.run("inspect", model="tiny:llama", out=tmp_path / "other", console=_quiet())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    for target, words in ((tmp_path / "other" / "report.json", "one of the files a `inspect` run wrote"),
                          (tmp_path / "m" / "config.json", "part of the model")):
        with pytest.raises(MechkitError, match=words):
            tool.check_json_target(str(target), str(tmp_path / "run"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MechkitError, match="inside the run directory"):  # the report named with ~
        tool.check_json_target(str(tmp_path / "run" / "report.json"), "~/run")


def test_a_journal_on_a_read_only_file_system_says_to_remount_not_to_ask_the_owner(tmp_path, monkeypatch):
    import errno

    import mechkit.io.outlock as outlock
    from mechkit.io.journal import journal_path

    (tmp_path / "r").mkdir()
    journal_path(tmp_path / "r").write_text("{}")

    @contextlib.contextmanager
    def read_only(_place):
        raise MechkitError("cannot lock") from OSError(errno.EROFS, "Read-only file system")
        yield

    monkeypatch.setattr(outlock, "out_lock", read_only)
    with pytest.raises(MechkitError, match="on a read-only file system") as err:
        outlock.settle_interrupted(tmp_path / "r")
    assert err.value.fix.startswith("remount it writable")


def _quiet():
    import io

    from rich.console import Console

    return Console(file=io.StringIO())
