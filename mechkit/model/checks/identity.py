"""What decides a model's results besides its weights: the identity a resume key and a saved artifact record.

Two models with the same weights can still compute differently: another ``config.json`` (an
``rms_norm_eps``, a rope scaling, a number of heads), another tokenizer (other ids for the same
text), another dtype. A resume directory keyed on the weights alone would let a rerun with another
config pick up the steps of the first run and mix both into one report. :func:`model_identity` hashes
all of them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Fields that name where a config was read from, which transformers wrote it, or what a save records
# beside it (the dtype is the identity's own entry; ``architectures`` is absent from a config built in code
# and present once saved): none changes what the model computes.
_CONFIG_NOISE = ("_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset", "dtype",
                 "torch_dtype", "architectures")


def config_sha256(model: Any) -> str:
    """SHA-256 of the model's config as JSON (sorted keys), without the fields that name where it was read
    from or which transformers wrote it, which do not change what it computes."""
    config = getattr(model, "config", None)
    if config is None:
        return "none"
    data = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    data = {k: v for k, v in data.items() if k not in _CONFIG_NOISE}
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def generation_sha256(model: Any) -> str:
    """SHA-256 of the model's generation settings (``generation_config.json``: repetition penalty, n-gram bans,
    token ids), which greedy decoding reads: a resumed run took steps decoded under the old settings beside steps
    decoded under new ones. ``"none"`` where the model has none."""
    config = getattr(model, "generation_config", None)
    if config is None or not hasattr(config, "to_dict"):
        return "none"
    data = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_NOISE}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_sha256(tokenizer: Any) -> str:
    """SHA-256 of what maps text to ids: a fast tokenizer's whole definition, else its vocabulary and
    special tokens; ``"none"`` for a model without a tokenizer."""
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        text = _definition(backend.to_str())
    else:
        try:
            vocab = sorted(tokenizer.get_vocab().items())
        except Exception:  # a tokenizer without a vocabulary to list: its type is what we know
            vocab = []
        text = json.dumps([type(tokenizer).__name__, vocab], default=str)
    special = json.dumps(getattr(tokenizer, "special_tokens_map", {}) or {}, sort_keys=True, default=str)
    return hashlib.sha256((text + special + _tokenizer_settings(tokenizer)).encode()).hexdigest()


def _definition(text: str) -> str:
    """A fast tokenizer's JSON without its ``padding`` and ``truncation`` entries: each call with
    ``padding=True`` (a batch) sets them on the backend, so they record the last call, not what the
    tokenizer is (the padding side is one of :data:`_SETTINGS`)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict):
        data.pop("padding", None)
        data.pop("truncation", None)
    return json.dumps(data, sort_keys=True)


_SETTINGS = ("padding_side", "truncation_side", "model_max_length", "add_bos_token", "add_eos_token",
             "clean_up_tokenization_spaces")


def _tokenizer_settings(tokenizer: Any) -> str:
    """The Python-side settings that change ids or padded batches (``padding_side`` left pads prompts on
    the left: other positions, other results) but live outside the backend's definition. Only plain
    values count (a setting holding an object would put its address in the key)."""
    plain = (str, int, float, bool, type(None))
    values = {name: getattr(tokenizer, name, None) for name in _SETTINGS}
    values |= {name: True for name in _SWITCHES if getattr(tokenizer, name, False) is True}
    values = {k: v for k, v in values.items() if isinstance(v, plain)}
    for name in _WHEN_SET:
        value = getattr(tokenizer, name, None)
        if isinstance(value, dict) and list(value) == ["default"]:
            value = value["default"]  # as transformers saves and reloads it: one template, a string
        value = _as_reloaded(value)
        if value is not None:  # an object JSON cannot write is still a change: its type is recorded
            values[name] = value if _plain(value) else f"<{type(value).__name__}>"
    return json.dumps(values, sort_keys=True)


def _as_reloaded(template: Any) -> Any:
    r"""A chat template as a save and a load give it back: transformers writes it to ``chat_template.jinja`` and
    reads that as text, turning ``\r\n`` and ``\r`` into ``\n``; a saved copy of the same tokenizer had another
    identity, and an activation vector extracted on one was refused on the other."""
    if isinstance(template, str):
        return template.replace("\r\n", "\n").replace("\r", "\n")
    if isinstance(template, dict):  # named templates: one level, each a string
        return {k: v.replace("\r\n", "\n").replace("\r", "\n") if isinstance(v, str) else v
                for k, v in template.items()}
    return template


def _plain(value: Any, depth: int = 0) -> bool:
    """A value JSON writes the same each time: plain scalars, and lists and string-keyed dicts of them, a few
    levels deep (a tokenizer's named chat templates are a dict; left out, a plugin's dict of templates passed
    unseen)."""
    if isinstance(value, str | int | float | bool | type(None)):
        return True
    if depth > 8:
        return False
    if isinstance(value, list | tuple):
        return all(_plain(v, depth + 1) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())


# Settings off by default that change ids when on: ``split_special_tokens`` tokenizes the text ``<bos>`` as
# its characters, not as the BOS id. Recorded only when on, so every identity recorded before stays the same.
_SWITCHES = ("split_special_tokens",)
# Settings recorded only where the tokenizer has one, for the same reason: a chat template a plugin set and left
# was no change to the model's identity, and a later saved model carried the plugin's template.
_WHEN_SET = ("chat_template",)


def model_identity(handle: Any) -> dict[str, Any]:
    """The parts of a loaded model that decide its results: weights, config, tokenizer, dtype, and the
    modules left in train mode (dropout on: other numbers)."""
    return {"weights_sha256": handle.weights_sha256(), "config_sha256": config_sha256(handle.model),
            "tokenizer_sha256": tokenizer_sha256(handle.tokenizer), "dtype": str(handle.dtype),
            "train_mode": sorted(name for name, module in handle.model.named_modules() if module.training)}


def model_key(handle: Any) -> dict[str, Any]:
    """:func:`model_identity` and how the model runs (device, device map, attention implementation, backend):
    a resume key's model part, so steps computed on the CPU are never reused on a GPU, or the other way round."""
    attention = getattr(getattr(handle.model, "config", None), "_attn_implementation", None)
    return {**model_identity(handle), "generation_sha256": generation_sha256(handle.model),
            "device": handle.device.type, "device_map": handle.device_map,
            "attn_implementation": str(attention), "backend": handle.backend.name, "remote": handle.backend.remote}


def identity_tag(handle: Any) -> str:
    """A short digest of :func:`model_key`, for the step keys of a run that computes on several models
    (``compose --models``): the run's own resume key covers only the model it was started with."""
    text = json.dumps(model_key(handle), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
