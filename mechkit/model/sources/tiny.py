"""Tiny random-initialised models of real families, built from configs, fully offline.

They carry a byte-level tokenizer built in code (256 byte tokens plus BOS/EOS/PAD), so task
prompts, scoring and every CLI command work on them exactly as on a real model. Used by the test
suite and handy for trying a plugin in seconds: ``mechkit inspect --model tiny:gpt2``.
"""

from __future__ import annotations

from collections.abc import Callable

from mechkit.errors import ModelLoadError

VOCAB = 259  # 256 bytes + <bos> <eos> <pad>

SPECIAL_TOKENS = dict(vocab_size=VOCAB, bos_token_id=256, eos_token_id=257, pad_token_id=258)


def _configs() -> dict[str, Callable]:
    import transformers as T

    # RoPE families get a long context (it creates no parameters): examples written for real models
    # run on them; GPT-2's learned positions stay at 512, the smallest context mechkit meets.
    gqa = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=4096, **SPECIAL_TOKENS)
    return {
        "llama": lambda: T.LlamaConfig(**gqa),
        "mistral": lambda: T.MistralConfig(**gqa, sliding_window=None),
        "qwen2": lambda: T.Qwen2Config(**gqa),
        "gemma": lambda: T.GemmaConfig(**gqa, head_dim=16),
        "gemma2": lambda: T.Gemma2Config(**gqa, head_dim=16),
        "phi3": lambda: T.Phi3Config(**gqa),
        "gpt2": lambda: T.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **SPECIAL_TOKENS),
        "gpt_neox": lambda: T.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=4096,
                                            **SPECIAL_TOKENS),
    }


def tiny_families() -> list[str]:
    return ["llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox"]


def byte_tokenizer():
    """A byte-level fast tokenizer made in code: every string round-trips, nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab.update({"<bos>": 256, "<eos>": 257, "<pad>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def tiny_config(family: str):
    """The config of ``tiny:family`` (no model built), or ``None`` for an unknown family."""
    configs = _configs()
    return configs[family]() if family in configs else None


def tiny_model(family: str, seed: int = 0, **overrides):
    """A random-initialised model of ``family`` (seeded) and the byte tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    configs = _configs()
    if family not in configs:
        raise ModelLoadError(f"unknown tiny model family {family!r}",
                             f"use one of: {', '.join('tiny:' + f for f in configs)}")
    config = configs[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return model, byte_tokenizer()
