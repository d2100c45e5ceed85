"""Red-team pass 12 (a), issue 32: the failures this pass found, each fixed in general.

- class 1: a folder a user made under a name mechkit once wrote as a file (``report.html``, a stale plot)
  was deleted, with all it held, by the next ``--force`` (the manifest now records which names are folders);
- forward inputs: ``return_dict``, which transformers reads, was refused as a misspelling; ``cache_position``
  and ``head_mask`` (real arguments, not read by this transformers) were refused with "check the spelling";
- a model directory whose config says ``"return_dict": false`` failed with a raw AttributeError in every
  analysis (transformers' own head read its base model's tuple by name).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.io.replace import MANIFEST, replacing_dir

FAMILIES = ["llama", "gpt2", "gemma2", "qwen2"]


# --- class 1: never delete what is not ours ------------------------------------------------------------------

def _first_set(out: Path) -> None:
    with replacing_dir(out, writer="tester") as tmp:
        (tmp / "plot.png").write_bytes(b"png")
        (tmp / "report.json").write_text("{}")
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text("{}")


def test_manifest_records_folders(tmp_path):
    out = tmp_path / "d"
    _first_set(out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["dirs"] == ["model"]
    with replacing_dir(out, writer="tester", force=True) as tmp:  # mechkit's own folder is replaced as before
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text('{"new": 1}')
    assert json.loads((out / "model" / "config.json").read_text()) == {"new": 1}
    assert not (out / "plot.png").exists()  # the stale file of the old set went with it


@pytest.mark.parametrize("rewrite", [True, False], ids=["name-rewritten", "name-stale"])
def test_user_folder_under_a_file_name_mechkit_wrote_is_kept(tmp_path, rewrite):
    out = tmp_path / "d"
    _first_set(out)
    (out / "plot.png").unlink()
    (out / "plot.png").mkdir()
    (out / "plot.png" / "mine.txt").write_text("precious")
    with pytest.raises(mk.MechkitError, match="holds a folder plot.png, which mechkit did not write"), \
            replacing_dir(out, writer="tester", force=True) as tmp:
        (tmp / "report.json").write_text("{}")
        if rewrite:
            (tmp / "plot.png").write_bytes(b"new")
    assert (out / "plot.png" / "mine.txt").read_text() == "precious"
    assert (out / "report.json").read_text() == "{}"


def test_legacy_manifest_without_folder_list(tmp_path):
    """A manifest written before the folder list: a saved model's folder is still mechkit's, any other is not."""
    out = tmp_path / "d"
    _first_set(out)
    (out / "plot.png").unlink()
    (out / "plot.png").mkdir()
    (out / "plot.png" / "mine.txt").write_text("precious")
    (out / MANIFEST).write_text(json.dumps({"writer": "tester", "files": [MANIFEST, "model", "plot.png", "report.json"]}))
    with pytest.raises(mk.MechkitError, match="folder plot.png"), replacing_dir(out, writer="tester", force=True) as tmp:
        (tmp / "report.json").write_text("{}")
    assert (out / "plot.png" / "mine.txt").read_text() == "precious"
    (out / "plot.png" / "mine.txt").unlink()
    (out / "plot.png").rmdir()
    with replacing_dir(out, writer="tester", force=True) as tmp:  # the model folder alone: replaced as ours
        (tmp / "report.json").write_text('{"v": 2}')
    assert not (out / "model").exists() and json.loads((out / "report.json").read_text()) == {"v": 2}


def test_cli_force_keeps_a_user_folder_named_report_html(tmp_path):
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "mechkit.cli.main", "inspect", "--model", "tiny:llama", "--out", "d"]
    assert subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True).returncode == 0
    html = tmp_path / "d" / "report.html"
    html.unlink()
    html.mkdir()
    (html / "mine.txt").write_text("precious")
    done = subprocess.run([*cmd, "--force"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "holds a folder report.html" in done.stderr and "Traceback" not in done.stderr
    assert (html / "mine.txt").read_text() == "precious"


# --- forward inputs: no over-refusal of what transformers reads, and the right fix for what it does not ---------

@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    m = mk.load_model(f"tiny:{request.param}")
    return m, m.to_tokens(["hello", "hi"])


def test_return_dict_is_read_not_refused(tiny):
    m, ids = tiny
    base = m(ids)
    as_tuple = m.forward(ids, return_dict=False, use_cache=False)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], base)
    assert torch.equal(m.forward(ids, return_dict=True, use_cache=False).logits, base)
    assert torch.equal(m(ids, return_dict=False), base)  # m(ids) returns the logits in either form
    assert torch.equal(m(ids, return_dict=True), base)


@pytest.mark.parametrize("name", ["cache_position", "head_mask"])
def test_unread_transformers_argument_names_the_right_fix(tiny, name):
    m, ids = tiny
    value = torch.arange(ids.shape[1]) if name == "cache_position" else None
    with pytest.raises(mk.MechkitError) as err:
        m(ids, **{name: value})
    assert f"does not read {name}" in str(err.value) and "spelling" not in str(err.value)


def test_misspelling_still_refused(tiny):
    m, ids = tiny
    with pytest.raises(mk.MechkitError, match="check the spelling"):
        m(ids, atention_mask=torch.ones_like(ids))


def test_token_type_ids_read_where_the_model_has_them():
    m = mk.load_model("tiny:gpt2")
    ids = m.to_tokens("hello")
    assert m(ids, token_type_ids=torch.zeros_like(ids)).shape[:2] == ids.shape
    llama = mk.load_model("tiny:llama")
    with pytest.raises(mk.MechkitError, match="no token type embeddings"):
        llama(llama.to_tokens("hello"), token_type_ids=torch.zeros_like(ids))


def test_config_return_dict_false_loads_and_runs(tmp_path):
    m = mk.load_model("tiny:llama")
    m.model.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["return_dict"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = mk.load_model(str(tmp_path))
    ids = m.to_tokens("hello")
    assert torch.allclose(again(ids), m(ids))
    logits, cache = mk.run_with_cache(again, ids, "blocks.0.hook_resid_post")
    assert torch.allclose(logits, m(ids)) and "blocks.0.hook_resid_post" in cache
    assert isinstance(again.forward(ids, return_dict=False, use_cache=False), tuple)  # asked for: still a tuple


# --- checks.integrity.refuse_special_files: only the files a load opens ----------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX file system")
def test_a_fifo_the_load_never_opens_is_not_refused(tmp_path):
    m = mk.load_model("tiny:llama")
    m.model.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    os.mkfifo(tmp_path / "notes.txt")  # a user's pipe beside the weights: never read
    ids = m.to_tokens("hello")
    assert torch.allclose(mk.load_model(str(tmp_path))(ids), m(ids))
    os.mkfifo(tmp_path / "merges.txt")  # a tokenizer's file as a FIFO: still refused, not a hang
    with pytest.raises(mk.MechkitError, match="merges.txt is not a regular file"):
        mk.load_model(str(tmp_path))


# --- forward_args.refuse_ignored_kwargs inside mechkit's own pattern hooks --------------------------------------

def test_output_attentions_on_an_eager_model_inside_pattern_hooks():
    """mechkit's pattern hooks rename the attention kernel ``mechkit_eager``: an eager model's attentions, which
    transformers returns, were refused there as if the model ran SDPA."""
    m = mk.load_model("tiny:gemma2")
    ids = m.to_tokens("hello")
    plain = m.forward(ids, output_attentions=True, use_cache=False).attentions
    with mk.hooks(m, {"blocks.0.attn.hook_pattern": lambda pattern, hook: None}):
        hooked = m.forward(ids, output_attentions=True, use_cache=False).attentions
    assert len(hooked) == len(plain) and all(torch.allclose(a, b) for a, b in zip(hooked, plain, strict=True))
    sdpa = mk.load_model("tiny:llama")
    with mk.hooks(sdpa, {"blocks.0.attn.hook_pattern": lambda pattern, hook: None}), \
            pytest.raises(mk.MechkitError, match="under sdpa attention"):  # named as the user knows it
        sdpa.forward(sdpa.to_tokens("hello"), output_attentions=True)


# --- hooking: a hook function that cannot take (act, hook) ----------------------------------------------------

@pytest.mark.parametrize("fn", [lambda act: None, lambda: None, lambda act, hook, extra: None])
def test_a_hook_function_of_the_wrong_arity_is_one_line(fn):
    m = mk.load_model("tiny:llama")
    with pytest.raises(mk.MechkitError, match=r"cannot be called as fn\(act, hook\)"), \
            mk.hooks(m, {"blocks.0.hook_resid_post": fn}):
        m(m.to_tokens("hi"))


@pytest.mark.parametrize("fn", [lambda act, hook: None, lambda act, hook=None, extra=1: None, lambda *args: None,
                                lambda act, *rest: None])
def test_hook_functions_that_take_act_and_hook_still_run(fn):
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("hi")
    with mk.hooks(m, {"blocks.0.hook_resid_post": fn}):
        assert torch.equal(m(ids), mk.load_model("tiny:llama")(ids))
