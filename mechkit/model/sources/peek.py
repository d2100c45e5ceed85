"""A model's config read from its spec without loading the model: for option checks made before the load.

Only where it is cheap and certain: a ``tiny:FAMILY`` config (built in code) and a local directory's
``config.json``. Anything else (the embedded model, a GGUF file, a hub id, a model object) gives ``None``, and
the checks that need the model run after it loads, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 4_000_000  # a config.json is a few kB; a larger one is left to the loader's own checks


def spec_config(spec: Any) -> dict | None:
    """The config of the model ``spec`` names, as a dict, or ``None`` where it cannot be read cheaply."""
    if not isinstance(spec, (str, Path)):
        return None
    text = str(spec)
    if text.startswith("tiny:"):
        from mechkit.model.sources.tiny import tiny_config

        config = tiny_config(text.removeprefix("tiny:"))
        return None if config is None else config.to_dict()
    from mechkit.model.loading import EMBEDDED_ALIASES

    if text in EMBEDDED_ALIASES or text.startswith("toy:"):  # loaded as such, even beside a folder of that name
        return None
    try:
        path = Path(text).expanduser() / "config.json"  # ~user of a user without a home: RuntimeError
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError, RuntimeError):
        return None  # the loader says what is wrong with it
    return config if isinstance(config, dict) else None


def has_kv_groups(config: dict) -> bool | None:
    """Whether a config's attention shares KV heads among query heads (grouped-query attention): ``True`` or
    ``False`` where the config says it plainly, ``None`` where only the loaded model can tell (a pruned model's
    layers keep their own head counts; multi-query flags of some families)."""
    if "mechkit_pruning" in config:
        return None
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv = config.get("num_key_value_heads")
    if not isinstance(heads, int):
        return None
    if isinstance(kv, int):
        return 0 < kv < heads
    if kv is None and config.get("model_type") in ("gpt2", "gpt_neox", "gptj", "opt"):
        return False  # multi-head attention: one KV head per query head
    return None


def pruned_kinds(config: dict) -> set[str] | None:
    """How a saved pruned model's config says it was pruned (its ``mechkit_pruning`` entry, as
    ``mechkit.runner.pruned_kinds`` reads the loaded model): "neurons", "heads", "layers", and "uneven-heads" where
    the entry's layers kept different numbers of heads (the loaded anatomy tells the rest); an empty set for a dense config, ``None`` for an entry it cannot
    read (the loader says what is wrong with it). A plugin that refuses a pruned model can then say so before the
    load instead of after it.

    >>> pruned_kinds({"mechkit_pruning": {"n_layers": 2, "mlp_keep": {"0": [1, 2]}, "head_keep": {}}})
    {'neurons'}
    >>> pruned_kinds({"model_type": "llama"})
    set()
    """
    entry = config.get("mechkit_pruning")
    if entry is None:
        return set()
    if not isinstance(entry, dict):
        return None
    mlp, heads, removed = entry.get("mlp_keep", {}), entry.get("head_keep", {}), entry.get("layers_removed", [])
    if not isinstance(mlp, dict) or not isinstance(heads, dict) or not isinstance(removed, list):
        return None
    kinds = {kind for kind, units in (("neurons", mlp), ("heads", heads), ("layers", removed)) if units}
    if len({len(v) for v in heads.values() if isinstance(v, list)}) > 1:  # else only the loaded anatomy tells
        kinds.add("uneven-heads")
    return kinds
