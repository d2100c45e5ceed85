"""Fused QKV layouts: ``Anatomy.head_rows`` finds one head's rows in every layout a family row declares.

The identity: zeroing the value rows (weight and bias) of KV head ``j`` makes the output ``hook_z`` of every
query head reading it exactly zero, and leaves the other heads' outputs as they were.
"""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer


def _config(name: str):
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **SPECIAL_TOKENS)
    return {
        "gpt_neox (interleaved)": lambda: T.GPTNeoXConfig(**small, intermediate_size=128),
        "bloom (interleaved, ALiBi)": lambda: T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, **SPECIAL_TOKENS),
        "persimmon (interleaved, partial rotary)": lambda: T.PersimmonConfig(**small, intermediate_size=128),
        "codegen (four model-parallel blocks)": lambda: T.CodeGenConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                                       **SPECIAL_TOKENS),
        "falcon (multi-query, concat)": lambda: T.FalconConfig(**small, multi_query=True),
        "falcon (grouped, new decoder architecture)": lambda: T.FalconConfig(
            **small, new_decoder_architecture=True, num_kv_heads=2),
        "falcon (per-head interleaved)": lambda: T.FalconConfig(**small, multi_query=False, parallel_attn=False),
        "gpt_bigcode (multi-query, concat)": lambda: T.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4,
                                                                       multi_query=True, **SPECIAL_TOKENS),
        "phi3 (concat, grouped-query)": lambda: T.Phi3Config(**small, intermediate_size=128, num_key_value_heads=2),
        "mpt (concat)": lambda: T.MptConfig(d_model=64, n_layers=2, n_heads=4, **SPECIAL_TOKENS),
    }[name]()


CASES = ["gpt_neox (interleaved)", "bloom (interleaved, ALiBi)", "persimmon (interleaved, partial rotary)",
         "codegen (four model-parallel blocks)", "falcon (multi-query, concat)",
         "falcon (grouped, new decoder architecture)", "falcon (per-head interleaved)",
         "gpt_bigcode (multi-query, concat)", "phi3 (concat, grouped-query)", "mpt (concat)"]


@pytest.mark.parametrize("case", CASES)
def test_zeroing_a_kv_heads_value_rows_zeroes_exactly_its_query_heads(case):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = mk.load_model(AutoModelForCausalLM.from_config(_config(case)).eval(), tokenizer=byte_tokenizer())
    a, layer = m.anatomy, 1
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), mk.record(m, f"blocks.{layer}.attn.hook_z") as clean:
        m(ids)
    kv = a.n_kv_heads - 1  # the last KV head: an off-by-one group shows
    with torch.no_grad(), mk.edit_weights(m) as w, mk.record(m, f"blocks.{layer}.attn.hook_z") as cut:
        module, rows = a.head_rows(layer, "v", kv)
        w.weight_out_in(module)[rows] = 0
        if getattr(module, "bias", None) is not None:
            w.param(module, "bias")[rows] = 0
        m(ids)
    z, z0 = cut[f"blocks.{layer}.attn.hook_z"], clean[f"blocks.{layer}.attn.hook_z"]
    readers = [h for h in range(a.n_heads) if a.kv_head(h) == kv]
    assert readers and z[:, :, readers].abs().max() == 0
    others = [h for h in range(a.n_heads) if h not in readers]
    torch.testing.assert_close(z[:, :, others], z0[:, :, others])
