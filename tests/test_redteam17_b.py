"""Red-team pass 17 (b): the patching API's metric and layers checks, Cache mapping edge cases, the recovery's
overflow and the mount-point refusal's fix line (issue 32, classes 8 and 10)."""

from __future__ import annotations

import shlex

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.hooking.cache import Cache
from mechkit.patching import attribute_patching, denoise, logit_diff, noise, normalized_recovery, scan


@pytest.fixture(scope="module")
def m():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def prompts(m):
    return m.to_tokens("a b c d"), m.to_tokens("a b e d")


def _metric(logits):
    return logit_diff(logits, 5, 6)


@pytest.mark.parametrize("bad", [lambda lg: lg[:, 5].sum(), lambda lg: 1.0, lambda lg: lg[:, :2]],
                         ids=["0-dim", "float", "two-columns"])
@pytest.mark.parametrize("direction", [denoise, noise])
def test_directed_scan_refuses_a_metric_of_the_wrong_shape_in_one_line(m, prompts, bad, direction):
    # The two unpatched runs read metric(...)[0] raw: IndexError / TypeError / ValueError.
    with pytest.raises(MechkitError, match="the metric returned"):
        direction(m, *prompts, "hook_resid_pre", bad)


def test_directed_scan_names_the_unpatched_run_whose_metric_is_nan(m, prompts):
    with pytest.raises(MechkitError, match="unpatched run"):
        denoise(m, *prompts, "hook_resid_pre", lambda lg: lg[:, 5] * float("nan"))


@pytest.mark.parametrize("bad", [lambda lg: lg[:, 5] > 0, lambda lg: lg[:, 5].to(torch.complex64)],
                         ids=["bool", "complex"])
def test_scan_refuses_a_metric_of_no_real_numbers(m, prompts, bad):
    # A bool was read as 1.0, a complex lost its imaginary part with a mere warning.
    clean, corrupted = prompts
    with pytest.raises(MechkitError, match="not real numbers"):
        scan(m, corrupted, clean, "hook_resid_pre", bad)


@pytest.mark.parametrize("layers", ["0", "01", [0.0], [True], [-1], [5], []])
def test_scan_refuses_layers_that_are_no_layer_indices(m, prompts, layers):
    clean, corrupted = prompts
    with pytest.raises(MechkitError, match="layer"):
        scan(m, corrupted, clean, "hook_resid_pre", _metric, layers=layers)
    with pytest.raises(MechkitError, match="layer"):
        denoise(m, clean, corrupted, "hook_resid_pre", _metric, layers=layers)


def test_scan_takes_layers_as_one_integer_or_a_tensor(m, prompts):
    clean, corrupted = prompts
    whole = scan(m, corrupted, clean, "hook_resid_pre", _metric)
    assert torch.equal(scan(m, corrupted, clean, "hook_resid_pre", _metric, layers=1), whole[1:])
    assert torch.equal(scan(m, corrupted, clean, "hook_resid_pre", _metric, layers=torch.tensor([0, 1])), whole)


@pytest.mark.parametrize("bad", [lambda lg: 1.0, lambda lg: lg[:, 5] > 0], ids=["float", "bool"])
def test_attribute_patching_refuses_a_metric_that_is_no_real_tensor(m, prompts, bad):
    # A float raised AttributeError ('float' object has no attribute 'sum').
    with pytest.raises(MechkitError, match="the metric returned"):
        attribute_patching(m, *prompts, "hook_resid_pre", bad)


def test_patching_leaves_the_logits_as_they_were(m, prompts):
    clean, corrupted = prompts
    before = m(clean)
    with pytest.raises(MechkitError):
        denoise(m, clean, corrupted, "hook_resid_pre", lambda lg: 1.0)
    assert torch.equal(m(clean), before)


def test_cache_repr_takes_a_key_that_is_no_string():
    assert "1" in repr(Cache({1: torch.zeros(2, 3)}))  # TypeError: object of type 'int' has no len()


def test_cache_repr_does_not_name_a_join_that_reading_refuses():
    cache = Cache({"x": torch.zeros(1, 2)})
    cache.append("x", torch.zeros(1, 3))
    assert "cannot be joined" in repr(cache)  # it said [2, 2], the first part's shape
    with pytest.raises(MechkitError):
        cache["x"]


def test_cache_parts_on_different_devices_are_refused_in_one_line():
    cache = Cache({"x": torch.zeros(1, 2)})
    cache.append("x", torch.zeros(1, 2, device="meta"))
    with pytest.raises(MechkitError, match="different devices"):
        cache["x"]


@pytest.mark.parametrize(("patched", "clean"), [(torch.tensor([60000.0], dtype=torch.float16), 1e-3),
                                                (torch.tensor([3e38]), 1e-3), (1e308, 1e-3)],
                         ids=["float16", "float32", "python-float"])
def test_normalized_recovery_refuses_a_result_past_its_type(patched, clean):
    # It came out inf without a word.
    with pytest.raises(MechkitError, match="overflows"):
        normalized_recovery(patched, clean, 0.0)


def test_normalized_recovery_of_ordinary_values_is_unchanged():
    assert normalized_recovery(2.0, 3.0, -1.0) == 0.75
    half = normalized_recovery(torch.tensor([1.0, 3.0], dtype=torch.float16), 3.0, -1.0)
    assert half.dtype == torch.float16 and half.tolist() == [0.5, 1.0]


def test_mount_point_fix_line_quotes_a_path_with_a_space(tmp_path, monkeypatch):
    from mechkit.io import out

    where = tmp_path / "my runs"
    where.mkdir()
    monkeypatch.setattr(out, "is_mount_point", lambda path: path == where.resolve())
    with pytest.raises(MechkitError) as err:
        out.refuse_mount_point(where)
    assert f"--out {shlex.quote(str(where / 'run'))}" in str(err.value)
