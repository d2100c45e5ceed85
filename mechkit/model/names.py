"""Checkpoint tensor names → module parameter names, by transformers' own renaming rules.

``save_pretrained`` does not always write the names ``named_parameters()`` yields: GPT-NeoX saves its
``lm_head`` as ``embed_out``, and transformers renames such keys back when loading. Code that reads
checkpoints tensor by tensor (task-vector extraction) and matches them to a live model uses the same
rules, taken from transformers for the model at hand, so no per-family list lives above this layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable


def checkpoint_renamer(model) -> Callable[[str], str]:
    """A function mapping a checkpoint key to the parameter name the loaded ``model`` uses for it."""
    rules: list[tuple[str, str]] = []
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        for rule in get_model_conversion_mapping(model):
            if isinstance(rule, WeightRenaming):
                rules += list(zip(rule.source_patterns, rule.target_patterns, strict=False))
    except (ImportError, AttributeError, TypeError):  # older transformers: keys are saved as named
        rules = []

    def rename(key: str) -> str:
        for source, target in rules:
            renamed = re.sub(source, target, key)
            if renamed != key:
                return renamed
        return key

    return rename


__all__ = ["checkpoint_renamer"]
