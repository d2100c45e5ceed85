"""Red-team pass 16 (helper a): a bind mount of a directory of the same file system as ``--out`` (missed by
``os.path.ismount``: its own lock, then a raw EXDEV at the last rename); the Cache mapping's edges (``in
values()``, an empty ``popitem``, an unhashable name stored, ``fromkeys``, parts that are no batch, pickling a
recording of an nnsight model); normalized_recovery's edges (a meta, complex or bool tensor, a float16 grid
against a large corrupted metric, a gap that overflows); `cache clear` of the unmarked folders `cache list`
names (issue 32, classes 1, 3, 8 and 10)."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.hooking.cache import Cache, NotRecorded
from mechkit.patching.answers import normalized_recovery

RESID = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def two_forwards(llama):
    with mk.record(llama, RESID) as cache:
        llama(llama.to_tokens("hello"))
        llama(llama.to_tokens("world"))
    return cache


# --- class 3/10: a bind mount is a mount point -------------------------------------------------------------


def _mountinfo(tmp_path: Path, *points: str) -> Path:
    info = tmp_path / "mountinfo"
    lines = [f"4{i} 27 254:0 /src {p} rw,relatime - ext4 /dev/vda rw" for i, p in enumerate(points)]
    info.write_text("\n".join(lines) + "\n")
    return info


def test_a_bind_mount_of_the_same_file_system_is_refused_as_out(tmp_path, monkeypatch):
    from mechkit.io import out as out_mod
    from mechkit.io import read as read_mod

    bound, spaced = tmp_path / "bound", tmp_path / "a volume"
    bound.mkdir()
    spaced.mkdir()
    (bound / "report.json").write_text("{}")  # a run there before: --force would move it across the mount
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(_mountinfo(tmp_path, str(bound), str(spaced).replace(" ", "\\040"))))
    monkeypatch.setattr(out_mod, "is_mount_point", lambda path: None)  # where fdinfo is not shown: the list decides
    for out in (bound, spaced, tmp_path / "x" / ".." / "bound"):
        with pytest.raises(MechkitError, match="mount point") as err:
            out_mod.check_out(out, force=True)
        assert "inside it" in err.value.fix
    assert out_mod.check_out(bound / "run") == bound / "run"  # a directory inside the mount is fine
    assert (bound / "report.json").read_text() == "{}"


def test_no_mountinfo_leaves_the_check_to_ismount(tmp_path, monkeypatch):
    from mechkit.io import out as out_mod
    from mechkit.io import read as read_mod

    monkeypatch.setattr(read_mod, "MOUNTINFO", str(tmp_path / "absent"))
    assert out_mod.mount_points() == frozenset()
    assert out_mod.check_out(tmp_path / "run") == tmp_path / "run"


def test_a_rename_across_a_mount_is_one_line():
    import errno

    from mechkit.io.fs_errors import describe

    for code in (errno.EXDEV, errno.EBUSY):
        line = describe(OSError(code, os.strerror(code), "/data/out/report.json"))
        assert isinstance(line, MechkitError) and "mount" in str(line) and "/data/out/report.json" in str(line)


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="a bind mount needs root on Linux")
def test_a_real_bind_mount_is_refused_before_the_model_loads(tmp_path):
    src, bound = tmp_path / "src", tmp_path / "bound"
    src.mkdir()
    bound.mkdir()
    (src / "keep.txt").write_text("mine")
    if subprocess.run(["mount", "--bind", str(src), str(bound)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not permitted here (a container without CAP_SYS_ADMIN)")
    try:
        with pytest.raises(MechkitError, match="mount point"):
            mk.run("inspect", model="tiny:llama", out=str(bound), force=True)
        assert (src / "keep.txt").read_text() == "mine"
    finally:
        subprocess.run(["umount", str(bound)], check=False)


# --- class 8: the Cache mapping -----------------------------------------------------------------------------


def test_a_joined_tensor_is_found_in_values(two_forwards):
    joined = two_forwards[RESID]
    assert joined in two_forwards.values()  # a new tensor each read: compared, not found by identity
    assert joined + 1 not in two_forwards.values()
    assert "text" not in two_forwards.values()


def test_popping_an_empty_cache_is_one_line_and_still_a_key_error():
    with pytest.raises(NotRecorded, match="empty") as err:
        Cache().popitem()
    assert isinstance(err.value, KeyError)


def test_an_unhashable_name_is_refused_when_stored_as_when_read(two_forwards):
    cache = two_forwards.copy()
    for store in (lambda: cache.__setitem__(["a"], 1), lambda: cache.append(["a"], torch.zeros(1, 2))):
        with pytest.raises(MechkitError, match="hook names"):
            store()
    assert list(cache) == [RESID]


def test_fromkeys_builds_a_cache_as_a_dict_did():
    made = Cache.fromkeys(["a", "b"], torch.zeros(1, 2))
    assert isinstance(made, Cache) and list(made) == ["a", "b"] and made["b"].shape == (1, 2)


@pytest.mark.parametrize("parts", [[torch.zeros(2, 3), 5], [torch.zeros(()), torch.zeros(())], [None, None]])
def test_parts_without_a_batch_dimension_are_one_line(parts):
    cache = Cache()
    for part in parts:
        cache.append("a", part)
    with pytest.raises(MechkitError, match="batch"):
        cache["a"]
    with pytest.raises(MechkitError, match="batch"):
        cache == cache.copy()  # noqa: B015 - the comparison reads the joined value
    assert "2 parts" in repr(cache)


def test_values_whose_equality_is_no_single_answer_compare_unequal():
    import numpy as np

    assert Cache({"a": np.zeros(3)}) != Cache({"a": np.ones(3)})


def test_pickling_a_recording_of_an_nnsight_model_is_one_line(llama):
    pytest.importorskip("nnsight")
    m = mk.load_model("tiny:llama", backend="nnsight")
    _, cache = mk.run_with_cache(m, m.to_tokens("a b"), RESID)
    with pytest.raises(MechkitError, match="nnsight") as err:
        pickle.dumps(cache)
    assert "dict(cache)" in err.value.fix
    assert pickle.loads(pickle.dumps(dict(cache)))[RESID].shape == cache[RESID].shape
    _, native = mk.run_with_cache(llama, llama.to_tokens("a b"), RESID)
    assert torch.equal(pickle.loads(pickle.dumps(native))[RESID], native[RESID])  # a native one still pickles
    assert copy.deepcopy(cache)[RESID].shape == cache[RESID].shape  # a deep copy refers to the model


# --- class 8: normalized_recovery ---------------------------------------------------------------------------


@pytest.mark.parametrize("clean", [torch.empty(1, device="meta"), torch.tensor(True), torch.tensor(1 + 1j)])
def test_clean_that_is_no_real_number_is_one_line(clean):
    with pytest.raises(MechkitError, match="not a number"):
        normalized_recovery(1.0, clean, 0.0)


@pytest.mark.parametrize("patched", [torch.tensor([True, False]), torch.tensor([1 + 1j]),
                                     torch.empty(2, device="meta")])
def test_patched_that_is_no_real_numbers_is_one_line(patched):
    with pytest.raises(MechkitError, match="not real numbers"):
        normalized_recovery(patched, 2.0, 0.0)


def test_a_half_precision_grid_against_large_metrics_is_not_inf():
    got = normalized_recovery(torch.tensor([1.0, -1e4], dtype=torch.float16), 1e5, -1e5)
    assert got.dtype == torch.float16 and bool(torch.isfinite(got).all())
    assert got.float().tolist() == pytest.approx([0.500005, 0.45], rel=1e-3)


def test_a_gap_that_overflows_is_refused():
    with pytest.raises(MechkitError, match="overflows"):
        normalized_recovery(1.0, 1e308, -1e308)
    assert normalized_recovery(2.0, clean=3.0, corrupted=-1.0) == 0.75  # the ordinary case is untouched


# --- classes 1/10: `cache clear` of the folders `cache list` shows as not mechkit's -------------------------


def test_clearing_an_unmarked_folder_says_how_to_remove_it(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import FOREIGN, clear_cache, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    old = tmp_path / "runs" / "0123456789abcdef"
    old.mkdir(parents=True)
    (old / "step.json").write_text("{}")
    assert [e.name for e in list_cache(tmp_path)] == [FOREIGN]
    for name in (FOREIGN, "runs/0123456789abcdef", "0123456789abcdef"):
        with pytest.raises(MechkitError, match="did not mark") as err:
            clear_cache([name], root=tmp_path)
        assert f"rm -r {old}" in err.value.fix
    with pytest.raises(MechkitError, match="no cache entry named"):  # a name that is nothing at all
        clear_cache(["runs/fedcba9876543210"], root=tmp_path)
    assert (old / "step.json").read_text() == "{}"
