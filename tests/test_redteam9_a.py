"""Red-team pass 9 of issue 32, classes 1, 3, 6 and 10, and the forward inputs the Python API checks.

Each test holds one class of failure the pass found: a symlink or hard link at a lock file's name had the
lock write a pid over the user's file it leads to (a FIFO there was a traceback, a directory a wrong fix); a
journal naming any folder beside ``--out`` had the roll-back delete that folder whole, even from ``report
show``; a file writer inside a directory another run writes was refused only when it saved, after the work;
a crafted ``tokenizer.json`` or shard index in a fine-tuned directory was a traceback in ``taskvec extract``;
and forward inputs beside the ids (an additive or fractional ``attention_mask``, ``position_ids`` of floats or
another shape, a KV cache of another model or batch, ``labels``/``token_type_ids`` out of range,
``inputs_embeds``, a negative ``logits_to_keep``) ran silently wrong or failed deep inside the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError


# ---- class 1/3/10: whatever sits at a lock file's name is never written through ----------------------------
def _lock_name(tmp_path: Path) -> Path:
    return tmp_path / ".run.mechkit-lock"


@pytest.mark.parametrize("kind, says", [("symlink", "a symlink"), ("hardlink", "a hard link"),
                                        ("fifo", "not a regular file"), ("dir", "a directory"),
                                        ("big", "not a lock")])
def test_what_sits_at_a_lock_files_name_is_refused_and_kept(tmp_path, kind, says):
    from mechkit.io.outlock import out_lock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious, more than a pid")
    lock = _lock_name(tmp_path)
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "dir":
        lock.mkdir()
    else:
        lock.write_text("a user's notes under this odd name\n" * 3)
    with pytest.raises(MechkitError, match=f"{says}.*move .* away"), out_lock(tmp_path / "run"):
        pass
    assert victim.read_text() == "precious, more than a pid"
    assert os.path.lexists(lock)  # not ours: left where it was
    assert not (tmp_path / "run").exists()


def test_a_stale_lock_file_of_mechkits_own_is_still_taken_over(tmp_path):
    from mechkit.io.outlock import out_lock

    _lock_name(tmp_path).write_text("999999\n")  # a killed run's
    with out_lock(tmp_path / "run"):
        assert _lock_name(tmp_path).read_text().strip() == str(os.getpid())
    assert not _lock_name(tmp_path).exists()


def test_cache_clear_removes_only_lock_files_mechkit_made(tmp_path):
    from mechkit.io.leftovers import clean_leftovers

    (tmp_path / ".a.mechkit-lock").write_text("999999\n")  # a killed run's
    (tmp_path / ".b.mechkit-lock").write_text("a user's notes under this odd name\n" * 3)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".c.mechkit-lock").symlink_to(victim)
    removed = [p.name for p, _ in clean_leftovers(tmp_path)]
    assert removed == [".a.mechkit-lock"]
    assert (tmp_path / ".b.mechkit-lock").exists() and victim.read_text() == "precious"


# ---- class 1/6: a journal that names no temporary directory of mechkit's rolls nothing back ------------------
def _crafted(tmp_path: Path, tmp_name: str) -> tuple[Path, Path]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("code")
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (tmp_path / ".run.mechkit-replace").write_text(json.dumps({"tmp": tmp_name, "install": ["notes.txt"],
                                                                "remove": []}))
    return project, out


@pytest.mark.parametrize("tmp_name", ["project", ".project.tmp-1-0123abcd", ".run.tmp-x-0123abcd"])
def test_a_journal_naming_another_folder_deletes_nothing(tmp_path, tmp_name):
    from mechkit.io.outlock import settle_interrupted
    from mechkit.report.show import load_report

    project, out = _crafted(tmp_path, tmp_name)
    if tmp_name.startswith("."):
        (tmp_path / tmp_name).mkdir()
    for read in (lambda: settle_interrupted(out), lambda: load_report(out)):  # a read-only command too
        with pytest.raises(MechkitError, match="not a temporary directory mechkit makes.*delete"):
            read()
    assert (project / "main.py").read_text() == "code" and (out / "notes.txt").read_text() == "mine"


def test_a_journal_of_a_killed_mechkit_write_still_rolls_back(tmp_path):
    from mechkit.io.journal import recover

    out = tmp_path / "run"
    out.mkdir()
    (out / "report.json").write_text("new, half-installed")
    tmp = tmp_path / f".run.tmp-{os.getpid()}-0123abcd"
    (tmp / ".previous").mkdir(parents=True)
    (tmp / ".previous" / "report.json").write_text("old")
    (tmp_path / ".run.mechkit-replace").write_text(json.dumps({"tmp": tmp.name, "install": ["report.json"],
                                                                "remove": []}))
    assert recover(out)
    assert (out / "report.json").read_text() == "old" and not tmp.exists()


# ---- class 3: a file writer inside a directory another run writes is refused before the work ----------------
@pytest.fixture
def other_run_holds(tmp_path):
    """Another process holding the lock of ``tmp_path / "x"``, as a running ``finetune --out x`` does."""
    lock = tmp_path / ".x.mechkit-lock"
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield tmp_path / "x"
    proc.kill()
    proc.wait()


def test_an_out_another_run_writes_is_refused_by_the_first_check(other_run_holds):
    from mechkit.io import check_out
    from mechkit.io.outlock import OutInUseError

    x = other_run_holds
    with pytest.raises(OutInUseError, match=r"inside .*x, which another mechkit run is writing \(pid \d+\)"):
        check_out(x / "v.safetensors", kind="file")
    with pytest.raises(OutInUseError, match=r"in use by another mechkit run \(pid \d+\)"):
        check_out(x, kind="dir")
    check_out(x.parent / "y", kind="dir")  # a sibling is free


def test_taskvec_extract_into_a_running_runs_directory_never_loads_the_model(other_run_holds, monkeypatch):
    from tests.conftest import cli_in_process

    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded before the refusal")

    import mechkit.model
    from mechkit.model import loading

    monkeypatch.setattr(mechkit.model, "load_model", refuse)
    monkeypatch.setattr(loading, "load_model", refuse)
    ft = other_run_holds.parent / "ft"
    ft.mkdir()
    (ft / "config.json").write_text("{}")
    start = time.monotonic()
    result = cli_in_process("taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft),
                            "--out", str(other_run_holds / "v.safetensors"))
    assert result.returncode != 0 and "another mechkit run is writing" in result.stderr
    assert time.monotonic() - start < 30


def test_fresh_run_directories_skip_a_name_another_run_holds(other_run_holds):
    from mechkit.io.outlock import locked_fresh_dir

    with locked_fresh_dir(other_run_holds) as got:
        assert got.name == "x-2"


# ---- class 10: crafted files in a fine-tuned directory are one line ----------------------------------------
@pytest.mark.parametrize("text", [b"\xff\xfe{}", b"[1, 2]", b'{"model": {"vocab": [1]}}',
                                  b'{"model": {}, "added_tokens": [{"content": 5}]}'])
def test_a_crafted_tokenizer_json_is_one_line(tmp_path, text):
    from mechkit.taskarith.extract import vocab_of

    (tmp_path / "tokenizer.json").write_bytes(text)
    with pytest.raises(MechkitError, match="tokenizer"):
        vocab_of(tmp_path)


@pytest.mark.parametrize("text", [b"\xff", b"[]", b'{"weight_map": 5}', b'{"weight_map": {}}',
                                  b'{"weight_map": {"a": "../other/model.safetensors"}}'])
def test_a_crafted_shard_index_is_one_line(tmp_path, text):
    from mechkit.taskarith.extract import weight_files

    (tmp_path / "model.safetensors.index.json").write_bytes(text)
    with pytest.raises(MechkitError, match="index"):
        weight_files(tmp_path)


# ---- the API's forward inputs beside the ids -----------------------------------------------------------------
def _ids(handle):
    return handle.to_tokens("hello world")


BAD = {
    "additive mask": (lambda ids: {"attention_mask": torch.zeros(ids.shape).index_fill(1, torch.tensor([0]), float("-inf"))},
                      "additive mask"),
    "mask of halves": (lambda ids: {"attention_mask": torch.full(ids.shape, 0.5)}, "neither 0 nor 1"),
    "mask of twos": (lambda ids: {"attention_mask": torch.full_like(ids, 2)}, "neither 0 nor 1"),
    "mask of nan": (lambda ids: {"attention_mask": torch.full(ids.shape, float("nan"))}, "neither 0 nor 1"),
    "3-D mask": (lambda ids: {"attention_mask": torch.ones(1, 1, ids.shape[1])}, "3 dimensions"),
    "4-D mask too small": (lambda ids: {"attention_mask": torch.ones(1, 1, 3, 3, dtype=torch.bool)}, "4-D"),
    "meta mask": (lambda ids: {"attention_mask": torch.ones(ids.shape, device="meta")}, "meta device"),
    "float positions": (lambda ids: {"position_ids": torch.arange(ids.shape[1]).float()[None]}, "must be integers"),
    "list positions": (lambda ids: {"position_ids": list(range(ids.shape[1]))}, "must be a tensor"),
    "short positions": (lambda ids: {"position_ids": torch.arange(3)[None]}, "have shape"),
    "positions of two rows": (lambda ids: {"position_ids": torch.arange(ids.shape[1])[None].repeat(2, 1)}, "have shape"),
    "3-D positions": (lambda ids: {"position_ids": torch.arange(ids.shape[1])[None, None]}, "have shape"),
    "labels too short": (lambda ids: {"labels": torch.zeros(1, 2, dtype=torch.long)}, "have shape"),
    "labels out of range": (lambda ids: {"labels": torch.full_like(ids, 10**6)}, "outside 0 to"),
    "inputs_embeds": (lambda ids: {"inputs_embeds": torch.zeros(1, ids.shape[1], 64)}, "inputs_embeds"),
    "negative logits_to_keep": (lambda ids: {"logits_to_keep": -1}, "0 or more"),
    "text logits_to_keep": (lambda ids: {"logits_to_keep": "a"}, "count of positions"),
    "cache of text": (lambda ids: {"past_key_values": "abc", "use_cache": True}, "transformers Cache"),
    "cache as tuples": (lambda ids: {"past_key_values": ((torch.zeros(1, 2, 3, 16),) * 2,) * 2}, "transformers Cache"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_odd_forward_inputs_are_one_line(llama, gpt2, name):
    make, says = BAD[name]
    for handle in (llama, gpt2):
        ids = _ids(handle)
        with pytest.raises(MechkitError, match=says):
            handle(ids, **make(ids))


def test_gpt2_token_types_outside_its_embedding_are_one_line(gpt2):
    ids = _ids(gpt2)
    for bad, says in ((torch.full_like(ids, 10**6), "outside 0 to 258"), (torch.zeros(ids.shape), "integers")):
        with pytest.raises(MechkitError, match=says):
            gpt2(ids, token_type_ids=bad)


def test_a_cache_of_another_model_or_batch_is_one_line(llama, gpt2):
    from mechkit.model.compat import cache_kwargs, cache_of

    ids = _ids(llama)
    other = cache_of(gpt2.forward(_ids(gpt2), use_cache=True))
    with pytest.raises(MechkitError, match="another model's cache"):
        llama.forward(ids[:, :1], **cache_kwargs(other), use_cache=True)
    own = cache_of(llama.forward(ids, use_cache=True))
    with pytest.raises(MechkitError, match="holds 1 sequences, and the token ids 3"):
        llama.forward(ids[:, :1].repeat(3, 1), **cache_kwargs(own), use_cache=True)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gpt_neox", "phi3"])
def test_every_models_own_cache_and_masks_still_run(family):
    from mechkit.model.compat import cache_kwargs, cache_of

    m = mk.load_model(f"tiny:{family}", device="cpu")
    ids = m.to_tokens("hello world")
    cache = cache_of(m.forward(ids, use_cache=True))
    step = m.forward(torch.tensor([[5]]), **cache_kwargs(cache), attention_mask=torch.ones(1, ids.shape[1] + 1),
                     use_cache=True)
    assert step.logits.shape[1] == 1
    pad = torch.ones_like(ids)
    pad[0, 0] = 0
    as_bool, as_float = m(ids, attention_mask=pad.bool()), m(ids, attention_mask=pad.float())
    assert torch.allclose(as_bool, as_float)


def test_the_legitimate_spellings_give_the_same_logits(llama, gpt2):
    for handle in (llama, gpt2):
        ids = _ids(handle)
        plain = handle(ids)
        rows = torch.arange(ids.shape[1])
        assert torch.allclose(handle(ids, position_ids=rows), plain, atol=1e-5)  # 1-D: one row
        assert torch.allclose(handle(ids, position_ids=rows[None]), plain, atol=1e-5)
        assert torch.allclose(handle(ids, use_cache=True), plain, atol=1e-5)  # the caller's use_cache is taken
        assert torch.allclose(handle(ids, attention_mask=torch.ones(ids.shape)), plain, atol=1e-5)
        n = ids.shape[1]
        causal = torch.ones(1, 1, n, n, dtype=torch.bool).tril()
        assert torch.allclose(handle(ids, attention_mask=causal), plain, atol=1e-5)
        labels = ids.clone()
        labels[0, 0] = -100  # skipped by the loss
        assert torch.allclose(handle(ids, labels=labels), plain, atol=1e-5)
        assert handle(ids, logits_to_keep=1).shape[1] == 1
