"""Red-team pass 14 (helper a): a Cache copied, pickled, assigned to or unpacked keeps its batch dimension;
the logit lens and DLA take NumPy integers, a model loaded from one directory named another way and a
recording of another precision; hook names from another cache or a generator; wildcards of mk.gradients
leave out the read-only points they cover (issue 32, class 8)."""

from __future__ import annotations

import copy
import os
import pickle

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.patching import direct_logit_attribution, lens_names, logit_lens

NAME = "blocks.0.hook_resid_pre"


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c)),
                                 lambda c: c.copy(), lambda c: c | {}])
def test_a_copied_cache_keeps_its_batch_dimension(llama, recorded, how):
    _, cache = recorded
    again = how(cache)
    assert again[NAME].shape == cache[NAME].shape and torch.equal(again[NAME], cache[NAME])
    assert torch.allclose(logit_lens(llama, again), logit_lens(llama, cache))


def test_a_tensor_stored_in_a_cache_is_read_back_whole(llama, recorded):
    ids, cache = recorded
    mine = cache.copy()
    mine[NAME] = cache[NAME] * 2
    mine.update({"blocks.1.hook_resid_pre": cache["blocks.1.hook_resid_pre"]})
    assert mine[NAME].shape == cache[NAME].shape and torch.equal(mine[NAME], cache[NAME] * 2)
    assert torch.equal(cache[NAME], mk.run_with_cache(llama, ids, NAME)[1][NAME])  # the original untouched


def test_a_cache_unpacked_hands_out_tensors_not_its_parts(recorded):
    _, cache = recorded
    for unpacked in (dict(cache), {**cache}):
        assert all(isinstance(v, torch.Tensor) for v in unpacked.values())
    mine = cache.copy()
    assert torch.equal(mine.pop(NAME), cache[NAME]) and NAME not in mine and NAME in cache
    assert mine.pop("nothing", None) is None


@pytest.mark.parametrize("key", ["nope", ("resid_pre", 0), 0])
def test_a_name_not_recorded_is_one_line_and_still_a_key_error(recorded, key):
    _, cache = recorded
    with pytest.raises(MechkitError, match="was not recorded; this cache holds blocks") as err:
        cache[key]
    assert isinstance(err.value, KeyError) and "\n" not in str(err.value) and not str(err.value).startswith('"')


def test_lens_and_dla_take_numpy_integers(llama, recorded):
    _, cache = recorded
    assert torch.equal(logit_lens(llama, cache, pos=np.int64(-1)), logit_lens(llama, cache, pos=-1))
    got = direct_logit_attribution(llama, cache, np.int32(5), np.int64(6), pos=np.int64(0))
    assert torch.equal(got.total, direct_logit_attribution(llama, cache, 5, 6, pos=0).total)
    for bad in (np.float64(1.0), True, np.bool_(True)):
        with pytest.raises(MechkitError, match="pos must be one integer"):
            logit_lens(llama, cache, pos=bad)


def test_lens_takes_a_model_loaded_from_the_same_directory_named_another_way(tmp_path, monkeypatch):
    m = mk.load_model("tiny:llama")
    m.model.save_pretrained(tmp_path / "dense")
    m.tokenizer.save_pretrained(tmp_path / "dense")
    os.symlink(tmp_path / "dense", tmp_path / "link")
    first = mk.load_model(str(tmp_path / "dense"))
    ids = first.to_tokens("hello")
    cache = mk.run_with_cache(first, ids, lens_names(first))[1]
    monkeypatch.chdir(tmp_path)
    for spec in ("dense", "./dense/", str(tmp_path / "link"), f"{tmp_path}/../{tmp_path.name}/dense"):
        assert torch.allclose(logit_lens(mk.load_model(spec), cache), logit_lens(first, cache))
    other = tmp_path / "other"
    mk.load_model("tiny:llama").model.save_pretrained(other)
    m.tokenizer.save_pretrained(other)
    with pytest.raises(MechkitError, match="recorded on"):  # another directory is still another model
        logit_lens(mk.load_model(str(other)), cache)


def test_lens_takes_a_recording_of_another_precision(llama, recorded):
    _, cache = recorded  # float32
    half = mk.load_model("tiny:llama", dtype="bfloat16")
    lens = logit_lens(half, cache)
    assert lens.dtype == torch.bfloat16 and lens.shape == logit_lens(llama, cache).shape


def test_hook_names_from_another_cache_or_a_generator(llama, recorded):
    ids, cache = recorded
    assert set(mk.run_with_cache(llama, ids, cache.keys())[1]) == set(cache)
    gen = (f"blocks.{i}.hook_resid_post" for i in range(2))
    assert list(mk.run_with_cache(llama, ids, gen)[1]) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    for mapping in (cache, {NAME: 1}):  # a mapping's values would be ignored: refused, on one line
        with pytest.raises(MechkitError, match="takes a hook name or a list") as err:
            mk.run_with_cache(llama, ids, mapping)
        assert "\n" not in str(err.value)


def test_a_gradient_wildcard_leaves_out_the_read_only_points_it_covers(llama):
    ids, metric = llama.to_tokens("hi"), lambda logits: logits[0, -1, 5]
    _, grads = mk.gradients(llama, "*", ids, metric)
    assert "ln_final.hook_scale" not in grads and "blocks.1.hook_resid_post" in grads
    for named in ("ln_final.hook_scale", "ln_final.*", ["*", "ln_final.hook_scale"]):
        with pytest.raises(MechkitError, match="cannot take a gradient at ln_final.hook_scale"):
            mk.gradients(llama, named, ids, metric)


@pytest.mark.parametrize("answers", ["M,M", " Mary, Mary"])
def test_patch_refuses_one_answer_given_twice_before_the_model(answers, tmp_path):
    from tests.conftest import cli_in_process

    # a model that does not exist: the refusal must come before it would be looked up (it came after the load)
    result = cli_in_process("patch", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o"),
                            "--clean", "ab", "--corrupted", "ac", "--answers", answers)
    assert result.returncode == 2, result.stderr
    assert "the clean and the competing answer are the same text" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()


def test_a_deep_copy_of_a_cache_copies_the_tensors_not_the_model():
    m = mk.load_model("tiny:llama", device="cpu")
    _, cache = mk.run_with_cache(m, m.to_tokens("abc"), "blocks.0.hook_resid_pre")
    twin = copy.deepcopy(cache)
    assert twin.handle is m and torch.equal(twin["blocks.0.hook_resid_pre"], cache["blocks.0.hook_resid_pre"])
    twin["blocks.0.hook_resid_pre"].zero_()
    assert cache["blocks.0.hook_resid_pre"].abs().sum() > 0  # the tensors are copies
