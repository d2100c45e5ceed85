"""Head scores agree with a direct computation from the model's own eager attention weights."""

from __future__ import annotations

import numpy as np
import torch

import mechkit as mk
from mechkit.heads.scores import copy_loss, head_scores, ov_copying_scores, repeated_tokens
from mechkit.model.modules.linear import weight_out_in


def eager_attentions(handle, tokens):
    config = handle.model.config
    previous = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return handle.model(tokens, output_attentions=True).attentions
    finally:
        config._attn_implementation = previous


def direct_scores(attentions, seg_len):
    total = attentions[0].shape[-1]
    offset = total - 2 * seg_len
    out = {k: np.zeros((len(attentions), attentions[0].shape[1])) for k in ("induction", "duplicate-token", "previous-token")}
    for layer, att in enumerate(attentions):
        for i in range(seg_len):
            t = offset + seg_len + i
            out["induction"][layer] += att[:, :, t, offset + i + 1].mean(0).numpy() / seg_len
            out["duplicate-token"][layer] += att[:, :, t, offset + i].mean(0).numpy() / seg_len
        for t in range(1, total):
            out["previous-token"][layer] += att[:, :, t, t - 1].mean(0).numpy() / (total - 1)
    return out


def test_scores_match_eager_attention(tiny):
    tokens = repeated_tokens(tiny, n_seqs=6, seg_len=7, seed=3)
    assert tokens.shape[1] == 2 * 7 + (1 if tiny.bos_id is not None else 0)
    ours = head_scores(tiny, tokens, seg_len=7, batch_size=4)
    direct = direct_scores(eager_attentions(tiny, tokens), 7)
    for kind, grid in direct.items():
        np.testing.assert_allclose(ours.scores[kind], grid, atol=1e-5, err_msg=kind)


def test_repeated_tokens_repeat_and_avoid_specials(tiny_llama):
    tokens = repeated_tokens(tiny_llama, n_seqs=5, seg_len=9, seed=0)
    body = tokens[:, -18:]
    assert torch.equal(body[:, :9], body[:, 9:])
    specials = set(tiny_llama.tokenizer.all_special_ids)
    assert not specials & set(body.flatten().tolist())


def test_copy_loss_splits_the_copies():
    loss = np.array([9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0])  # BOS + 2×4 tokens → 8 predictions… minus one
    first, second = copy_loss(loss, seg_len=4)
    assert first == 9.0 and second == 1.0


def test_ov_copying_matches_full_vocab_circuit(tiny):
    a = tiny.anatomy
    ours = ov_copying_scores(tiny)
    with torch.no_grad():
        embed = a.embed.weight.double()
        unembed = tiny.model.get_submodule(a.family.unembed).weight.double()
        scale = a.final_norm_scale()
        if scale is not None:
            unembed = unembed * scale.double()
        w_o = weight_out_in(a.attn_out(1)).double()
        for h in range(a.n_heads):
            module, rows = a.head_rows(1, "v", a.kv_head(h))
            w_v = weight_out_in(module)[rows].double()
            full = embed @ w_v.T @ w_o[:, h * a.d_head:(h + 1) * a.d_head].T @ unembed.T  # vocab × vocab
            eig = torch.linalg.eigvals(full)
            expected = float(eig.real.sum() / eig.abs().sum())
            assert abs(ours[1, h] - expected) < 1e-3, (h, ours[1, h], expected)


def test_scores_leave_model_untouched(tiny_llama):
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        before = tiny_llama(ids)
    head_scores(tiny_llama, repeated_tokens(tiny_llama, 3, 5), 5)
    with torch.no_grad():
        assert torch.equal(tiny_llama(ids), before)
    assert not tiny_llama.model.config._attn_implementation.startswith("mechkit")


def test_handle_exposes_bos(embedded):
    assert mk.load_model(embedded).bos_id is None  # SmolLM2's tokenizer adds no BOS
