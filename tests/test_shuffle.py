"""Shuffling heads' weights: exact semantics per projection layout, and exact restoration."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.interventions import permutation, shuffle_heads
from mechkit.model.headspec import Head


def record(handle, ids, name):
    with mk.record(handle, name) as cache, torch.no_grad():
        handle(ids)
    return cache[name]


def test_qkov_swap_within_a_layer_swaps_head_outputs(tiny, ids):
    # Same layer, same input: a full transplant makes head 0 compute what head 1 computed.
    a = tiny.anatomy
    h0, h1 = (0, a.n_groups) if a.n_kv_heads != a.n_heads else (0, 1)  # different KV groups under GQA
    clean = record(tiny, ids, "blocks.0.attn.hook_z")
    mapping = {Head(0, h0): Head(0, h1), Head(0, h1): Head(0, h0)}
    with shuffle_heads(tiny, mapping, component="qkov", gqa="group"):
        shuffled = record(tiny, ids, "blocks.0.attn.hook_z")
    torch.testing.assert_close(shuffled[:, :, h0], clean[:, :, h1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shuffled[:, :, h1], clean[:, :, h0], rtol=1e-5, atol=1e-6)


def test_qk_swap_inside_a_kv_group_swaps_patterns(tiny_llama, ids):
    # heads 0 and 1 share KV head 0: moving only the queries swaps exactly their patterns.
    clean = record(tiny_llama, ids, "blocks.1.attn.hook_pattern")
    with shuffle_heads(tiny_llama, {Head(1, 0): Head(1, 1), Head(1, 1): Head(1, 0)}, component="qk"):
        shuffled = record(tiny_llama, ids, "blocks.1.attn.hook_pattern")
    torch.testing.assert_close(shuffled[:, 0], clean[:, 1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shuffled[:, 1], clean[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shuffled[:, 2:], clean[:, 2:], rtol=0, atol=0)  # siblings untouched


def test_gqa_query_mode_touches_only_selected_heads(tiny_llama, ids):
    clean = record(tiny_llama, ids, "blocks.0.attn.hook_pattern")
    with shuffle_heads(tiny_llama, {Head(0, 0): Head(0, 3), Head(0, 3): Head(0, 0)}, component="qk", gqa="query"):
        shuffled = record(tiny_llama, ids, "blocks.0.attn.hook_pattern")
    assert torch.equal(shuffled[:, 1], clean[:, 1]) and torch.equal(shuffled[:, 2], clean[:, 2])
    assert not torch.allclose(shuffled[:, 0], clean[:, 0])


def test_weights_restored_bit_exactly_even_on_error(tiny, ids):
    params = {n: p.detach().clone() for n, p in tiny.model.named_parameters()}
    heads = [Head(0, 0), Head(1, 2), Head(1, 3), Head(0, 1)]
    for component in ("qk", "qkov"):
        with pytest.raises(RuntimeError), shuffle_heads(tiny, permutation(heads, 0), component=component, gqa="group"):
            raise RuntimeError("boom")
        with shuffle_heads(tiny, permutation(heads, 1), component=component):
            pass
    for name, p in tiny.model.named_parameters():
        assert torch.equal(p, params[name]), name


def test_permutation_is_seeded_and_moves_something():
    heads = [Head(0, 0), Head(1, 1), Head(2, 2)]
    assert permutation(heads, 4) == permutation(heads, 4)
    mapping = permutation(heads, 4)
    assert sorted(mapping) == heads and sorted(mapping.values()) == heads
    assert any(d != s for d, s in mapping.items())
