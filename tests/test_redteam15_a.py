"""Red-team pass 15 (helper a): patching checks its source (another model's cache, a batch it cannot take, no
activation, no token ids) and a patch's indices; DLA refuses a cache of two runs; scan and attribute refuse
an answer position past the prompt, a batch of prompts and a metric of the wrong shape; a Cache pops,
compares and prints as a dict of its tensors; a recording made during generation or on padding is not
completed on its token ids alone; gradients of a metric that ignores the logits; a relative $XDG_CACHE_HOME
(issue 32, classes 8 and 10)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.patching import (
    Patch,
    attribute,
    direct_logit_attribution,
    dla_names,
    logit_diff,
    run_patched,
    scan,
)

RESID = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def gpt2():
    return mk.load_model("tiny:gpt2")


@pytest.fixture(scope="module")
def prompts(llama):
    clean, corrupt = llama.to_tokens("hello world"), llama.to_tokens("world hello")
    assert clean.shape == corrupt.shape
    return clean, corrupt


def metric(logits):
    return logit_diff(logits, 5, 6)


def test_another_models_cache_of_the_same_width_is_refused_as_a_patching_source(llama, gpt2, prompts):
    clean, corrupt = prompts
    ids = gpt2.to_tokens("hello world")[:, :clean.shape[1]]
    _, other = mk.run_with_cache(gpt2, ids, "blocks.*.hook_resid_pre")
    assert other["blocks.0.hook_resid_pre"].shape[-1] == llama.anatomy.d_model  # the same width: nothing failed
    for call in (lambda: run_patched(llama, corrupt, other, Patch("blocks.0.hook_resid_pre")),
                 lambda: scan(llama, corrupt, other, "hook_resid_pre", metric),
                 lambda: attribute(llama, corrupt, other, "hook_resid_pre", metric)):
        with pytest.raises(MechkitError, match="recorded on tiny:gpt2, not on tiny:llama"):
            call()


def test_a_source_whose_batch_the_target_cannot_take_is_refused(llama, prompts):
    clean, corrupt = prompts
    with pytest.raises(MechkitError, match="source has 3 rows .* the target 2"):
        run_patched(llama, torch.cat([corrupt] * 2), torch.cat([clean] * 3), Patch(RESID))
    one = run_patched(llama, torch.cat([corrupt] * 2), clean, Patch(RESID))  # one row for every target row
    assert torch.allclose(one[0], one[1])


@pytest.mark.parametrize("source, match", [(None, "not NoneType"), ([1, 2, 3], "not list"),
                                           ({RESID: [1, 2]}, "holds a list at"),
                                           ({RESID: torch.zeros(11, 64)}, r"holds shape \[11, 64\]")])
def test_a_source_that_is_no_recording_is_one_line(llama, prompts, source, match):
    with pytest.raises(MechkitError, match=match):
        run_patched(llama, prompts[1], source, Patch(RESID))


def test_a_plain_dict_of_another_layout_is_refused_at_the_point(llama, prompts):
    clean, corrupt = prompts
    _, cache = mk.run_with_cache(llama, clean, "blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]
    with pytest.raises(MechkitError, match="recorded on another model"):
        run_patched(llama, corrupt, {"blocks.0.attn.hook_z": z[..., :2, :]}, Patch("blocks.0.attn.hook_z"))


def test_a_target_that_is_no_tensor_is_one_line(llama, prompts):
    with pytest.raises(MechkitError, match="target must be token ids"):
        run_patched(llama, prompts[1].tolist(), prompts[0], Patch(RESID))


def test_patch_indices_are_integers(llama, prompts):
    clean, corrupt = prompts
    as_tensor = run_patched(llama, corrupt, clean, Patch(RESID, positions=torch.tensor([1, 2])))
    as_tuple = run_patched(llama, corrupt, clean, Patch(RESID, positions=(1, 2)))
    assert torch.equal(as_tensor, as_tuple)
    assert Patch(RESID, positions=np.array([1, 2])).positions == (1, 2)
    assert Patch(RESID, positions=3).positions == (3,)
    for bad in ((1.0,), (True,), "1", [[1]]):
        with pytest.raises(MechkitError, match="not a list of integers"):
            Patch("blocks.0.attn.hook_z", heads=bad)


def test_scan_and_attribute_refuse_an_answer_position_past_the_prompt(llama, prompts):
    clean, corrupt = prompts
    n = clean.shape[1]
    with pytest.raises(MechkitError, match=f"answer_pos={n + 1} is outside"):
        scan(llama, corrupt, clean, "hook_resid_pre", metric, answer_pos=n + 1)
    with pytest.raises(MechkitError, match=f"answer_pos={n + 1} is outside"):
        attribute(llama, corrupt, clean, "hook_resid_pre", metric, answer_pos=n + 1)
    with pytest.raises(MechkitError, match="answer_pos must be one integer"):
        mk.patching.denoise(llama, clean, corrupt, "hook_resid_pre", metric, answer_pos=1.5)


def test_scan_and_attribute_take_one_prompt(llama, prompts):
    clean, corrupt = prompts
    for call in (scan, lambda *a: attribute(*a)[0]):
        with pytest.raises(MechkitError, match=r"one prompt, \[1, pos\]"):
            call(llama, torch.cat([corrupt] * 2), clean, "hook_resid_pre", metric)


def test_scan_refuses_a_zero_batch_size_and_a_metric_of_one_number(llama, prompts):
    clean, corrupt = prompts
    with pytest.raises(MechkitError, match="batch_size=0 is not a positive integer"):
        scan(llama, corrupt, clean, "hook_resid_pre", metric, batch_size=0)
    with pytest.raises(MechkitError, match="metric returned shape"):
        scan(llama, corrupt, clean, "hook_resid_pre", lambda logits: logits.sum())


@pytest.fixture(scope="module")
def dla_cache(llama, prompts):
    return dict(mk.run_with_cache(llama, prompts[0], dla_names(llama))[1])


@pytest.mark.parametrize("edit, match", [
    (lambda c: {"blocks.0.hook_resid_pre": torch.cat([c["blocks.0.hook_resid_pre"]] * 2)}, "not of one run"),
    (lambda c: {"blocks.0.hook_resid_pre": c["blocks.0.hook_resid_pre"][:, :3]}, "not of one run"),
    (lambda c: {"blocks.0.attn.hook_z": c["blocks.0.attn.hook_z"][..., :2, :]}, "4 heads"),
    (lambda c: {"blocks.0.attn.hook_z": c["blocks.0.attn.hook_z"].flatten(-2)}, "4 heads")])
def test_dla_refuses_a_cache_that_is_not_of_one_run(llama, dla_cache, edit, match):
    with pytest.raises(MechkitError, match=match):
        direct_logit_attribution(llama, {**dla_cache, **edit(dla_cache)}, correct=5, wrong=6)
    assert direct_logit_attribution(llama, dla_cache, correct=5, wrong=6).total.shape == (1,)


def test_a_cache_pops_compares_and_prints_as_a_dict_of_its_tensors(llama, prompts):
    import copy

    with mk.record(llama, "blocks.*.hook_resid_post") as cache:
        llama(prompts[0])
        llama(prompts[1])
    assert cache == dict(cache) and cache == copy.deepcopy(cache)
    assert (cache != cache.copy()) is False
    other = cache.copy()
    other[RESID] = other[RESID] + 1
    assert cache != other
    name, value = cache.copy().popitem()
    assert name == "blocks.1.hook_resid_post" and isinstance(value, torch.Tensor) and value.shape[0] == 2
    kept = cache.copy()
    kept.setdefault("notes")
    kept["count"] = 3
    shown = repr(kept)
    assert "notes" in shown and "NoneType" in shown and "count" in shown and "[2, 11, 64] float32" in shown


def test_a_recording_made_while_generating_is_not_completed_on_its_ids_alone(llama):
    ids = llama.to_tokens("h")[:, :1]
    with mk.record(llama, "blocks.1.hook_resid_post") as cache:
        llama.model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert len(cache.inputs) == 2  # a prompt of one token and one step: two [1, 1] forwards
    with pytest.raises(MechkitError, match="continued a KV cache"):
        cache.to_transformer_lens()


def test_a_recording_on_padding_is_not_completed_without_its_mask(llama, prompts):
    ids = prompts[0]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with mk.record(llama, "blocks.1.hook_resid_post") as padded:
        llama(ids, attention_mask=mask)
    _, plain = mk.run_with_cache(llama, ids, "blocks.1.hook_resid_post")
    # the mask changes the activations: recorded again without it, the rest would be another run's
    assert not torch.allclose(padded["blocks.1.hook_resid_post"], plain["blocks.1.hook_resid_post"])
    with pytest.raises(MechkitError, match="masked padding"):
        padded.completion(("blocks.*.hook_resid_pre",))
    with mk.record(llama, "blocks.1.hook_resid_post") as unpadded:
        llama(ids, attention_mask=torch.ones_like(ids))
    assert unpadded.completion(("blocks.*.hook_resid_pre",))  # an all-ones mask replays as it was


def test_gradients_of_a_metric_that_ignores_the_logits_is_one_line(llama, prompts):
    with pytest.raises(MechkitError, match="does not depend on the logits"):
        mk.gradients(llama, RESID, prompts[0], lambda logits: torch.tensor(1.0, requires_grad=True))


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    from mechkit.io.disk_cache import cache_root

    monkeypatch.delenv("MECHKIT_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    assert cache_root() == Path.home() / ".cache" / "mechkit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "mechkit"


def test_a_named_clear_does_not_delete_through_a_symlinked_group(monkeypatch, tmp_path):
    """`cache clear --all` leaves a group that is a symlink alone; `cache clear runs/KEY` went through it and
    deleted the user's folder it points into."""
    from mechkit.io.disk_cache import clear_cache

    user = tmp_path / "user"
    (user / "0123456789abcdef").mkdir(parents=True)
    (user / "0123456789abcdef" / "params.json").write_text("{}")
    root = tmp_path / "cache"
    root.mkdir()
    (root / "runs").symlink_to(user)
    for name in ("runs/0123456789abcdef", "0123456789abcdef"):
        with pytest.raises(MechkitError):
            clear_cache([name], root=root)
    assert clear_cache(all_entries=True, root=root) == []
    assert (user / "0123456789abcdef" / "params.json").is_file()


def test_answer_id_takes_integer_kinds_and_refuses_the_rest(llama):
    from mechkit.patching import answer_id

    assert answer_id(llama, np.int64(5)) == 5 and answer_id(llama, torch.tensor(5)) == 5
    for bad in (True, None, 5.0):
        with pytest.raises(MechkitError, match="neither text nor a token id"):
            answer_id(llama, bad)


def test_a_missing_untied_head_names_tie_word_embeddings_in_its_fix(tmp_path):
    """Pass 15a's note: an untied config over weights saved tied said "fix config.json (e.g. num_hidden_layers)"."""
    import json

    from safetensors.torch import load_file, save_file

    m = mk.load_model("tiny:llama", device="cpu")
    m.model.save_pretrained(tmp_path)
    m.tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("lm_head.weight", None)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MechkitError, match="lm_head.weight") as err:
        mk.load_model(str(tmp_path), device="cpu")
    assert "tie_word_embeddings" in err.value.fix
