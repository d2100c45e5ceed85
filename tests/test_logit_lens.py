"""The new hook points, the logit lens and direct logit attribution (mechkit.patching.lens)."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.modules import norm
from mechkit.patching import direct_logit_attribution, dla_names, lens_names, logit_diff, logit_lens


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma"])
def model(request):
    return mk.load_model(f"tiny:{request.param}", device="cpu")


def _ids(m):
    return m.to_tokens(["hello world", "abc defg h"])


def test_everything_is_cached_and_the_model_is_left_alone(model):
    with torch.no_grad():
        before = model(_ids(model))
    logits, cache = mk.run_with_cache(model, _ids(model))
    with torch.no_grad():
        assert torch.equal(model(_ids(model)), before)
    assert set(cache) == set(mk.hooking.all_names(model.anatomy))
    torch.testing.assert_close(logits, before, atol=1e-4, rtol=0)  # patterns come from eager attention
    a = model.anatomy
    assert cache["blocks.0.attn.hook_q"].shape[2:] == (a.n_heads, a.d_head)
    assert cache["blocks.0.attn.hook_k"].shape[2] == cache["blocks.0.attn.hook_v"].shape[2] == a.n_kv_heads
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.model.modules())


def test_q_and_k_are_what_the_pattern_is_computed_from(model):
    """Post-RoPE: softmax(q·kᵀ/√d + causal mask) is the recorded pattern (GQA keys repeated per group)."""
    _, cache = mk.run_with_cache(model, _ids(model)[:1], ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k",
                                                           "blocks.1.attn.hook_pattern"])
    q, k = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"]
    k = k.repeat_interleave(model.anatomy.n_groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * getattr(model.anatomy.attn(1), "scaling", q.shape[-1] ** -0.5)
    n = q.shape[1]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(scores.softmax(-1), cache["blocks.1.attn.hook_pattern"], atol=1e-5, rtol=1e-4)


def test_resid_mid_reads_and_writes_the_stream(model):
    ids = _ids(model)[:1]
    _, cache = mk.run_with_cache(model, ids)
    mid = cache["blocks.0.hook_resid_mid"]
    if model.anatomy.family_name != "gemma2":
        torch.testing.assert_close(mid, cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"])
    # writing it: the MLP half and the stream after the block both see the new value
    _, other = mk.run_with_cache(model, model.to_tokens("xyzzy world"), "blocks.0.hook_resid_mid")
    with torch.no_grad(), mk.hooks(model, {"blocks.0.hook_resid_mid": lambda *_: other["blocks.0.hook_resid_mid"]}):
        patched = model(ids)
    with torch.no_grad():
        expected = model(model.to_tokens("xyzzy world"))
    torch.testing.assert_close(patched, expected, atol=1e-4, rtol=1e-4)


def test_embed_and_final_scale(model):
    ids = _ids(model)
    _, cache = mk.run_with_cache(model, ids, ["hook_embed", "ln_final.hook_scale", "blocks.1.hook_resid_post"])
    with torch.no_grad():
        torch.testing.assert_close(cache["hook_embed"], model.anatomy.embed(ids))
        x = cache["blocks.1.hook_resid_post"]
        a = model.anatomy
        torch.testing.assert_close(norm.frozen(a.final_norm, x, cache["ln_final.hook_scale"], a.final_norm_scale()),
                                   a.final_norm(x).float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(MechkitError, match="can be read, not replaced"), torch.no_grad(), \
            mk.hooks(model, {"ln_final.hook_scale": lambda s, _p: s * 2}):
        model(ids)


def test_to_str_tokens(model):
    assert model.to_str_tokens("ab c") == ["a", "b", " ", "c"]
    assert model.to_str_tokens(model.to_tokens("ab")[0]) == ["a", "b"]


def test_the_lens_decodes_through_the_final_norm_with_its_offset(model):
    ids = _ids(model)
    logits, cache = mk.run_with_cache(model, ids, lens_names(model))
    lens = logit_lens(model, cache)
    torch.testing.assert_close(lens[-1], logits[:, -1], atol=1e-4, rtol=1e-4)
    a = model.anatomy  # layer 0 by hand: x / rms * (w + offset) @ W_Uᵀ (Gemma: offset 1)
    x = cache["blocks.0.hook_resid_pre"][:, -1].float()
    if norm.centres(a.final_norm):
        x = x - x.mean(-1, keepdim=True)
    normed = x / (x.pow(2).mean(-1, keepdim=True) + norm.epsilon(a.final_norm)).sqrt() * a.final_norm_scale()
    normed = normed + (a.final_norm.bias if getattr(a.final_norm, "bias", None) is not None else 0)
    with torch.no_grad():
        torch.testing.assert_close(lens[0], normed @ model.model.get_submodule(a.family.unembed).weight.T,
                                   atol=1e-4, rtol=1e-4)


def test_dla_components_sum_to_the_logit_difference(model):
    ids = _ids(model)
    logits, cache = mk.run_with_cache(model, ids, dla_names(model))
    c, w = 5, 7
    dla = direct_logit_attribution(model, cache, c, w)
    torch.testing.assert_close(dla.actual, logit_diff(logits[:, -1], c, w), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dla.total, dla.actual, atol=1e-4, rtol=1e-4)  # the identity, frozen scale
    bias = dla.attn - dla.heads.sum(-1)  # what the heads do not write: the output projection's bias
    if getattr(model.anatomy.attn_out(0), "bias", None) is None:
        assert bias.abs().max() < 1e-4


def test_dla_per_head_equals_transformer_lens(model):
    pytest.importorskip("transformer_lens")
    ids = _ids(model)[:1]
    with torch.no_grad(), mk.record(model, ["blocks.*.hook_resid_post", "blocks.*.attn.hook_z"]) as cache:
        model(ids)
    tl = cache.to_transformer_lens()  # completes what TL's tools need (README example)
    assert tl.accumulated_resid(layer=model.n_layers, apply_ln=True).shape[0] == model.n_layers + 1
    stack = tl.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)  # [L*H, batch, d_model]
    unembed = model.model.get_submodule(model.anatomy.family.unembed).weight
    gamma = model.anatomy.final_norm_scale()  # TL divides by the scale; the norm's weight is the unembedding's side
    theirs = (stack - (stack.mean(-1, keepdim=True) if norm.centres(model.anatomy.final_norm) else 0)) * gamma \
        @ (unembed[5] - unembed[7])
    ours = direct_logit_attribution(model, tl, 5, 7)  # an ActivationCache reads by the same names
    torch.testing.assert_close(ours.heads[0].flatten(), theirs[:, 0].float(), atol=1e-4, rtol=1e-3)


def test_a_pattern_and_a_name_it_covers_record_the_point_once(model):
    """lens_names and dla_names overlap (blocks.*.hook_resid_pre covers blocks.0.hook_resid_pre): asked
    together, each point is recorded once, not concatenated with itself along the batch."""
    ids = _ids(model)
    _, cache = mk.run_with_cache(model, ids, [*lens_names(model), *dla_names(model)])
    assert all(act.shape[0] == ids.shape[0] for act in cache.values())
    torch.testing.assert_close(logit_lens(model, cache)[-1], model(ids)[:, -1].detach(), atol=1e-4, rtol=1e-4)
