"""Hooks and interventions: exact semantics, and the model is bit-identical after every context."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.model.headspec import Head
from tests.conftest import logits_of


class Boom(Exception):
    pass


def test_zero_ablation_hook_equals_zeroed_output_columns(tiny, ids):
    head = Head(1, 2)
    with mk.ablate(tiny, heads=[head], mode="zero"):
        hooked = logits_of(tiny, ids)
    with mk.edit_weights(tiny) as w:
        w.zero_head_output(head)
        by_hand = logits_of(tiny, ids)
    assert torch.equal(hooked, by_hand)
    assert not torch.allclose(hooked, logits_of(tiny, ids))


def test_edit_weights_by_hand_matches_helper(tiny_llama, ids):
    a, head = tiny_llama.anatomy, Head(0, 3)
    with mk.edit_weights(tiny_llama) as w:
        cols = w.weight_out_in(a.attn_out(0))
        cols[:, head.head * a.d_head:(head.head + 1) * a.d_head] = 0
        manual = logits_of(tiny_llama, ids)
    with mk.ablate(tiny_llama, heads="0.3"):
        assert torch.equal(logits_of(tiny_llama, ids), manual)


def hook_ids(model):
    """Every hook registered on the model (transformers may own some: they must be the same after)."""
    return {(name, kind, key) for name, m in model.named_modules()
            for kind, hooks in (("fwd", m._forward_hooks), ("pre", m._forward_pre_hooks)) for key in hooks}


def test_contexts_leave_logits_bit_identical(tiny, ids):
    clean = logits_of(tiny, ids)
    hooks_before = hook_ids(tiny.model)
    params = {n: p.detach().clone() for n, p in tiny.model.named_parameters()}
    contexts = [
        lambda: mk.record(tiny, ["blocks.*.attn.hook_z", "blocks.*.attn.hook_pattern", "blocks.0.mlp.hook_post"]),
        lambda: mk.ablate(tiny, heads="0.1,1.0", mode="zero"),
        lambda: mk.ablate(tiny, heads="layer:1", mode="mean", reference=ids),
        lambda: mk.edit_weights(tiny),
        lambda: mk.hooks(tiny, {"blocks.0.hook_resid_post": lambda x, p: x * 0}),
    ]
    for make in contexts:
        with make() as ctx:
            if isinstance(ctx, mk.interventions.WeightEdits):
                ctx.zero_head_output(Head(0, 0))
            logits_of(tiny, ids)
        with pytest.raises(Boom), make() as ctx:
            if isinstance(ctx, mk.interventions.WeightEdits):
                ctx.param(tiny.anatomy.mlp_out(0)).mul_(3)
            logits_of(tiny, ids)
            raise Boom
        assert torch.equal(logits_of(tiny, ids), clean)
    for name, p in tiny.model.named_parameters():
        assert torch.equal(p, params[name]), name
    assert hook_ids(tiny.model) == hooks_before
    assert not tiny.model.config._attn_implementation.startswith("mechkit")


def test_pattern_equals_eager_attention_weights(tiny, ids):
    with mk.record(tiny, "blocks.*.attn.hook_pattern") as cache:
        logits = logits_of(tiny, ids)
    config = tiny.model.config
    previous = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            eager = tiny.model(ids, output_attentions=True)
    finally:
        config._attn_implementation = previous
    for layer, weights in enumerate(eager.attentions):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, eager.logits, rtol=1e-4, atol=1e-5)


def test_pattern_read_keeps_fast_kernel_on_other_layers(tiny_llama, ids):
    seen = []
    with mk.hooks(tiny_llama, {"blocks.1.attn.hook_pattern": lambda p, point: seen.append(p.shape)}):
        assert tiny_llama.model.config._attn_implementation == "mechkit_sdpa"
        logits_of(tiny_llama, ids)
    assert seen == [torch.Size([2, 4, 12, 12])]
    assert tiny_llama.model.config._attn_implementation == "sdpa"


def test_pattern_contexts_are_independent_of_closing_order(tiny_llama, ids):
    outer_seen, inner_seen = [], []
    outer = mk.record(tiny_llama, "blocks.0.attn.hook_pattern")
    inner = mk.hooks(tiny_llama, {"blocks.1.attn.hook_pattern": lambda p, point: inner_seen.append(p.shape)})
    cache = outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the outer one closes first
    outer_seen.append("blocks.0.attn.hook_pattern" in cache)
    logits_of(tiny_llama, ids)  # the inner one still records
    assert inner_seen == [torch.Size([2, 4, 12, 12])]
    assert tiny_llama.model.config._attn_implementation == "mechkit_sdpa"
    inner.__exit__(None, None, None)
    assert tiny_llama.model.config._attn_implementation == "sdpa"  # back once the last one closes
    logits_of(tiny_llama, ids)
    assert inner_seen == [torch.Size([2, 4, 12, 12])]  # detached


def test_pattern_replacement_changes_output_and_identity_does_not(tiny, ids):
    clean = logits_of(tiny, ids)
    with mk.hooks(tiny, {"blocks.0.attn.hook_pattern": lambda p, point: p.clone()}):
        same = logits_of(tiny, ids)
    torch.testing.assert_close(same, clean, rtol=1e-4, atol=1e-5)

    def previous_token(p, point):
        q = torch.zeros_like(p)
        rows = torch.arange(p.shape[-2])
        q[..., rows, (rows - 1).clamp(min=0)] = 1.0
        return q

    with mk.hooks(tiny, {"blocks.0.attn.hook_pattern": previous_token}):
        edited = logits_of(tiny, ids)
    assert not torch.allclose(edited, clean, atol=1e-4)


def test_hook_z_is_the_output_projection_input(tiny, ids):
    seen = {}
    layer = 1
    handle = tiny.anatomy.attn_out(layer).register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    try:
        with mk.record(tiny, f"blocks.{layer}.attn.hook_z") as cache:
            logits_of(tiny, ids)
    finally:
        handle.remove()
    z = cache[f"blocks.{layer}.attn.hook_z"]
    assert z.shape == (2, 12, tiny.anatomy.n_heads, tiny.anatomy.d_head)
    assert torch.equal(z.flatten(-2), seen["x"])


def test_residual_and_mlp_hooks_shapes(tiny, ids):
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.0.mlp.hook_post",
             "blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"]
    with mk.record(tiny, names) as cache:
        logits_of(tiny, ids)
    a = tiny.anatomy
    assert cache["blocks.0.hook_resid_pre"].shape == (2, 12, a.d_model)
    assert cache["blocks.1.hook_resid_post"].shape == (2, 12, a.d_model)
    assert cache["blocks.0.mlp.hook_post"].shape == (2, 12, a.d_mlp)
    assert cache["blocks.0.hook_attn_out"].shape == (2, 12, a.d_model)
    assert cache["blocks.1.hook_mlp_out"].shape == (2, 12, a.d_model)


def test_resid_post_feeds_next_block(tiny_llama, ids):
    with mk.record(tiny_llama, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"]) as cache:
        logits_of(tiny_llama, ids)
    assert torch.equal(cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_pre"])


def test_mean_ablation_uses_reference_mean(tiny_llama, ids):
    gen = torch.Generator().manual_seed(1)
    reference = torch.randint(0, 256, (3, 9), generator=gen)
    with mk.record(tiny_llama, "blocks.1.attn.hook_z") as ref_cache:
        logits_of(tiny_llama, reference)
    expected = ref_cache["blocks.1.attn.hook_z"][:, :, 2].mean(dim=(0, 1))
    with mk.ablate(tiny_llama, heads="1.2", mode="mean", reference=reference), \
            mk.record(tiny_llama, "blocks.1.attn.hook_z") as cache:
        logits_of(tiny_llama, ids)
    z = cache["blocks.1.attn.hook_z"]
    torch.testing.assert_close(z[:, :, 2], expected.expand_as(z[:, :, 2]))


def test_resample_ablation_draws_from_reference_and_is_seeded(tiny_llama, ids):
    gen = torch.Generator().manual_seed(2)
    reference = torch.randint(0, 256, (4, 12), generator=gen)
    with mk.record(tiny_llama, "blocks.0.attn.hook_z") as ref_cache:
        logits_of(tiny_llama, reference)
    ref = ref_cache["blocks.0.attn.hook_z"][:, :, 1]
    runs = []
    for _ in range(2):
        with mk.ablate(tiny_llama, heads="0.1", mode="resample", reference=reference, seed=5), \
                mk.record(tiny_llama, "blocks.0.attn.hook_z") as cache:
            logits_of(tiny_llama, ids)
        runs.append(cache["blocks.0.attn.hook_z"][:, :, 1])
    assert torch.equal(runs[0], runs[1])
    for b in range(2):
        for p in range(12):
            assert any(torch.equal(runs[0][b, p], ref[r, p]) for r in range(4))


def test_unknown_hook_name_and_mode():
    handle = mk.load_model("tiny:gpt2", device="cpu")
    with pytest.raises(mk.MechkitError, match="no hook point matches"), mk.record(handle, "blocks.9.attn.hook_z"):
        pass
    with pytest.raises(mk.MechkitError, match="unknown ablation mode"), mk.ablate(handle, "0.0", mode="boil"):
        pass
