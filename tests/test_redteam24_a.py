"""Red-team pass 24, helper A's failures, each fixed in general.

In ``$TMPDIR`` (every user's), ``cache clear leftovers`` deleted another user's hidden folder and lock file
beside a prepared folder's name, and rolled back their journal; it deleted the live prepared model of a
``prune --save-model`` in another pid namespace (nothing held its lock between the save and the report's move),
which then died in a raw FileNotFoundError. ``Cache.completion`` completed a forward recorded with
``logits_to_keep=1`` inside a hook at another position from the unhooked model, and a batch whose second row
had its own positions from the first row's; its refusal of forwards of different lengths named a fix (padding)
that is refused in turn.

Another user is played by ``chown`` where the tests run as root (the red team's setting), else by a
``geteuid`` that answers another uid.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import temp_dir_in

DEAD = 999999  # no such process
NAME = f"mechkit-pruned-{DEAD}-0a1b2c3d"
MODEL = {"model.safetensors": "w" * 100, "config.json": "{}"}


def _folder(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _foreign(monkeypatch, *paths: Path) -> None:
    """Make ``paths`` another user's: theirs by chown as root, else this user's seen as another's."""
    if os.geteuid() == 0:
        for path in paths:
            for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
                os.lchown(p, 1000, 1000)
    else:
        uid = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: uid)


def _leftovers_listed(root: Path) -> bool:
    from mechkit.io.disk_cache import LEFTOVERS, list_cache

    return LEFTOVERS in [e.name for e in list_cache(root)]


def _clear(root: Path) -> None:
    from mechkit.io.disk_cache import LEFTOVERS, clear_cache

    clear_cache([LEFTOVERS], root=root)


# P1: only this user's, provably mechkit's, dead entries in $TMPDIR are touched -------------------------------

@pytest.mark.parametrize("entry", [
    f".{NAME}.tmp-{DEAD}-0a1b2c3d",  # a hidden folder beside a prepared name, with a saved model's files
    f".{NAME}.old-{DEAD}-0a1b2c3d",
    f".{NAME}.mechkit-lock",
    f".{NAME}.mechkit-replace",
    NAME,
])
def test_another_users_entries_in_tmpdir_are_neither_listed_nor_removed(tmp_path, monkeypatch, entry):
    where = temp_dir_in(tmp_path, monkeypatch)
    path = where / entry
    if entry.endswith(("-lock", "-replace")):
        path.write_text("1\n" if entry.endswith("-lock") else '{"names": []}')
    else:
        _folder(path, MODEL)
    _foreign(monkeypatch, path)
    assert not _leftovers_listed(tmp_path / "cache")
    _clear(tmp_path / "cache")
    assert path.exists()


@pytest.mark.parametrize("entry,files", [
    (f".{NAME}.tmp-{DEAD}-0a1b2c3d", {"thesis.tex": "mine"}),  # not a saved model's files
    (f".{NAME}.old-{DEAD}-0a1b2c3d", {"model.safetensors": "w", "notes.txt": "mine"}),
    (".mechkit-pruned-abc.tmp-999999-0a1b2c3d", {"thesis.tex": "mine"}),  # the red team's: no name mechkit gives
    (".mechkit-pruned-abc.tmp-999999-0a1b2c3d", MODEL),
    (".mechkit-pruned-my-notes.mechkit-lock", None),
])
def test_this_users_entries_that_are_not_provably_mechkits_are_kept(tmp_path, monkeypatch, entry, files):
    where = temp_dir_in(tmp_path, monkeypatch)
    path = where / entry
    if files is None:
        path.write_text("1\n")
    else:
        _folder(path, files)
    assert not _leftovers_listed(tmp_path / "cache")
    _clear(tmp_path / "cache")
    assert path.exists()
    if files:
        assert sorted(p.name for p in path.iterdir()) == sorted(files)


def test_entries_beside_another_users_prepared_folder_are_kept(tmp_path, monkeypatch):
    """The hidden folder is this user's, but the prepared folder it belongs to is not."""
    from mechkit.io.leftovers import stale_prepared

    where = temp_dir_in(tmp_path, monkeypatch)
    if os.geteuid() != 0:
        pytest.skip("needs two owners at once (root's chown)")
    theirs = _folder(where / NAME, MODEL)
    _foreign(monkeypatch, theirs)
    beside = _folder(where / f".{NAME}.tmp-{DEAD}-11111111", MODEL)
    assert stale_prepared(where) == []
    _clear(tmp_path / "cache")
    assert beside.exists() and theirs.exists()


def test_this_users_dead_prepared_entries_are_still_cleared(tmp_path, monkeypatch):
    where = temp_dir_in(tmp_path, monkeypatch)
    folder = _folder(where / NAME, MODEL)
    beside = _folder(where / f".{NAME}.tmp-{DEAD}-11111111", MODEL)
    lock = where / f".{NAME}.mechkit-lock"
    lock.write_text("1\n")
    assert _leftovers_listed(tmp_path / "cache")
    _clear(tmp_path / "cache")
    assert not folder.exists() and not beside.exists() and not lock.exists()


# P2: a prepared folder is held by its run until the report moved it ------------------------------------------

def _hold_in_child(path: Path) -> subprocess.Popen:
    """Another process (as one in another pid namespace would be) holding ``path``'s flock."""
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


@pytest.mark.parametrize("beside", [None, f".{NAME}.tmp-{DEAD}-11111111", f".{NAME}.old-{DEAD}-22222222"])
def test_a_prepared_folder_held_by_another_namespaces_run_is_live(tmp_path, monkeypatch, beside):
    from mechkit.io.leftovers import make_prepared_dir, stale_prepared

    where = temp_dir_in(tmp_path, monkeypatch)
    folder = _folder(where / NAME, MODEL)  # its pid is another namespace's: not one this process sees
    extra = _folder(where / beside, MODEL) if beside else None
    child = _hold_in_child(folder)
    try:
        assert stale_prepared(where) == []
        assert not _leftovers_listed(tmp_path / "cache")
        _clear(tmp_path / "cache")
        make_prepared_dir()  # the next save cleans first
        assert folder.exists() and (extra is None or extra.exists())
    finally:
        child.kill()
        child.wait()
    assert folder in stale_prepared(where)  # its run gone: stale


def test_a_saved_prepared_folder_stays_held_until_the_report_moved_it(tmp_path, monkeypatch):
    from mechkit.io.leftovers import stale_prepared
    from mechkit.pruning import study as study_mod
    from mechkit.report.writer import move_prepared

    where = temp_dir_in(tmp_path, monkeypatch)

    def save(_pruned, out):
        for name, text in MODEL.items():
            (Path(out) / name).write_text(text)
        return Path(out)

    monkeypatch.setattr(study_mod, "save_pruned", save)
    self = type("S", (), {"pruned": lambda self, row: None})()
    made = study_mod.PruneStudy.save(self, {})
    seen = where / NAME  # as a host sees a run in another pid namespace: a pid it does not know
    made.rename(seen)
    assert stale_prepared(where) == []
    _clear(tmp_path / "cache")
    assert (seen / "model.safetensors").exists()
    seen.rename(made)
    move_prepared(made, tmp_path / "model")
    moved = tmp_path / "model"
    assert (moved / "model.safetensors").exists()
    back = where / NAME
    moved.rename(back)  # the lock was let go: once moved, the folder is no longer the run's
    assert stale_prepared(where) == [back]


def test_a_prepared_folder_that_failed_to_save_is_removed_and_let_go(tmp_path, monkeypatch):
    from mechkit.pruning import study as study_mod

    where = temp_dir_in(tmp_path, monkeypatch)

    def fail(_pruned, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(study_mod, "save_pruned", fail)
    self = type("S", (), {"pruned": lambda self, row: None})()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError):
            study_mod.PruneStudy.save(self, {})
    assert list(where.iterdir()) == [] and len(os.listdir("/proc/self/fd")) == before  # no lock left open


@pytest.mark.parametrize("cross_device", [False, True])
def test_a_prepared_folder_removed_before_its_move_is_one_line_and_no_report(tmp_path, monkeypatch, cross_device):
    from mechkit.io.leftovers import make_prepared_dir
    from mechkit.report import build_report, write_report

    temp_dir_in(tmp_path, monkeypatch)
    src = make_prepared_dir()
    (src / "model.safetensors").write_text("w")
    shutil.rmtree(src)  # a tmp cleaner
    if cross_device:  # $TMPDIR on another file system: the copy found nothing and wrote an empty model/
        real = os.rename

        def rename(a, b, *args, **kwargs):
            if Path(a) == src:
                raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
            return real(a, b, *args, **kwargs)

        monkeypatch.setattr(os, "rename", rename)
    out = tmp_path / "run"
    with pytest.raises(MechkitError, match=f"{src.name}.*removed") as err:
        write_report(out, build_report(plugin="prune", plugin_version="0.1", model={"spec": "tiny:llama"}, params={},
                                       seed=0, results={}, artifacts=[], timings={"run_s": 0.1}), files={"model": src})
    assert "TMPDIR" in err.value.fix
    assert not out.exists()


# P3: a forward whose logits were cut is marked at every position ----------------------------------------------

def _zero_at(position: int):
    def fn(x, *_args, **_kwargs):
        x = x.clone()
        x[:, position] = 0
        return x

    return fn


@pytest.mark.parametrize("spec,point,position,keep", [
    ("tiny:llama", "blocks.1.hook_mlp_out", 0, 1),  # the red team's
    ("tiny:llama", "blocks.1.hook_attn_out", 2, 1),
    ("tiny:llama", "blocks.1.hook_mlp_out", 1, 2),
    ("tiny:gpt2", "blocks.1.hook_attn_out", 0, 2),
])
def test_a_completion_of_a_cut_forward_recorded_in_hooks_is_refused(spec, point, position, keep):
    m = mk.load_model(spec)
    ids = m.to_tokens("hello there general kenobi")
    with mk.hooks(m, {point: _zero_at(position)}):
        with torch.no_grad(), mk.record(m, [point]) as cache:
            m(ids, logits_to_keep=keep)
        inside = cache.completion(["blocks.1.hook_resid_post"])  # inside the same hooks: completed
    with torch.no_grad(), mk.hooks(m, {point: _zero_at(position)}), mk.record(m, "blocks.1.hook_resid_post") as full:
        m(ids)
    assert torch.allclose(inside["blocks.1.hook_resid_post"], full["blocks.1.hook_resid_post"], atol=1e-5)
    with pytest.raises(MechkitError, match="other logits"):
        cache.completion(["blocks.1.hook_resid_post"])


def test_a_cut_forward_recorded_without_hooks_still_completes():
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("hello there general kenobi")
    with torch.no_grad(), mk.record(m, "blocks.0.hook_resid_post") as cache:
        m(ids, logits_to_keep=1)
    _, full = mk.run_with_cache(m, ids, "blocks.1.hook_resid_post")
    done = cache.completion("blocks.1.hook_resid_post")
    assert torch.allclose(done["blocks.1.hook_resid_post"], full["blocks.1.hook_resid_post"], atol=1e-5)


# P4: every row's positions are checked ------------------------------------------------------------------------

@pytest.mark.parametrize("rows,shifted,by", [(2, 1, 7), (3, 2, 100), (3, 1, 1)])
def test_a_batch_whose_later_row_sets_its_own_positions_is_not_completed(rows, shifted, by):
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("hello there general kenobi").repeat(rows, 1)
    positions = torch.arange(ids.shape[1]).repeat(rows, 1)
    positions[shifted] += by
    with torch.no_grad(), mk.record(m, "blocks.0.hook_resid_post") as cache:
        m(ids, position_ids=positions)
    with pytest.raises(MechkitError, match="set their own positions"):
        cache.completion("blocks.1.attn.hook_k")


def test_positions_of_zero_to_n_in_every_row_still_complete():
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("hello there general kenobi").repeat(2, 1)
    with torch.no_grad(), mk.record(m, "blocks.0.hook_resid_post") as cache:
        m(ids, position_ids=torch.arange(ids.shape[1]).repeat(2, 1))
    assert "blocks.1.attn.hook_k" in cache.completion("blocks.1.attn.hook_k")


# P5: the refusal of forwards of different lengths names a fix that works ---------------------------------------

@pytest.mark.parametrize("how", ["completion", "to_transformer_lens"])
def test_completing_forwards_of_different_lengths_names_a_fix_that_works(how):
    m = mk.load_model("tiny:llama")
    with torch.no_grad(), mk.record(m, "blocks.0.hook_resid_post") as cache:
        m(m.to_tokens("hi"))
        m(m.to_tokens("hello there general kenobi"))
    with pytest.raises(MechkitError, match="different lengths") as err:
        cache.completion("blocks.1.hook_resid_post") if how == "completion" else cache.to_transformer_lens()
    assert "pad" not in err.value.fix and "own mk.record" in err.value.fix


def test_reading_forwards_of_different_lengths_names_no_padding():
    m = mk.load_model("tiny:llama")
    with torch.no_grad(), mk.record(m, "blocks.0.hook_resid_post") as cache:
        m(m.to_tokens("hi"))
        m(m.to_tokens("hello there"))
    with pytest.raises(MechkitError, match="different shapes") as err:
        cache["blocks.0.hook_resid_post"]
    assert "pad" not in err.value.fix and "own mk.record" in err.value.fix
