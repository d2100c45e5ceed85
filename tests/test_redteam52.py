"""Red-team pass 52, fixed: three wrong fixes of the pass 51 refusal of an ``--out`` that goes back (``..``) out of
a name that is no folder. The fix named the place with ``..`` collapsed as text (``L/../nosuch/../data`` gave
``--out data``, the user's own folder, where ``L`` is a link and the path means ``x/data``); a file ``--out`` was
offered a folder (``--out .``); and an API save through a file's ``..`` was told to ``mkdir -p`` it.
"""

from __future__ import annotations

import os

import pytest

from mechkit.errors import MechkitError
from mechkit.io.locked_write import write_locked
from mechkit.io.out import check_out


def test_the_place_meant_is_resolved_as_the_system_would(tmp_path):
    (tmp_path / "x" / "deep").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "x" / "deep", tmp_path / "L")
    with pytest.raises(MechkitError, match="which is no folder") as err:
        check_out(tmp_path / "L" / ".." / "nosuch" / ".." / "data")
    assert err.value.fix == f"name the place without the .. (--out {tmp_path / 'x' / 'data'})"


def test_a_file_out_is_offered_a_file(tmp_path):
    os.symlink(tmp_path / "missing", tmp_path / "dang")
    with pytest.raises(MechkitError, match="ends with /.., which names a directory") as err:  # a folder's name (pass 57)
        check_out(f"{tmp_path}/dang/..", kind="file")
    assert err.value.fix == f"name a file inside it, e.g. --out {tmp_path / 'name.safetensors'}"


def test_an_api_save_through_a_files_dot_dot_is_refused_with_a_fix_that_works(tmp_path):
    (tmp_path / "f").write_text("F")
    with pytest.raises(MechkitError, match="goes back \\(..\\) out of .*f, which is no folder") as err:
        write_locked(tmp_path / "f" / ".." / "page.html", "<p>x</p>", "the attention page")
    assert err.value.fix == f"name the file without the .. (e.g. the path {tmp_path / 'page.html'})"
    assert write_locked(tmp_path / "page.html", "<p>x</p>", "the attention page").read_text() == "<p>x</p>"


# --- pass 52 (b) -------------------------------------------------------------------------------------------------


def test_protect_top_k_is_read_under_target_layers_and_its_fix_runs(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import mechkit as mk

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = dict(model="tiny:llama", tasks="capitalize", calib=2, n=2, shots=1, repeats=1, guide="induction",
                  target="layers", sparsity="0.5", console=Console(file=io.StringIO()))
    with pytest.raises(MechkitError, match="--protect-top-k keeps") as err:  # the default 10 keeps every layer here
        mk.run("prune", out=tmp_path / "a", **common)
    assert err.value.fix.startswith("lower --protect-top-k")
    run = mk.run("prune", out=tmp_path / "b", protect_top_k=0, **common)  # the fix, as said: no longer "ignored"
    assert run.report["results"]["rows"][0]["plan"]["counts"]["layers"] == 1


def test_a_budget_plan_that_removes_nothing_never_meets_the_budget():
    from mechkit.pruning.budget import search
    from mechkit.pruning.plan import UnitsToRemove

    found = search(lambda sparsity: UnitsToRemove(), None, 0.999, ["layers"], cost=lambda plan, stats: 0.5,
                   accuracy=lambda plan: 1.0)  # timing noise said 0.5 of the dense latency
    assert [c.cost_ratio for c in found] == [1.0] and found[0].calib_accuracy is None  # none met, none measured


def test_a_budget_every_protected_unit_blocks_says_lower_protect_top_k():
    from mechkit.pruning.study import budget_fix

    assert budget_fix(["layers"], [{"cost_ratio": 1.0}], protects=True).startswith(
        "no plan tried removed anything or was cheaper than the dense model: lower --protect-top-k")
