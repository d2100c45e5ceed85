"""Model details that silently change attention: for each, the patterns mechkit records equal the ones the
model's own eager attention returns (``output_attentions=True`` under ``attn_implementation="eager"``).

Each case sets the detail so it matters on a 12-token prompt: a window shorter than the prompt, a
softcap small enough to bind, q/k norms, one KV head, attention sinks.
"""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, **SPECIAL_TOKENS)


def _gemma2():
    import transformers as T

    return T.Gemma2Config(**SMALL, head_dim=16, attn_logit_softcapping=0.5, sliding_window=4,
                          layer_types=["sliding_attention", "full_attention"])


CASES = {
    "softcapping (Gemma 2, cap 0.5) and its sliding window of 4": _gemma2,
    "sliding window of 4 (Mistral)": lambda: __import__("transformers").MistralConfig(**SMALL, sliding_window=4),
    "q_norm/k_norm (Qwen3)": lambda: __import__("transformers").Qwen3Config(**SMALL, head_dim=16),
    "q_norm/k_norm (OLMo 2)": lambda: __import__("transformers").Olmo2Config(**SMALL),
    "grouped-query scaling (Llama, 2 KV heads)": lambda: __import__("transformers").LlamaConfig(**SMALL),
    "multi-query attention (GPT-BigCode)": lambda: __import__("transformers").GPTBigCodeConfig(
        n_embd=64, n_layer=2, n_head=4, n_positions=256, multi_query=True, **SPECIAL_TOKENS),
    "multi-query attention (Falcon)": lambda: __import__("transformers").FalconConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True, **SPECIAL_TOKENS),
    "ALiBi (Bloom)": lambda: __import__("transformers").BloomConfig(hidden_size=64, n_layer=2, n_head=4,
                                                                    **SPECIAL_TOKENS),
    "attention sinks (GPT-OSS)": lambda: __import__("transformers").GptOssConfig(
        **SMALL, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_recorded_patterns_equal_the_models_eager_attention(case):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CASES[case](), attn_implementation="eager").eval()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = model(ids, output_attentions=True).attentions
    m = mk.load_model(model, tokenizer=byte_tokenizer())
    with torch.no_grad(), mk.record(m, "blocks.*.attn.hook_pattern") as cache:
        m(ids)
    assert len(own) == m.anatomy.n_layers
    if "window of 4" in case:  # the detail bites: layer 0's last query sees only its 4 latest keys
        assert cache["blocks.0.attn.hook_pattern"][:, :, -1, :-4].abs().max() == 0
    for layer, pattern in enumerate(own):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], pattern, atol=1e-5, rtol=1e-5,
                                   msg=f"{case}: layer {layer}")
