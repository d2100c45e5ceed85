"""mechkit.hooking.cache.Cache as a mapping: every operation hands out the joined tensors (a name recorded
on two forwards is stored as two parts), never the parts; a missing name is NotRecorded (a KeyError too);
copies keep the model by reference; pickles, old and new, load."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Mapping, MutableMapping

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.hooking import Cache
from mechkit.hooking.cache import NotRecorded

A, B = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def two_forwards(llama):
    """A recording of two names on two forwards of 4 tokens each: each name is stored as two parts."""
    first, second = llama.to_tokens("abc"), llama.to_tokens("abd")
    assert first.shape == second.shape
    with mk.record(llama, [A, B]) as cache:
        llama(first)
        llama(second)
    _, whole = mk.run_with_cache(llama, torch.cat([first, second]), [A, B])
    return cache, whole


def test_a_name_of_two_forwards_is_read_joined_on_batch(two_forwards):
    cache, whole = two_forwards
    for name in (A, B):
        assert cache[name].shape[0] == 2 and torch.allclose(cache[name], whole[name], atol=1e-5)
    assert len(cache) == 2 and list(cache) == [A, B] and list(reversed(cache)) == [B, A]
    assert A in cache and "blocks.9.hook_resid_post" not in cache and [A] not in cache and 0 not in cache


@pytest.mark.parametrize("unpack", [dict, lambda c: {**c}, lambda c: dict(c.items()),
                                    lambda c: dict(zip(c.keys(), c.values(), strict=True)),
                                    lambda c: {n: c.get(n) for n in c}, lambda c: {} | c])
def test_every_way_of_reading_it_gives_the_joined_tensors(two_forwards, unpack):
    cache, _ = two_forwards
    out = unpack(cache)
    assert type(out) is dict and list(out) == [A, B]
    for name in (A, B):
        assert isinstance(out[name], torch.Tensor) and torch.equal(out[name], cache[name]) and out[name].shape[0] == 2


@pytest.mark.parametrize("key", ["nope", "blocks.0.hook_resid_pre", 0, ("resid_post", 0), [A]])
def test_a_missing_name_is_not_recorded_and_a_key_error(two_forwards, key):
    cache, _ = two_forwards
    with pytest.raises(NotRecorded, match=r"was not recorded; this cache holds blocks\.0\.hook_resid_post, blocks\.1") as err:
        cache[key]
    assert isinstance(err.value, MechkitError) and isinstance(err.value, KeyError) and "\n" not in str(err.value)
    assert cache.get(key) is None and cache.get(key, 7) == 7 and cache.pop(key, "d") == "d"
    with pytest.raises(NotRecorded):
        del cache.copy()[key]
    with pytest.raises(KeyError):
        cache.copy().pop(key)


def test_stored_values_are_read_back_as_stored(two_forwards):
    cache, _ = two_forwards
    mine = cache.copy()
    doubled = cache[A] * 2
    mine[A] = doubled
    mine.update({"extra": torch.ones(3, 1, 2)}, more=5)
    mine |= {"ior": torch.zeros(1, 2, 3)}
    assert mine[A] is doubled and mine["extra"].shape == (3, 1, 2) and mine["more"] == 5 and mine["ior"].shape == (1, 2, 3)
    assert mine.setdefault("notes") is None and "notes" in mine and mine.setdefault(A, 0) is doubled
    assert list(mine) == [A, B, "extra", "more", "ior", "notes"]
    del mine["notes"]
    assert "notes" not in mine and len(mine) == 5
    assert list(cache) == [A, B] and torch.equal(cache[A] * 2, doubled)  # the original untouched


def test_pop_popitem_and_clear(two_forwards):
    cache, _ = two_forwards
    mine = cache.copy()
    name, value = mine.popitem()
    assert name == B and torch.equal(value, cache[B]) and value.shape[0] == 2 and list(mine) == [A]
    assert torch.equal(mine.pop(A), cache[A]) and len(mine) == 0
    with pytest.raises(KeyError, match="empty"):
        mine.popitem()
    again = cache.copy()
    again.clear()
    assert len(again) == 0 and len(cache) == 2


def test_equality_is_a_dict_of_tensors(two_forwards):
    cache, _ = two_forwards
    assert cache == dict(cache) and dict(cache) == cache and cache == cache.copy()
    assert (cache != dict(cache)) is False
    assert cache == Cache({A: cache[A], B: cache[B]})
    changed = cache.copy()
    changed[A] = cache[A] + 1
    assert cache != changed and changed != cache
    assert cache != {A: cache[A]} and cache != {**cache, "x": 1}
    assert cache != {A: cache[A].double(), B: cache[B]}  # another dtype
    assert cache != {A: cache[A].tolist(), B: cache[B]}  # not a tensor
    assert (cache == [A, B]) is False and (cache == None) is False  # noqa: E711 (the comparison itself is tested)
    with pytest.raises(TypeError, match="unhashable"):
        hash(cache)


@pytest.mark.parametrize("how", [copy.copy, lambda c: c.copy(), lambda c: c | {}])
def test_a_shallow_copy_shares_tensors_not_names(two_forwards, how):
    cache, _ = two_forwards
    twin = how(cache)
    assert type(twin) is Cache and twin == cache and twin.handle is cache.handle and twin.inputs is cache.inputs
    assert torch.equal(twin[A], cache[A]) and twin[A].shape[0] == 2
    twin["new"] = 1
    del twin[A]
    assert list(cache) == [A, B] and list(twin) == [B, "new"]


def test_a_deep_copy_copies_tensors_and_keeps_the_model(two_forwards, llama):
    cache, _ = two_forwards
    twin = copy.deepcopy(cache)
    assert twin.handle is llama and twin == cache and repr(twin) == repr(cache)
    assert twin.inputs is not cache.inputs and all(torch.equal(a, b) for a, b in zip(twin.inputs, cache.inputs, strict=True))
    one = Cache({A: cache[A].clone()})  # one part: cache[A] hands out the stored tensor itself
    one.handle = llama
    deep, shallow = copy.deepcopy(one), copy.copy(one)
    deep[A].zero_()
    assert deep.handle is llama and one[A].abs().sum() > 0 and deep[A].abs().sum() == 0
    shallow[A].zero_()  # a shallow copy shares the tensors, as a dict's copy does
    assert one[A].abs().sum() == 0


def test_pickle_and_torch_save_round_trip(two_forwards):
    cache, _ = two_forwards
    again = pickle.loads(pickle.dumps(cache))
    assert again == cache and again[A].shape[0] == 2 and again.handle.spec == cache.handle.spec
    buf = io.BytesIO()
    torch.save(cache, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)  # a Cache is no plain tensor container: weights_only refuses it
    assert loaded == cache and list(loaded) == [A, B] and loaded.continued is cache.continued


def test_a_pickle_of_the_dict_subclass_cache_still_loads():
    """Caches pickled while Cache was a dict subclass hold their names as dict items, set through __setitem__
    before the attributes (and without __init__): the stream below has that layout."""

    class Legacy:
        def __reduce__(self):
            return (Cache.__new__, (Cache,), {"handle": None, "inputs": [torch.tensor([[1]])]}, None,
                    iter([(A, torch.ones(2, 3)), (B, torch.zeros(1, 3))]))

    loaded = pickle.loads(pickle.dumps(Legacy()))
    assert type(loaded) is Cache and list(loaded) == [A, B] and loaded[A].shape == (2, 3) and loaded[B].shape == (1, 3)
    assert loaded.inputs[0].tolist() == [[1]] and loaded.handle is None and loaded.continued is False


def test_it_is_a_mutable_mapping_and_not_a_dict(two_forwards):
    cache, _ = two_forwards
    assert isinstance(cache, MutableMapping) and isinstance(cache, Mapping) and not isinstance(cache, dict)
    assert Cache() == {} and len(Cache(x=1)) == 1 and Cache([("a", 1)])["a"] == 1


def test_repr_names_shapes_and_what_is_no_tensor(two_forwards):
    cache, _ = two_forwards
    shown = repr(cache)
    assert shown.startswith("Cache of 2 hook points from tiny:llama") and f"{A}  {list(cache[A].shape)} float32" in shown
    mine = cache.copy()
    mine.setdefault("notes")
    mine["count"] = 3
    shown = repr(mine)
    assert "Cache of 4 hook points" in shown and "NoneType" in shown and "int" in shown and str(mine) == shown
    assert repr(Cache()) == "Cache of 0 hook points, 0 MB"
    many = Cache({f"n{i}": torch.zeros(1, 1) for i in range(10)})
    assert "… 2 more (list(cache) names them all)" in repr(many) and len(repr(many).splitlines()) == 10


def test_a_completion_records_what_is_missing_on_the_same_ids(two_forwards, llama):
    cache, _ = two_forwards
    done = cache.completion(["blocks.*.hook_resid_pre"])
    _, direct = mk.run_with_cache(llama, torch.cat(cache.inputs), "blocks.*.hook_resid_pre")
    assert sorted(done) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"] and type(done) is dict
    for name, value in done.items():
        assert value.shape[0] == 2 and torch.allclose(value, direct[name], atol=1e-5)
    assert cache.completion(["blocks.*.hook_resid_post"]) == {}  # nothing missing: no forward
    assert Cache({A: torch.ones(1)}).completion([A, "blocks.*.hook_resid_pre"]) == {}  # no model recorded


def test_forwards_of_different_lengths_are_refused_when_joined(llama):
    with mk.record(llama, A) as cache:
        llama(llama.to_tokens("a"))
        llama(llama.to_tokens("a much longer prompt"))
    assert A in cache and len(cache) == 1 and list(cache) == [A]
    with pytest.raises(MechkitError, match="forwards of different shapes"):
        cache[A]
