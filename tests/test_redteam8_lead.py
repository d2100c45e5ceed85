"""Issue 32, what pass 7 left open (fixed by the lead before confirming pass 8): each class in general.

- class 1/3: a kill between a task vector and its ``NAME.json`` left the old ``.json`` describing the new
  vector; a file writer did not see that another run was writing the directory it writes into;
- class 10: a pid-tagged temporary directory was judged stale by its pid before the target's lock was
  looked at (a live writer in another pid namespace); ``ulimit -f``'s fix named TMPDIR or another --out;
- class 8: unknown keyword arguments of a forward were silently ignored (``mk.gradients(..., foo=1)``);
- class 11: ``--seg-len`` larger than the vocabulary named the Python argument and an exclusion nobody set;
- class 2: a tensor in two files of a sharded directory, with other values, was silently not used;
- class 5: a ``--from`` detect report under another dtype was blamed on "another model"; a scheduler
  ignored the dtype and device its latency costs were measured in;
- class 4: ``compose --models``' step keys left out train mode and the device;
- class 9: pruning a layer-pruned model recorded the first pruned model as the dense one.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.sources.tiny import tiny_model
from tests.conftest import file_size_limit


def _vector(scale: float = 1.0):
    from mechkit.taskarith.vector import TaskVector

    return TaskVector({"w": torch.full((3,), scale)}, {"tasks": ["x"], "ops": [], "base": {}})


# ---- class 1/3: a task vector and its .json; a file inside a directory another run writes ------------------

def test_a_kill_between_the_vector_and_its_json_leaves_no_stale_json(tmp_path, monkeypatch):
    from mechkit.taskarith import vector as module
    from mechkit.taskarith.vector import TaskVector

    out = tmp_path / "v.safetensors"
    _vector(1.0).save(out)
    assert json.loads((tmp_path / "v.safetensors.json").read_text())["n_tensors"] == 1

    def killed(*_a, **_k):
        raise KeyboardInterrupt  # the process dies after the vector was renamed into place

    monkeypatch.setattr(module, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        TaskVector({"w": torch.full((3,), 2.0), "b": torch.ones(2)}, {"tasks": ["y"], "ops": [], "base": {}}).save(out)
    assert TaskVector.load(out).meta["tasks"] == ["y"]  # the new vector is whole
    assert not (tmp_path / "v.safetensors.json").exists()  # and no .json says it is the old one


def _hold_lock(path, ready):
    """A child process holding ``path``'s run lock until killed."""
    code = textwrap.dedent(f"""
        import time, pathlib
        from mechkit.io.outlock import out_lock
        with out_lock({str(path)!r}):
            pathlib.Path({str(ready)!r}).write_text("held")
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(600):
        if ready.exists():
            return proc
        import time

        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the child never took the lock")


def test_a_file_inside_a_directory_another_run_writes_is_refused(tmp_path):
    from mechkit.io.outlock import OutInUseError

    run = tmp_path / "ft"
    proc = _hold_lock(run, tmp_path / "ready")
    try:
        with pytest.raises(OutInUseError, match=r"is inside .*ft, which another mechkit run is writing \(pid \d+\)"):
            _vector().save(run / "v.safetensors")
        with pytest.raises(OutInUseError, match="inside"):
            _vector().save(run / "deeper" / "v.safetensors")
        assert not (run / "v.safetensors").exists() and not (run / "deeper").exists()
    finally:
        proc.kill()
        proc.wait()
    assert _vector().save(run / "v.safetensors").is_file()  # the run ended: the place is free


def test_a_file_inside_a_directory_this_process_writes_is_no_conflict(tmp_path):
    from mechkit.io.outlock import out_lock

    with out_lock(tmp_path / "run"):
        assert _vector().save(tmp_path / "run" / "model" / "v.safetensors").is_file()
        with out_lock(tmp_path / "run" / "model"):
            pass


def test_a_sibling_or_an_unrelated_lock_file_is_no_conflict(tmp_path):
    (tmp_path / ".ft.mechkit-lock").write_text("123\n")  # a killed run's lock file: nobody holds it
    assert _vector().save(tmp_path / "ft" / "v.safetensors").is_file()
    proc = _hold_lock(tmp_path / "other", tmp_path / "ready")
    try:
        assert _vector().save(tmp_path / "ft" / "w.safetensors").is_file()
    finally:
        proc.kill()
        proc.wait()


# ---- class 10: a live writer's temporary directory; a file-size limit ---------------------------------------

def test_a_temp_dir_with_a_dead_looking_pid_is_kept_while_its_target_is_locked(tmp_path):
    """A writer in another pid namespace: its pid means nothing here, its lock does."""
    from mechkit.io.leftovers import clean_leftovers, stale_leftovers

    proc = _hold_lock(tmp_path / "run", tmp_path / "ready")  # it cleans what its own name left before: first
    tmp = tmp_path / ".run.tmp-999999999-0123abcd"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"x")
    try:
        assert tmp not in stale_leftovers(tmp_path)
        clean_leftovers(tmp_path)
        assert (tmp / "model.safetensors").exists()
    finally:
        proc.kill()
        proc.wait()
    assert tmp in stale_leftovers(tmp_path)  # the lock is free and the pid is dead: a leftover


def test_a_file_size_limit_names_the_limit_not_another_place(tmp_path):
    from mechkit.io.fs_errors import describe
    from mechkit.taskarith.finetune import refuse_temp_write

    err = OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(tmp_path / "model.safetensors"))
    with file_size_limit(1 << 20):
        line = describe(err)
        assert "ulimit -f unlimited" in line.fix and "1048576 bytes" in line.fix and "--out" not in line.fix
        with pytest.raises(MechkitError) as temp:
            refuse_temp_write(err, tmp_path)
        assert "ulimit -f unlimited" in temp.value.fix and "TMPDIR" not in temp.value.fix
    line = describe(err)  # no limit: the file system's own maximum file size
    assert "ulimit" not in line.fix and "--out" in line.fix
    with pytest.raises(MechkitError) as temp:
        refuse_temp_write(err, tmp_path)
    assert "TMPDIR" in temp.value.fix


# ---- class 8: a forward's keyword arguments -----------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda m, ids: mk.gradients(m, "blocks.0.attn.hook_z", ids, lambda logits: logits.sum(), foo=1),
    lambda m, ids: m(ids, atention_mask=torch.ones_like(ids)),
    lambda m, ids: m.forward(ids, past_key_value=None),
    lambda m, ids: mk.run_with_cache(m, ids)[0] if m(ids, output_attention=True) is None else None,
])
def test_an_unknown_forward_argument_is_refused_not_ignored(llama, call):
    ids = llama.to_tokens("hello world")
    with pytest.raises(MechkitError, match="forward takes no argument") as err:
        call(llama, ids)
    assert "attention_mask" in err.value.fix


def test_the_forward_arguments_models_take_still_work(llama):
    ids = llama.to_tokens("hello world")
    mask = torch.ones_like(ids)
    assert torch.equal(llama(ids, attention_mask=mask), llama(ids))
    assert llama(ids, logits_to_keep=1).shape[1] == 1
    assert llama.forward(ids, output_hidden_states=True).hidden_states is not None  # transformers' shared kwargs
    value, grads = mk.gradients(llama, "blocks.0.hook_resid_post", ids, lambda logits: logits.sum(), attention_mask=mask)
    assert grads["blocks.0.hook_resid_post"][1].shape == grads["blocks.0.hook_resid_post"][0].shape
    gpt2 = mk.load_model("tiny:gpt2")
    g_ids = gpt2.to_tokens("hi")
    assert gpt2(g_ids, token_type_ids=torch.zeros_like(g_ids)).shape[-1] == gpt2.n_vocab_rows()
    with pytest.raises(MechkitError, match="GPT2LMHeadModel's forward takes no argument bogus"):
        gpt2(g_ids, bogus=1)


def test_ids_changed_in_place_after_a_check_are_checked_again(llama):
    ids = llama.to_tokens("hello world")
    llama(ids)
    ids[0, 1] = 10**6  # the same tensor object, written in place
    with pytest.raises(MechkitError, match="token id 1000000 is outside"):
        llama(ids)
    view = llama.to_tokens("abc")
    llama(view)
    view[:, :1].fill_(-3)  # through a view: the version counter is shared
    with pytest.raises(MechkitError, match="token id -3"):
        llama(view)


# ---- class 11: --seg-len past the vocabulary --------------------------------------------------------------

def test_a_segment_longer_than_the_vocabulary_names_the_option_and_the_largest_value(tmp_path, capsys, monkeypatch):
    from mechkit.cli.main import main

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as code:
        main(["detect", "--model", "tiny:llama", "--seg-len", "5000", "--out", str(tmp_path / "d")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code.value.code == 2 and "--seg-len" in line and "to 256 or less" in line, line
    assert "exclude" not in line and not (tmp_path / "d").exists()
    with pytest.raises(MechkitError, match=r"to 256 or less"):
        mk.run("detect", model="tiny:llama", write=False, seg_len=5000)


# ---- class 2: a tensor in two files of a sharded directory --------------------------------------------------

@pytest.mark.parametrize("where", ["model-00001-of-00002.safetensors", "model-00003-of-00003.safetensors"])
def test_a_tensor_with_other_values_in_another_file_is_refused(sharded, where):
    """In the other shard (an older export's) or in a stray file the index does not name."""
    from safetensors.torch import load_file, save_file

    d, tensors, names = sharded
    key = names[-1]  # the index maps it to the second shard
    path = d / where
    extra = load_file(path) if path.exists() else {}
    save_file({**extra, key: tensors[key] + 1}, path, metadata={"format": "pt"})
    with pytest.raises(MechkitError, match=rf"tensor {key} is in model-00002-of-00002.safetensors.*other values in "
                                           rf"{where}") as err:
        mk.load_model(str(d))
    assert f"remove {where}" in err.value.fix


def test_identical_copies_and_other_files_load(sharded):
    from safetensors.torch import save_file

    d, tensors, names = sharded
    before = mk.load_model(str(d))
    save_file({names[-1]: tensors[names[-1]].clone()}, d / "model-00003-of-00003.safetensors", metadata={"format": "pt"})
    save_file({"layers.0.attention.wq.weight": torch.ones(2)}, d / "consolidated.safetensors", metadata={"format": "pt"})
    ids = before.to_tokens("abc")
    assert torch.equal(mk.load_model(str(d))(ids), before(ids))


# ---- class 5: artifacts under another dtype or device ------------------------------------------------------

def test_a_detect_report_under_another_dtype_says_so_and_names_the_dtype(llama):
    from mechkit.heads.scores import load_scores

    report = {"model": {"spec": "tiny:llama", "weights_sha256": "0" * 64, "dtype": "bfloat16"},
              "results": {"scores": {}}}
    with pytest.raises(MechkitError, match="with the model in bfloat16, and this run has it in float32") as err:
        load_scores(llama, report, 4, 5, 0)
    assert "--dtype bfloat16" in err.value.fix
    report["model"]["dtype"] = "float32"  # the same dtype: then it is another model's weights
    with pytest.raises(MechkitError, match="not of this model"):
        load_scores(llama, report, 4, 5, 0)


def test_a_detect_report_is_reused_under_its_own_dtype(tmp_path):
    run = mk.run("detect", model="tiny:llama", out=tmp_path / "d", dtype="bfloat16", n_seqs=2, seg_len=5)
    again = mk.run("ablate", model="tiny:llama", dtype="bfloat16", write=False, heads="induction", top_k=2,
                   from_report=str(run.out_dir), tasks="capitalize", n=2, shots=1, baseline_seeds=0)
    assert again.report["model"]["dtype"] == "bfloat16" and again.results["conditions"]
    with pytest.raises(MechkitError, match="in bfloat16, and this run has it in float32"):
        mk.run("ablate", model="tiny:llama", write=False, heads="induction", top_k=2,
               from_report=str(run.out_dir), tasks="capitalize", n=2, shots=1, baseline_seeds=0)


def test_a_scheduler_is_refused_in_another_dtype_naming_it(llama):
    from mechkit.adapt.scheduler import Scheduler, structure_identity

    recorded = structure_identity(llama)
    assert (recorded["dtype"], recorded["device"]) == ("float32", "cpu")
    sched = Scheduler.__new__(Scheduler)
    sched.model = {**recorded, "dtype": "bfloat16"}
    with pytest.raises(MechkitError, match="measured with the model on dtype bfloat16, and this model is on float32") as err:
        sched.check_model(llama)
    assert "--dtype float32" in err.value.fix
    sched.model = {k: v for k, v in recorded.items() if k not in ("dtype", "device")}  # a file from before: accepted
    sched.check_model(llama)
    sched.model = {**recorded, "device": "cuda"}
    with pytest.raises(MechkitError, match="--device cpu"):
        sched.check_model(llama)


# ---- class 4: the step keys of the other models of a run ---------------------------------------------------

def test_the_identity_tag_covers_train_mode(llama):
    from mechkit.model.checks.identity import identity_tag, model_key

    before = identity_tag(llama)
    llama.model.model.layers[0].train()
    try:
        assert identity_tag(llama) != before
        assert "model.layers.0" in model_key(llama)["train_mode"]
    finally:
        llama.model.eval()
    assert identity_tag(llama) == before


# ---- class 9: a model pruned twice records the dense model ----------------------------------------------------

def test_pruning_a_layer_pruned_model_records_the_dense_model(tmp_path):
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    model, tok = tiny_model("llama", num_hidden_layers=4)
    model.save_pretrained(tmp_path / "dense")
    tok.save_pretrained(tmp_path / "dense")
    dense = mk.load_model(str(tmp_path / "dense"))
    save_pruned(prune_copy(dense, UnitsToRemove(layers=[1])), tmp_path / "p1")
    first = mk.load_model(str(tmp_path / "p1"))
    twice = prune_copy(first, UnitsToRemove(heads={2: [0, 1]}, layers=[0]))  # first model's blocks 2 and 0
    save_pruned(twice, tmp_path / "p2")
    config = json.loads((tmp_path / "p2" / "config.json").read_text())
    structure = config["mechkit_pruning"]
    assert structure["n_layers"] == 4 and config["num_hidden_layers"] == 4  # the dense model's count
    assert structure["layers_removed"] == [0, 1] and set(structure["head_keep"]) == {"3"}  # dense numbering
    again = mk.load_model(str(tmp_path / "p2"))
    ids = again.to_tokens("hello")
    assert again.anatomy.n_layers == 2 and again.anatomy.head_counts == (4, 2)
    assert torch.equal(again(ids), twice(ids))


# ---- class 11: prune options that --budget would ignore ------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--budget", "0.9", "--budget-unit", "flops", "--sparsity", "0.3"], "--sparsity and --budget were both given"),
    (["--budget-unit", "flops"], "--budget-unit flops without --budget"),
])
def test_prune_refuses_options_its_budget_search_would_ignore(tmp_path, capsys, monkeypatch, args, words):
    from mechkit.cli.main import main

    monkeypatch.setattr(mk, "load_model", lambda *a, **k: pytest.fail("checked after the model loaded"))
    with pytest.raises(SystemExit) as code:
        main(["prune", "--model", "tiny:llama", *args, "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code.value.code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "p").exists()


# ---- after pass 8: what the helpers left --------------------------------------------------------------------

def test_show_attention_refuses_top_k_for_heads_named_one_by_one(llama):
    with pytest.raises(MechkitError, match="top_k= picks among ranked or random heads.*each head to show"):
        mk.show_attention(llama, "hello hello", heads="0.1", top_k=3)
    assert len(mk.show_attention(llama, "hello hello", heads="random", top_k=2).patterns.heads) == 2
    run = mk.run("attention", model=llama, write=False, heads="0.1,1.2", prompt="ab ab")  # the plugin's own top_k
    assert [(h["layer"], h["head"]) for h in run.results["heads"]] == [(0, 1), (1, 2)]


def test_decoding_past_a_learned_position_table_is_one_line():
    from mechkit.model.compat import cache_kwargs, cache_of

    gpt2 = mk.load_model("tiny:gpt2")
    cache = cache_of(gpt2.forward(torch.randint(3, 250, (1, 510)), use_cache=True))
    assert gpt2.forward(torch.randint(3, 250, (1, 2)), use_cache=True, **cache_kwargs(cache)).logits.shape[1] == 2
    with pytest.raises(MechkitError, match=r"3 tokens after the 512 cached are more than the model's 512 positions"):
        gpt2.forward(torch.randint(3, 250, (1, 3)), use_cache=True, **cache_kwargs(cache))


def test_a_fifo_named_as_a_task_vector_is_not_said_to_be_missing(tmp_path):
    from mechkit.taskarith.vector import TaskVector

    os.mkfifo(tmp_path / "v.safetensors")
    with pytest.raises(MechkitError, match="is not a regular file, so not a task vector"):
        TaskVector.load(tmp_path / "v.safetensors")
    with pytest.raises(MechkitError, match="task vector not found"):
        TaskVector.load(tmp_path / "w.safetensors")


def test_one_tensor_of_other_weights_tells_the_bases_apart_across_dtypes(llama):
    """A model whose blocks were renumbered (layers pruned) differs only after the gap: any tensor counts."""
    from mechkit.taskarith.probe import probes_differ, weights_probe

    ours = weights_probe(llama.model.named_parameters())
    assert probes_differ(ours, weights_probe((n, p.bfloat16()) for n, p in llama.model.named_parameters())) is False
    moved = dict(ours)
    name = next(n for n in moved if ".layers.1." in n)
    moved[name] = [v + 1.0 for v in moved[name]]
    assert probes_differ(ours, moved) is True


def test_a_mask_changed_in_place_after_a_check_is_checked_again(llama):
    ids = llama.to_tokens("hello world")
    mask = torch.ones_like(ids)
    assert torch.equal(llama(ids, attention_mask=mask), llama(ids, attention_mask=mask))  # the second: remembered
    mask[0, 0] = 2
    with pytest.raises(MechkitError, match="neither 0 nor 1"):
        llama(ids, attention_mask=mask)


def test_a_users_dated_backup_beside_out_is_not_a_leftover(tmp_path, monkeypatch):
    """``.r10.old-20251127/``: 8 hex digits, exactly mechkit's old set-aside name; its names now hold a pid."""
    from mechkit.io.leftovers import clean_leftovers

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    backup = tmp_path / ".r10.old-20251127"
    backup.mkdir()
    (backup / "notes.txt").write_text("mine")
    aside = tmp_path / ".r10.old-999999999-0123abcd"  # a killed mechkit writer's, pid gone
    aside.mkdir()
    mk.run("inspect", model="tiny:llama", out=tmp_path / "r10", seq_len=8)
    assert (backup / "notes.txt").read_text() == "mine" and not aside.exists()
    clean_leftovers(tmp_path)
    assert backup.exists()


@pytest.mark.parametrize("make", [
    lambda m: mk.edit_weights(m), lambda m: mk.hooks(m, {}), lambda m: mk.record(m, "blocks.0.hook_resid_post"),
    lambda m: mk.ablate(m, heads="0.1"), lambda m: mk.enable_grad(), lambda m: mk.pattern_hooks(m, {}),
])
def test_entering_a_used_api_context_again_is_one_line(llama, make):
    """contextlib raised ``AttributeError: '_GeneratorContextManager' object has no attribute 'args'`` (pass 9b)."""
    ctx = make(llama)
    with ctx:
        pass
    with pytest.raises(MechkitError, match="context was entered already") as err:
        ctx.__enter__()  # a second `with ctx:`
    assert "again for a new one" in err.value.fix
    with make(llama):  # a new one works
        pass


def test_a_replaced_builtin_is_not_the_models_code(llama):
    """Ray's driver replaces ``builtins.print`` (log deduplication): a module's ``__builtins__`` is not what the
    forward runs, and a run must not be refused for it (make test-latest's Ray test was, after pass 9b)."""
    import builtins

    from mechkit.model.checks.code import changed_code, code_state

    before = code_state(llama.model)
    original = builtins.print
    builtins.print = lambda *a, **k: original(*a, **k)
    try:
        assert changed_code(before, code_state(llama.model)) is None
    finally:
        builtins.print = original
    import torch.nn.functional as F

    silu = F.silu
    F.silu = lambda x, inplace=False: silu(x)
    try:
        assert "silu" in changed_code(before, code_state(llama.model))
    finally:
        F.silu = silu
