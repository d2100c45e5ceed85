"""Tiny random models of every causal-LM type in the installed transformers, built from config classes.

Sizes are small and generic; a config's own ``__init__`` derives what depends on them (layer_types,
rope settings), and :data:`OVERRIDES` carries the few per-type constraints generic sizes break.
"""

from __future__ import annotations

import inspect

VOCAB = 259  # the byte tokenizer's (mechkit.model.sources.tiny)
SPECIAL = dict(vocab_size=VOCAB, bos_token_id=256, eos_token_id=257, pad_token_id=258)
SMALL = dict(
    hidden_size=64, n_embd=64, d_model=64, dim=64, embed_dim=64, n_embed=64,
    intermediate_size=128, ffn_dim=128, n_inner=128, ffn_hidden_size=128, ffn_config=None,
    num_hidden_layers=2, n_layer=2, num_layers=2, n_layers=2, num_decoder_layers=2,
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4,
    num_key_value_heads=2, n_head_kv=2, num_kv_heads=2, head_dim=16, kv_channels=16,
    max_position_embeddings=256, n_positions=256, n_ctx=256, seq_length=256, max_seq_len=256,
    num_local_experts=4, num_experts=4, n_routed_experts=4, moe_num_experts=4,
    num_experts_per_tok=2, moe_topk=2, top_k=2, moe_k=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, expert_ffn_hidden_size=32,
    n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
    q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    sliding_window=64, attention_chunk_size=64, rotary_dim=8, rotary_emb_base=10000,
    use_cache=False,
)
# Per-type constraints the generic sizes break (set before the config derives the rest).
OVERRIDES: dict[str, dict] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
}


def config_for(model_type: str):
    """A small config of ``model_type`` (its text config where the causal-LM class takes one)."""
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type))
    return _small(cls, {**SMALL, **SPECIAL, **OVERRIDES.get(model_type, {})})


def _small(cls, sizes: dict):
    default = cls()
    known = set(default.to_dict()) | set(inspect.signature(cls.__init__).parameters)
    kwargs = {k: v for k, v in sizes.items() if k in known}
    if "qk_rope_head_dim" in known:  # multi-head latent attention: head_dim is derived from the rope part
        kwargs.pop("head_dim", None)
    for key, sub in default.to_dict().items():  # nested text/decoder configs get small too
        if isinstance(sub, dict) and "model_type" in sub and key.endswith("config"):
            sub_cls = type(getattr(default, key))
            kwargs[key] = _small(sub_cls, sizes)
    return cls(**kwargs)


def build(model_type: str, seed: int = 0):
    """``(model, config)``: the causal-LM class of ``model_type`` on a small config, seeded, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config_for(model_type)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return model.eval(), config
