"""Red-team pass 26 (b): a Cache merged from two recordings.

E1: ``c1 | c2`` (and ``|=``, ``update``, ``c[name] = t``) kept the left recording's model, token ids and marks and
took points from another recording unchecked: ``to_transformer_lens()`` recorded what it lacked on ``c1``'s ids
next to ``c2``'s activations of other ids, and ``completion`` said nothing was missing. A merge of the same
forwards recorded twice (one model, equal ids and logits) stays completable; anything else stored in a recording
makes it refuse a completion in one line, while what it holds is read as before.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.hooking.cache import Cache

R0, R1 = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
A, B = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[9, 8, 7, 6]])
FOREIGN = "oints of this cache were set by hand or merged from another recording"


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def recordings(llama):
    return {key: mk.run_with_cache(llama, ids, names)[1]
            for key, ids, names in (("a0", A, [R0]), ("b1", B, [R1]), ("a1", A, [R1]))}


def _merged(how, left, right):
    if how == "or":
        return left | right
    mine = left.copy()
    if how == "ior":
        mine |= right
    elif how == "update":
        mine.update(right)
    elif how == "setitem":
        for name in right:
            mine[name] = right[name]
    elif how == "dict":
        mine.update(dict(right))
    return mine


def _refused(call):
    with pytest.raises(MechkitError, match=FOREIGN) as err:
        call()
    assert "\n" not in str(err.value) and "record every point needed in one run" in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("how", ["or", "ior", "update", "setitem", "dict"])
def test_a_merge_of_another_inputs_recording_refuses_to_complete(recordings, how):
    merged = _merged(how, recordings["a0"], recordings["b1"])
    assert torch.equal(merged[R1], recordings["b1"][R1]) and torch.equal(merged[R0], recordings["a0"][R0])
    assert "lacks hook_embed" in _refused(merged.to_transformer_lens)
    _refused(lambda: merged.completion("blocks.*.hook_resid_post"))  # nothing missing, yet not one forward's
    assert "lacks blocks.0.hook_resid_pre" in _refused(lambda: merged.completion("blocks.*.hook_resid_pre"))
    assert list(recordings["a0"]) == [R0] and recordings["a0"].completion(R0) == {}  # the left one untouched


@pytest.mark.parametrize("how", ["or", "ior", "update"])
def test_a_merge_of_the_same_forwards_stays_completable_and_another_does_not(llama, recordings, how):
    same = _merged(how, recordings["a0"], recordings["a1"])
    assert list(same.completion("blocks.*.hook_resid_post")) == []
    done = same.completion("blocks.*.hook_resid_pre")
    _, direct = mk.run_with_cache(llama, A, ["blocks.*.hook_resid_pre"])
    assert all(torch.equal(done[n], direct[n]) for n in direct)
    same.to_transformer_lens()
    _refused(lambda: _merged(how, recordings["a0"], recordings["b1"]).completion("blocks.*.hook_resid_pre"))


def test_a_tensor_set_by_hand_in_a_recording_refuses_to_complete(recordings):
    for value in (recordings["b1"][R1], recordings["a1"][R1] * 2, torch.zeros(1, 4, 64)):
        mine = recordings["a0"].copy()
        mine[R1] = value
        _refused(lambda mine=mine: mine.completion("blocks.*.hook_resid_pre"))
        assert torch.equal(mine[R1], value)
    mine = recordings["a0"].copy()
    mine[R0] = mine[R0]  # the very tensor held: nothing set by hand
    assert list(mine.completion("blocks.*.hook_resid_post")) == [R1]


def test_a_recording_of_other_logits_or_another_model_merged_refuses(llama, recordings):
    def zero(act, _point):
        return torch.zeros_like(act)

    with mk.hooks(llama, {"blocks.0.hook_resid_post": zero}):  # the same ids, another forward
        _, hooked = mk.run_with_cache(llama, A, [R1])
    _refused(lambda: (recordings["a0"] | hooked).completion("blocks.*.hook_resid_pre"))
    gpt2 = mk.load_model("tiny:gpt2")
    _, other = mk.run_with_cache(gpt2, A, [R1])
    _refused(lambda: (recordings["a0"] | other).to_transformer_lens())
    _refused(lambda: (recordings["a0"] | {R1: torch.zeros(1, 4, 64)}).completion(R1))


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, lambda c: c.copy(), lambda c: c | {},
                                 lambda c: pickle.loads(pickle.dumps(c))])
def test_a_merged_cache_stays_not_completable_when_copied_or_pickled(recordings, how):
    merged = how(recordings["a0"] | recordings["b1"])
    _refused(lambda: merged.completion("blocks.*.hook_resid_pre"))
    _refused(merged.to_transformer_lens)
    assert list(merged) == [R0, R1] and torch.equal(merged[R1], recordings["b1"][R1])


def test_a_cache_built_by_hand_converts_and_refuses_as_before(recordings):
    mine = Cache({R0: torch.zeros(1, 4, 64)}) | recordings["b1"]
    assert mine.handle is None and list(mine) == [R0, R1]
    with pytest.raises(MechkitError, match="knows no model"):
        mine.completion("blocks.0.hook_resid_pre")
    merged = recordings["a0"] | recordings["b1"]  # while one merged into a recording does not
    _refused(lambda: merged.completion("blocks.0.hook_resid_pre"))
