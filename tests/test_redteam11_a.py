"""Red-team pass 11 (a): classes 1, 3, 6, 10 and the API's forward inputs (issue 32).

Each test is one failure class found by the pass, with several instances: a hook's replacement without
values or not dense, forward arguments the model as loaded ignores or that point outside the tokens, a
complex gradient metric, a user's folder of folders in the cache's runs/, and a model directory whose
files are FIFOs.
"""

from __future__ import annotations

import os

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.disk_cache import mark_run_dir


def _ids(handle):
    return handle.to_tokens("hello world")


# ---- a hook's replacement must have values and be a plain dense tensor -----------------------------------
REPLACEMENTS = {
    "meta": (lambda a: torch.empty_like(a, device="meta"), "meta device"),
    "sparse": (lambda a: a.to_sparse(), "sparse_coo tensor"),
    "mkldnn": (lambda a: a.to_mkldnn(), "mkldnn tensor"),
}


@pytest.mark.parametrize("name", list(REPLACEMENTS))
def test_a_replacement_without_values_or_not_dense_is_one_line(llama, name):
    make, says = REPLACEMENTS[name]
    ids = _ids(llama)
    before = llama(ids)
    with pytest.raises(MechkitError, match=says), mk.hooks(llama, {"blocks.0.hook_resid_post": lambda a, *r: make(a)}):
        llama(ids)
    with pytest.raises(MechkitError, match=says), mk.pattern_hooks(llama, {0: [lambda p, *r: make(p)]}):
        llama(ids)
    assert torch.equal(llama(ids), before)  # the hooks are gone: the model is as it was


def test_dense_replacements_of_other_kinds_still_run(llama):
    ids = _ids(llama)
    for make in (lambda a: a.double(), lambda a: a.mean(-1, keepdim=True).expand_as(a), lambda a: a.to(torch.float8_e4m3fn)):
        with mk.hooks(llama, {"blocks.0.hook_resid_post": lambda a, *r, make=make: make(a)}):
            assert torch.isfinite(llama(ids)).all()


# ---- forward arguments the model as loaded would ignore, or positions outside the tokens --------------------
@pytest.mark.parametrize("keep", [torch.tensor([100]), torch.tensor([-100]), torch.tensor([0, 11])])
def test_logits_to_keep_positions_outside_the_tokens_are_one_line(llama, keep):
    ids = _ids(llama)
    assert ids.shape[1] == 11
    with pytest.raises(MechkitError, match="outside the 11 tokens"):
        llama(ids, logits_to_keep=keep)


def test_logits_to_keep_positions_inside_the_tokens_run(llama):
    ids = _ids(llama)
    assert llama(ids, logits_to_keep=torch.tensor([-1, 0, 10])).shape[1] == 3


IGNORED = {
    "output_attentions under sdpa": (lambda m, ids: m.forward(ids, output_attentions=True), "no attention weights"),
    "packed sequences": (lambda m, ids: m(ids, cu_seq_lens_q=torch.tensor([0, 3, 11]),
                                          cu_seq_lens_k=torch.tensor([0, 3, 11])), "packed sequences"),
    "seq_idx": (lambda m, ids: m(ids, seq_idx=torch.zeros_like(ids, dtype=torch.int32)), "packed sequences"),
    "router logits without experts": (lambda m, ids: m.forward(ids, output_router_logits=True), "no experts"),
    "num_items_in_batch without labels": (lambda m, ids: m(ids, num_items_in_batch=torch.tensor(5)), "no labels"),
    "hidden states from the logits-only call": (lambda m, ids: m(ids, output_hidden_states=True), "logits only"),
}


@pytest.mark.parametrize("name", list(IGNORED))
def test_an_argument_the_model_would_ignore_is_one_line(llama, name):
    call, says = IGNORED[name]
    with pytest.raises(MechkitError, match=says):
        call(llama, _ids(llama))


def test_cross_attention_inputs_to_a_decoder_only_model_are_one_line(gpt2):
    ids = _ids(gpt2)
    with pytest.raises(MechkitError, match="cross-attention"):
        gpt2(ids, encoder_hidden_states=torch.zeros(1, 3, 64))


def test_the_arguments_the_model_reads_still_work(llama):
    ids = _ids(llama)
    assert len(llama.forward(ids, output_hidden_states=True).hidden_states) == llama.n_layers + 1
    assert llama.forward(ids, labels=ids, num_items_in_batch=torch.tensor(5)).loss is not None
    assert llama(ids, output_attentions=False).shape[1] == ids.shape[1]


# ---- a gradient metric must be a real number ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_complex_metric_is_one_line(llama, dtype):
    with pytest.raises(MechkitError, match="a real one"):
        mk.gradients(llama, "blocks.0.hook_resid_post", _ids(llama), lambda logits: logits.sum().to(dtype))


# ---- cache clear keeps a user's hash-named folder of folders -----------------------------------------------
@pytest.mark.parametrize("names", [["runs"], ["--all"], ["runs/0123456789abcdef"]])
def test_cache_clear_keeps_a_users_folder_of_folders_in_runs(tmp_path, monkeypatch, names):
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    mine = tmp_path / "runs" / "0123456789abcdef"
    (mine / "data" / "raw").mkdir(parents=True)
    (mine / "data" / "raw" / "notes.csv").write_text("precious")
    steps = tmp_path / "runs" / "fedcba9876543210"  # a run's steps, with select-tasks' nested checkpoints
    (steps / "finetunes" / "ft-0123456789abcdef").mkdir(parents=True)
    mark_run_dir(steps)  # as a run makes it
    (steps / "finetunes" / "ft-0123456789abcdef" / "checkpoint.safetensors").write_bytes(b"x")
    (steps / "0123456789abcdef.json").write_text('{"key": "k", "value": 1}')
    CliRunner().invoke(cli, ["cache", "clear", *names])
    assert (mine / "data" / "raw" / "notes.csv").read_text() == "precious"
    assert not steps.exists() or names[0].startswith("runs/")


# ---- a model directory whose files are FIFOs: one line, never a hang ---------------------------------------
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_a_fifo_in_a_model_directory_is_one_line_not_a_hang(tmp_path, llama, name):
    from mechkit.taskarith.extract import weight_files

    model_dir = tmp_path / "m"
    llama.model.save_pretrained(model_dir)
    llama.tokenizer.save_pretrained(model_dir)
    (model_dir / name).unlink(missing_ok=True)
    os.mkfifo(model_dir / name)
    with pytest.raises(MechkitError, match=f"{name} is not a regular file"):
        mk.load_model(str(model_dir))
    with pytest.raises(MechkitError, match=f"{name} is not a regular file"):
        weight_files(model_dir)


def test_a_link_to_a_regular_weights_file_still_loads(tmp_path, llama):
    model_dir, store = tmp_path / "m", tmp_path / "blobs"
    llama.model.save_pretrained(model_dir)
    llama.tokenizer.save_pretrained(model_dir)
    store.mkdir()
    os.replace(model_dir / "model.safetensors", store / "weights")
    (model_dir / "model.safetensors").symlink_to(store / "weights")  # as the hub cache lays a model out
    assert mk.load_model(str(model_dir)).n_layers == llama.n_layers


def test_a_gguf_path_that_is_a_fifo_is_named_as_such(tmp_path):
    from mechkit.model.sources.gguf import cached_gguf

    os.mkfifo(tmp_path / "m.gguf")
    for load in (lambda: mk.load_model(str(tmp_path / "m.gguf")), lambda: cached_gguf(tmp_path / "m.gguf")):
        with pytest.raises(MechkitError, match="not a regular file"):
            load()
