"""Red-team pass 8 of issue 32, classes 1, 3, 6 and 10, and the inputs the Python API checks.

Each test holds one class of failure the pass found: a file writer (``taskvec merge --force``, an activation
vector's or an attention page's ``save``) replacing the manifest that protects a run's set, a model's tokenizer
or a fine-tune's weights; ``cache clear --all`` deleting a user's ``.toy.old-mine`` in a ``$MECHKIT_CACHE``
that is a project folder; an ``--from`` FIFO hanging the run before any check (the resume key read it); a full
disk reported as "a file mechkit was writing" without the path; and forward inputs that reached torch
(a nested tensor, more tokens than GPT-2's 512 learned positions, ``position_ids`` outside them, an
``attention_mask`` of another shape or a list) as an IndexError or a RuntimeError.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError


# ---- the API's forward inputs ------------------------------------------------------------------------------
def test_nested_tensor_is_one_line(llama):
    nested = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])])
    with pytest.raises(MechkitError, match="nested tensor"):
        llama(nested)


def test_more_tokens_than_learned_positions_is_one_line(gpt2):
    n = gpt2.model.config.n_positions
    gpt2(torch.ones(1, n, dtype=torch.long))  # exactly the table: fine
    for call in (lambda ids: gpt2(ids), lambda ids: mk.run_with_cache(gpt2, ids)):
        with pytest.raises(MechkitError, match=f"more than the model's {n} positions"):
            call(torch.ones(1, n + 1, dtype=torch.long))


def test_rotary_models_have_no_position_limit(llama):
    from mechkit.model.checks.token_ids import position_rows

    assert position_rows(llama.model) is None  # RoPE: no table, so no refusal of long inputs


def test_position_ids_outside_the_table(gpt2):
    ids = torch.ones(1, 3, dtype=torch.long)
    for bad, shown in (([0, 1, 99_999], "99999"), ([-1, 0, 1], "-1")):
        with pytest.raises(MechkitError, match=f"position id {shown} is outside"):
            gpt2(ids, position_ids=torch.tensor([bad]))
    gpt2(ids, position_ids=torch.tensor([[0, 1, 2]]))


@pytest.mark.parametrize("mask, problem", [
    (torch.ones(1, 5, dtype=torch.long), "has shape"),
    (torch.ones(3, 3, dtype=torch.long), "has shape"),
    ([[1, 1, 1]], "must be a tensor"),
])
def test_attention_mask_of_another_shape(llama, gpt2, mask, problem):
    ids = torch.ones(2 if isinstance(mask, torch.Tensor) and mask.shape[0] == 3 else 1, 3, dtype=torch.long)
    for handle in (llama, gpt2):
        with pytest.raises(MechkitError, match=problem):
            handle(ids, attention_mask=mask)


def test_attention_mask_that_fits_still_runs(llama):
    from mechkit.model.compat import cache_kwargs, cache_of

    ids = torch.tensor([[5, 6, 7]])
    plain, masked = llama(ids), llama(ids, attention_mask=torch.ones_like(ids))
    assert torch.allclose(plain, masked)
    out = llama.forward(ids, use_cache=True)  # decoding step by step: the mask covers the cached tokens too
    step = llama.forward(torch.tensor([[8]]), **cache_kwargs(cache_of(out)), attention_mask=torch.ones(1, 4),
                         use_cache=True)
    assert step.logits.shape[1] == 1


# ---- class 6/10: an input file that is not a regular file ------------------------------------------------------
def test_resume_key_never_blocks_on_a_fifo_or_a_device(tmp_path):
    from mechkit.options.inputs import file_digest

    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(fifo=file_digest(fifo), zero=file_digest(Path("/dev/zero"))),
                              daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "file_digest blocked on a FIFO or read /dev/zero forever"
    assert result["fifo"] == result["zero"]  # both "not a regular file"
    plain = tmp_path / "v.json"
    plain.write_text("{}")
    assert file_digest(plain) != result["fifo"]


def test_from_fifo_is_refused_not_hung(tmp_path, capsys):
    from tests.test_reliability import _cli

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, lines = _cli(capsys, "ablate", "--model", "tiny:llama", "--from", str(fifo), "--out", str(tmp_path / "run"))
    assert code != 0 and "not a regular file" in lines[-1]


# ---- class 1: a file writer never replaces a model's file or a set's manifest --------------------------------
def _set_dir(root: Path) -> Path:
    """A directory as `taskvec apply` leaves it: a model, with the manifest naming its files."""
    d = root / "applied"
    d.mkdir()
    names = ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"]
    for n in names:
        (d / n).write_text("model file")
    (d / ".mechkit-files").write_text(json.dumps({"writer": "taskvec apply", "files": [*names, ".mechkit-files"]}))
    return d


def _hf_dir(root: Path) -> Path:
    """A model directory mechkit never wrote (a download): no manifest."""
    d = root / "hf"
    d.mkdir()
    for n in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (d / n).write_text("model file")
    (d / "notes.txt").write_text("mine")
    return d


def test_file_writers_never_replace_a_manifest_or_a_model_file(tmp_path):
    from mechkit.io.replace import refuse_foreign_file

    applied, hf = _set_dir(tmp_path), _hf_dir(tmp_path)
    for path in (applied / ".mechkit-files", applied / "tokenizer.json", hf / "tokenizer.json",
                 hf / "tokenizer_config.json", hf / "special_tokens_map.json", hf / "config.json",
                 hf / "model.safetensors"):
        with pytest.raises(MechkitError, match="would replace it"):
            refuse_foreign_file(path, "the task vector")
    refuse_foreign_file(hf / "notes.txt", "the task vector")  # the user's own note: --force may replace it
    (hf / "v.safetensors").write_text("vector")
    (hf / "v.safetensors.json").write_text("{}")
    refuse_foreign_file(hf / "v.safetensors", "the task vector")  # a task vector kept beside a model: rewritable
    refuse_foreign_file(hf / "v.safetensors.json", "the task vector")


def test_vector_out_over_the_manifest_is_refused(tmp_path):
    from mechkit.taskarith.vector import check_vector_out

    applied = _set_dir(tmp_path)
    for name in (".mechkit-files", "tokenizer.json", "generation_config.json"):
        with pytest.raises(MechkitError, match="would replace it"):
            check_vector_out(applied / name, force=True)  # what `taskvec merge/extract --force` checks first


def test_api_savers_refuse_a_model_file(tmp_path, llama):
    from mechkit.actvec.vector import ActivationVector

    applied, hf = _set_dir(tmp_path), _hf_dir(tmp_path)
    vector = ActivationVector(torch.ones(64), "fv", "capitalize", 0, "add")
    page = mk.show_attention(llama, "hello")
    for target in (applied / "model.safetensors", applied / ".mechkit-files", hf / "tokenizer.json"):
        before = target.read_bytes()
        for save in (vector.save, page.save):
            with pytest.raises(MechkitError, match="would replace it"):
                save(target)
        assert target.read_bytes() == before
    assert vector.save(tmp_path / "fv.safetensors").is_file()  # elsewhere: written
    assert page.save(tmp_path / "page.html").is_file()


# ---- class 1: cache clear deletes only what mechkit named ---------------------------------------------------
def test_cache_clear_all_keeps_a_users_dot_old_folders(tmp_path):
    from mechkit.io.disk_cache import clear_cache

    mine = [tmp_path / ".toy.old-mine", tmp_path / ".runs.old-notes", tmp_path / ".gguf.old-0123abcdef",
            tmp_path / ".toy.old-20251127"]  # a dated backup: 8 hex digits, but no pid
    for d in mine:
        d.mkdir()
        (d / "data.txt").write_text("precious")
    aside = tmp_path / ".toy.old-999999999-0123abcd"  # what remove_dir itself leaves when a clear is interrupted
    aside.mkdir()
    clear_cache(all_entries=True, root=tmp_path)
    assert all((d / "data.txt").read_text() == "precious" for d in mine)
    assert not aside.exists()


# ---- class 10: a full disk names the directory being written -------------------------------------------------
@pytest.mark.parametrize("existing", [False, True])
def test_full_disk_names_the_out_directory(tmp_path, existing):
    from mechkit.io.replace import replacing_dir

    out = tmp_path / "out"
    if existing:
        out.mkdir()
    with pytest.raises(OSError) as info, replacing_dir(out, writer="taskvec apply", force=True):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a write() on a full disk raises: no name
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])
