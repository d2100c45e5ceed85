"""mechkit.patching.normalized_recovery: one-number clean/corrupted given as Python or NumPy numbers or
one-element tensors are converted; several values, NaN or infinity, a bool or text are refused in one line
(a tensor clean raised torch's raw RuntimeError, a NaN gave NaN silently); clean == corrupted is still refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mechkit.errors import MechkitError
from mechkit.patching import normalized_recovery


@pytest.mark.parametrize("clean, corrupted", [
    (3.0, -1.0), (3, -1), (torch.tensor(3.0), torch.tensor(-1.0)), (torch.tensor([3.0]), -1.0),
    (np.float64(3.0), np.int64(-1)), (np.array(3.0), np.array([-1.0])), (torch.tensor(3, dtype=torch.int64), -1.0),
    (torch.tensor(3.0, dtype=torch.bfloat16), torch.tensor(-1.0, dtype=torch.float16))])
def test_one_number_of_any_kind_is_taken(clean, corrupted):
    got = normalized_recovery(2.0, clean, corrupted)
    assert type(got) is float and got == 0.75
    grid = normalized_recovery(torch.tensor([[3.0, -1.0], [1.0, 2.0]]), clean, corrupted)
    assert torch.equal(grid, torch.tensor([[1.0, 0.0], [0.5, 0.75]]))


def test_a_patched_grid_keeps_its_dtype_and_integers_become_floats():
    half = normalized_recovery(torch.tensor([3.0, 1.0], dtype=torch.float64), 3.0, -1.0)
    assert half.dtype == torch.float64 and half.tolist() == [1.0, 0.5]
    ints = normalized_recovery(torch.tensor([3, 1, -1]), 3, -1)
    assert ints.is_floating_point() and ints.tolist() == [1.0, 0.5, 0.0]
    assert normalized_recovery(np.float32(1.0), 3.0, -1.0) == 0.5 and normalized_recovery(-5, 3, -1) == -1.0


@pytest.mark.parametrize("clean, corrupted, match", [
    (torch.tensor([3.0, 2.0]), -1.0, "clean has shape \\[2\\], not one number"),
    (3.0, torch.zeros(2, 2), "corrupted has shape \\[2, 2\\], not one number"),
    (np.array([3.0, 1.0]), -1.0, "clean has shape \\[2\\], not one number"),
    (torch.tensor([]), -1.0, "clean has shape \\[0\\], not one number"),
    (float("nan"), -1.0, "clean is nan"),
    (3.0, torch.tensor(float("-inf")), "corrupted is -inf"),
    (np.float64("inf"), -1.0, "clean is inf"),
    (True, 0.0, "clean is bool, not a number"),
    (torch.tensor(True), 0.0, "clean is bool, not a number"),
    ("3", 0.0, "clean is str, not a number"),
    (3.0, None, "corrupted is NoneType, not a number"),
    ([3.0], 0.0, "clean is list, not a number")])
def test_what_is_not_one_finite_number_is_refused_in_one_line(clean, corrupted, match):
    with pytest.raises(MechkitError, match=match) as err:
        normalized_recovery(1.0, clean, corrupted)
    assert "\n" not in str(err.value) and " — " in str(err.value)  # the problem, then the fix


@pytest.mark.parametrize("patched, match", [
    (float("nan"), "patched is nan"), (torch.tensor([1.0, float("nan"), float("inf")]), "patched holds 2 NaN or infinite"),
    ([1.0, 2.0], "patched is list, not a number"), (np.array([1.0, 2.0]), "patched has shape \\[2\\]")])
def test_a_patched_value_that_is_not_finite_numbers_is_refused(patched, match):
    with pytest.raises(MechkitError, match=match):
        normalized_recovery(patched, 3.0, -1.0)


@pytest.mark.parametrize("clean, corrupted", [(2.0, 2.0), (torch.tensor(2.0), 2), (1.0, 1.0 + 1e-9), (np.float32(0.5), 0.5)])
def test_clean_equal_to_corrupted_is_still_refused(clean, corrupted):
    with pytest.raises(MechkitError, match="the clean and corrupted runs give the same metric") as err:
        normalized_recovery(torch.tensor([1.0]), clean, corrupted)
    assert "choose a corruption that changes the answer" in str(err.value)


def test_a_gap_just_over_the_threshold_is_measured():
    got = normalized_recovery(1.0 + 1e-5, 1.0 + 2e-5, 1.0)
    assert math.isclose(got, 0.5, rel_tol=1e-3)


# --- a patch grid's holes (a pruned layer's missing heads) against a metric that is not finite ---

def test_a_grids_holes_stay_holes_and_its_cells_are_recovered():
    from mechkit.patching import PatchScan

    values = torch.tensor([[3.0, 1.0, float("nan")], [2.0, float("nan"), float("nan")]])
    rec = PatchScan("attn.hook_z", "head", values, clean=3.0, corrupted=-1.0, direction="denoising").recovery
    assert torch.equal(rec.isnan(), values.isnan())
    assert rec[~values.isnan()].tolist() == [1.0, 0.5, 0.75]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_metric_that_is_not_finite_on_a_patched_row_is_refused(bad):
    import mechkit as mk
    from mechkit.patching import scan

    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("the cat sat")

    def metric(logits):
        out = logits[:, 5] - logits[:, 7]
        out[0] = bad
        return out

    with pytest.raises(MechkitError, match=r"scan: the metric gave NaN or inf on 1 of \d+ patched row"):
        scan(m, ids, ids, "hook_resid_pre", metric)
