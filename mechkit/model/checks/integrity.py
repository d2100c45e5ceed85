"""Never compute on weights the user did not give: the checks a model directory and a loaded model pass.

transformers fills every tensor a checkpoint lacks with random values and goes on (it logs a table, and
the run exits 0): a directory missing a tensor, or whose config asks for more layers than its weights
hold, would be analysed, edited and even saved as if it were the user's model. It also falls back to
``torch.load`` (pickle) for ``pytorch_model.bin``, which mechkit promises never to run. And a model with
NaN or inf weights runs to the end, to fail where the first non-finite logit is noticed. Each is refused
here, in one line naming the fix, before any work.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mechkit.errors import ModelLoadError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_LOAD_REPORT = "transformers.utils.loading_report"
_LOAD_REPORT_LOGGERS = (_LOAD_REPORT, "transformers.modeling_utils")  # where transformers logs the table


def refuse_pickle_only(path: Path) -> None:
    """A directory without safetensors weights: refused, naming the pickle file it holds instead (if any)."""
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickles:
        raise ModelLoadError(
            f"{path} holds only pickle weights ({pickles[0]}); mechkit loads safetensors only and never unpickles",
            "convert it once where you trust the file: AutoModelForCausalLM.from_pretrained(DIR)"
            ".save_pretrained(NEW_DIR, safe_serialization=True) and AutoTokenizer.from_pretrained(DIR)"
            ".save_pretrained(NEW_DIR) (analyses of text need the tokenizer beside the weights), then use NEW_DIR")
    raise ModelLoadError(f"no weights in {path}: no *.safetensors file",
                         "point --model at a directory written by save_pretrained (config.json + model.safetensors)")


ADAPTER_CONFIG = "adapter_config.json"  # what transformers looks for to apply a PEFT adapter on load


def refuse_adapter_beside(path: Path) -> None:
    """A model directory that also holds a PEFT adapter (``adapter_config.json``): with peft installed,
    transformers wraps the layers it names in LoRA modules and applies the adapter's weights on load, without
    a word; the model computed on is then not the one ``model.safetensors`` holds, and its modules are not
    the ones its anatomy names. Refused, naming the ways to say which model is meant."""
    if (path / ADAPTER_CONFIG).is_file():
        raise ModelLoadError(
            f"{path} holds a PEFT adapter ({ADAPTER_CONFIG}) beside the model's weights; transformers would "
            "apply it silently on load", "to analyse the adapted model, merge it once "
            "(PeftModel.from_pretrained(model, DIR).merge_and_unload().save_pretrained(NEW_DIR), with the tokenizer) "
            f"and use NEW_DIR; to analyse the base model, move {ADAPTER_CONFIG} and the adapter's weights out of {path}")


def refuse_invalid_config(path: Path) -> None:
    """Refuse a ``config.json`` transformers cannot build a config from (fields that disagree, such as a
    ``layer_types`` list longer than ``num_hidden_layers``, or an unknown model type) as a config problem,
    quoting transformers' reason, before it is reported as damaged weights."""
    from transformers import AutoConfig

    try:
        built = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        reason = (lines[-1] if lines and lines[0].endswith(":") else lines[0] if lines else type(err).__name__)[:240]
        refuse_null_size(path, str(err))  # "max_position_embeddings": null: that field named, not layer_types
        refuse_mistyped_field(path, str(err))  # "vocab_size": 1.5, "rotary_dim": "12": that field, not layer_types
        config = _config_of(path)  # llama refuses 3 heads of a width of 32 even with a head_dim: both fields named
        for where, part in _config_parts(config) if config is not None else ():
            _refuse_heads_not_dividing(path, where, part, config, head_dim_given=False)
        raise ModelLoadError(f"{path / 'config.json'} does not make a valid config: {reason}",
                             config_fix(path, str(err))) from None
    _refuse_bad_window(path, built)


def _refuse_bad_window(path: Path, built: Any) -> None:
    """A sliding window below 1 token where the built config uses one (``sliding_window`` -5 or 0; ``null`` where
    ``layer_types`` holds sliding layers): transformers built a mask that fits no sequence longer than the window's
    size, a raw "size of tensor a (37) must match" or "Could not find a sliding_window" at the first long forward.
    A window is used where ``layer_types`` holds a sliding layer, or, where the config lists no layer types, where
    it is set and not turned off (``use_sliding_window: false``: qwen2-moe's config then makes any window 0). The
    value named is config.json's."""
    raw = _config_of(path) or {}
    for where, config in (("", built), ("text_config.", getattr(built, "text_config", None))):
        if config is None or (where and config is built):
            continue
        window, types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
        turned_off = _own_field(config, "use_sliding_window") and getattr(config, "use_sliding_window", None) is False
        sliding_layers = isinstance(types, (list, tuple)) and "sliding_attention" in types
        if turned_off and sliding_layers:  # qwen2 drops the window it turns off, and its sliding layers have none
            raise ModelLoadError(f"{path / 'config.json'} gives {where}use_sliding_window false, but its "
                                 f"{where}layer_types hold sliding layers, which need a window",
                                 'set "use_sliding_window" in config.json to true (with the window the model was '
                                 'made with, e.g. 4096), or every entry of "layer_types" to "full_attention"')
        used = sliding_layers if isinstance(types, (list, tuple)) and types else window is not None and not turned_off
        if not used or _whole(window):
            continue
        part = raw.get("text_config") if where and isinstance(raw.get("text_config"), dict) else raw
        given = part.get("sliding_window", window) if isinstance(part, dict) else window
        sliding = isinstance(types, (list, tuple)) and "sliding_attention" in types
        raise ModelLoadError(f"{path / 'config.json'} gives {where}sliding_window {json.dumps(given)[:60]}, but "
                             + ("its layer_types hold sliding layers, which need a window of at least 1 token"
                                if given is None else "a window must hold at least 1 token"),
                             f'set "sliding_window" in config.json to the window the model was made with (e.g. '
                             f"4096){'' if sliding else ', or to null for none'}")


def _own_field(config: Any, name: str) -> bool:
    """Whether ``name`` is a field of the config's own class (qwen2's ``use_sliding_window``), not a key config.json
    merely holds: mistral keeps ``"use_sliding_window": false`` as an extra attribute and slides all the same."""
    import dataclasses

    cls = type(config)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return name in fields or name in getattr(cls, "__annotations__", {})


def config_fields_named(path: Path, text: str) -> list[str]:
    """The fields of ``path/config.json`` (top level, and one level into a dict as ``outer.inner``) whose name
    ``text`` (an error transformers raised) names as a word: the fields a fix should name, and no others."""
    config = _config_of(path)
    found: list[str] = []
    for key, held in (config or {}).items():
        if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", text):
            found.append(key)
        for inner in held if isinstance(held, dict) else ():
            if len(inner) > 3 and re.search(rf"(?<!\w){re.escape(inner)}(?!\w)", text):
                found.append(f"{key}.{inner}")
    return found


def config_fix(path: Path, reason: str) -> str:
    """The fix for an error transformers raised building the config or the model's modules from config.json:
    the fields the error names (the example about ``layer_types`` only when it is about them), never a re-export
    of weights that are not at fault."""
    fields = config_fields_named(path, reason)
    if {"num_hidden_layers", "layer_types"} & set(fields):
        return ("fix config.json so its fields agree with each other and with the weights "
                "(e.g. num_hidden_layers and the length of layer_types)")
    if fields:
        return (f"fix {' and '.join(fields[:3])} in config.json (the values the model was made with), or use the "
                "config.json saved with these weights")
    return ("fix the field of config.json the reason is about (the value the model was made with), or use the "
            "config.json saved with these weights")


def raised_building(err: BaseException) -> bool:
    """Whether ``err`` was raised while transformers built the config or the model's modules (in a config's or a
    module's ``__init__``: a rope table dividing by a field, a head count checked against the width), not while
    it read the weights: such an error is a config problem, and "the weights may be corrupt" would send the user
    to re-export files that are fine."""
    try:
        from torch import nn
        from transformers import PretrainedConfig
    except ImportError:  # pragma: no cover - both are load requirements
        return False
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("__init__", "__post_init__") and \
                isinstance(frame.f_locals.get("self"), (nn.Module, PretrainedConfig)):
            return True
        tb = tb.tb_next
    return False


SIDE_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "model.safetensors.index.json", "added_tokens.json")  # the JSON beside config.json transformers reads
_MAX_SIDE_BYTES = 4_000_000  # a larger one is left to the load and its checks


def refuse_deep_side_files(path: Path) -> None:
    """A JSON file of the directory's that transformers parses while loading (``generation_config.json``, the
    tokenizer's), nested past the decoder's recursion limit (a crafted 100 000 ``[``): the load's RecursionError
    was reported as corrupt weights and a re-export, though the weights are fine. Named here with its file."""
    for name in SIDE_FILES:
        file = path / name
        try:
            if not file.is_file() or file.stat().st_size > _MAX_SIDE_BYTES:
                continue
            json.loads(file.read_bytes().decode("utf-8", errors="replace"))
        except RecursionError:
            also = " or delete it (the model loads without one)" if name == "generation_config.json" else ""
            raise ModelLoadError(f"{file} is nested too deeply to read (the weights are not at fault)",
                                 f"write {name} again as save_pretrained does (a flat JSON object){also}") from None
        except (OSError, ValueError):
            continue  # unreadable or not JSON: the load and its own checks say so


# config fields that size a tensor or a loop of the model: a value below 1 (GPT-2's n_positions -1) made the build
# fail with "negative dimension", reported as corrupt weights; num_attention_heads 0 or n_positions 1.5 failed in
# transformers' own config checks ("integer modulo by zero", "expected int") with a fix about layer_types
SIZE_FIELDS = ("n_positions", "n_ctx", "max_position_embeddings", "hidden_size", "n_embd", "num_attention_heads",
               "n_head", "intermediate_size", "n_inner", "num_key_value_heads", "head_dim", "num_hidden_layers",
               "n_layer", "num_layers", "vocab_size",  # vocab_size 1.5: transformers' TypeError, fixed "with layer_types"
               # other families' (mixtral, qwen2_moe, opt, falcon, gpt-j): 0 or -1 was "corrupt weights" or a shape
               "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "shared_expert_intermediate_size", "decoder_sparse_step", "ffn_dim", "word_embed_proj_dim",
               "ffn_hidden_size", "num_kv_heads", "rotary_dim")
_POSITION_FIELDS = ("n_positions", "n_ctx", "max_position_embeddings")
_POSITION_TABLES = ("wpe.weight", "embed_positions.weight", "position_embeddings.weight")
_WIDTH_FIELDS = ("hidden_size", "n_embd")
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight", "tok_embeddings.weight")


def _config_of(path: Path) -> dict | None:
    """``path``'s ``config.json`` as a dict, or ``None`` where it cannot be read: the load and its own checks say
    what is wrong with it then; the checks here need a readable config to name a field."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - unreadable, not UTF-8, not JSON, nested too deeply: left to the load
        return None
    return config if isinstance(config, dict) else None


def refuse_nonpositive_sizes(path: Path) -> None:
    """A ``config.json`` size field (:data:`SIZE_FIELDS`) that is not a whole number of at least 1 (0, -1, 1.5,
    ``"12"``, ``true``): named with its valid range and, where the weights' headers say, the value they were made
    with, instead of "the weights may be corrupt" or transformers' own config error with a fix about
    ``layer_types``. Run before the config is built, for every family. ``null`` (a default some fields take) is
    left to :func:`refuse_invalid_config`; files this cannot read are left to the load and its checks."""
    config = _config_of(path)
    if config is None:
        return
    for where, part in _config_parts(config):
        for field in SIZE_FIELDS:
            value = part.get(field)
            if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                continue
            raise _size_error(path, where + field, value)
        _refuse_null_kv_heads(path, where, part)


# MoE routing: the experts each token picks, and the experts there are (mixtral, qwen2_moe, olmoe, dbrx's ffn_config,
# deepseek): more picked than there are was torch's "selected index k out of range" at the first forward
EXPERTS_PICKED = ("num_experts_per_tok", "moe_top_k", "num_selected_experts")
EXPERTS_HELD = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def refuse_unsound_routing_and_rope(path: Path) -> None:
    """Fields that pass the size check but cannot work together or at all, refused before the config is built:
    more experts picked per token than the MoE layer holds (:data:`EXPERTS_PICKED` against :data:`EXPERTS_HELD`)
    was torch's "selected index k out of range" at the first forward; a ``rope_theta`` that is not a positive
    finite number, or a ``partial_rotary_factor`` (gpt_neox's ``rotary_pct``) outside (0, 1], was a tensor
    size mismatch or "the weights may be corrupt". RoPE fields are read at the top level, in ``rope_parameters``
    / ``rope_scaling`` and in their per-layer-type dicts (gemma3's ``{"full_attention": {...}, ...}``); the
    ones transformers divides by or takes a log or a power of (llama3's ``low_freq_factor``, yarn's
    ``original_max_position_embeddings``...) were "division by zero" blamed on the weights. Decimal fields out
    of range (:data:`FLOAT_RANGES`), a ``query_pre_attn_scalar`` below 1 (gemma2's ``(-4) ** -0.5`` computed
    on silently) and a head count that does not divide the width are refused here too."""
    config = _config_of(path)
    if config is None:
        return
    for where, part in _config_parts(config):
        for inner, block in [("", part)] + [(k + ".", v) for k, v in part.items() if k == "ffn_config" and
                                             isinstance(v, dict)]:
            picked = next(((k, block[k]) for k in EXPERTS_PICKED if _whole(block.get(k))), None)
            held = next(((k, block[k]) for k in EXPERTS_HELD if _whole(block.get(k))), None)
            if picked and held and picked[1] > held[1]:
                raise ModelLoadError(
                    f"{path / 'config.json'} gives {where + inner + picked[0]} {picked[1]}, more experts per token "
                    f"than {where + inner + held[0]} ({held[1]}) holds",
                    f'set "{picked[0]}" in config.json to at most {held[1]} (the value the model was made with, '
                    f'e.g. 2), or "{held[0]}" to the experts the weights hold')
        _refuse_bad_rope(path, where, part)
        _refuse_out_of_range_numbers(path, where, part)
        _refuse_heads_not_dividing(path, where, part, config)


def _rope_blocks(where: str, part: dict) -> Iterator[tuple[str, dict]]:
    """Every dict of RoPE fields: the config part itself, its rope_parameters / rope_scaling, and their
    per-layer-type dicts."""
    yield where, part
    for key in ("rope_parameters", "rope_scaling"):
        block = part.get(key)
        if isinstance(block, dict):
            yield f"{where}{key}.", block
            for name, inner in block.items():
                if isinstance(inner, dict):
                    yield f"{where}{key}.{name}.", inner


def _refuse_bad_rope(path: Path, where: str, part: dict) -> None:
    for prefix, block in _rope_blocks(where, part):
        theta = block.get("rope_theta")
        if "rope_theta" in block and theta is not None and not (
                isinstance(theta, (int, float)) and not isinstance(theta, bool) and 0 < theta < float("inf")):
            raise _rope_error(path, prefix + "rope_theta", theta, "a positive finite number", "10000.0")
        for name in ("partial_rotary_factor", "rotary_pct"):
            value = block.get(name)
            if name in block and value is not None and not (
                    isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1):
                raise _rope_error(path, prefix + name, value, "a number in (0, 1], the share of each head rotated",
                                  "0.5")
        factor = block.get("factor")  # linear, dynamic, yarn, longrope scaling: 0 or less computes on, wrongly
        if prefix and "factor" in block and factor is not None and not (
                isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < float("inf")):
            raise _rope_error(path, prefix + "factor", factor, "a positive finite number, the context's scaling",
                              "2.0")
        _refuse_bad_rope_shape(path, prefix, block, inside=prefix != where, part=part)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf")


# the RoPE fields transformers' rope tables divide by, or take a log or a power of: 0 or less was "division by
# zero" or "math domain error", blamed on the weights; attention_factor 0 scaled every cos and sin to 0 silently
ROPE_POSITIVE = {"low_freq_factor": "1.0", "high_freq_factor": "4.0", "attention_factor": "1.0",
                 "beta_fast": "32.0", "beta_slow": "1.0"}
ROPE_NON_NEGATIVE = {"mscale": "1.0", "mscale_all_dim": "1.0"}  # below 0, yarn's mscale ratio can divide by 0


def _refuse_bad_rope_shape(path: Path, prefix: str, block: dict, *, inside: bool, part: dict) -> None:
    """The RoPE scaling fields of one block (``inside`` a rope_scaling / rope_parameters dict) that cannot work,
    and ``original_max_position_embeddings`` wherever it is (phi3 keeps it at the top level)."""
    context = part.get("max_position_embeddings")
    pairs = _rotated_pairs(part, block)
    original = block.get("original_max_position_embeddings")
    if original is not None and not _whole(original):
        raise _rope_error(path, prefix + "original_max_position_embeddings", original,
                          "a whole number of at least 1, the context trained on before scaling",
                          f"{context}, this config's max_position_embeddings" if _whole(context) else "8192")
    if not inside:
        return
    for name, example in ROPE_POSITIVE.items():
        value = block.get(name)
        if value is not None and not (_number(value) and value > 0):
            raise _rope_error(path, prefix + name, value, "a positive number", example)
    for name, example in ROPE_NON_NEGATIVE.items():
        value = block.get(name)
        if value is not None and not (_number(value) and value >= 0):
            raise _rope_error(path, prefix + name, value, "a number of at least 0", example)
    for name in ("short_factor", "long_factor"):  # longrope: each frequency is divided by its entry
        value = block.get(name)
        if value is not None and not (isinstance(value, list) and all(_number(v) and v > 0 for v in value)):
            raise _rope_error(path, prefix + name, value, "a list of positive numbers, one per rotated pair of "
                              "each head", _ones(pairs))
        if value is not None and pairs is not None and len(value) != pairs:
            raise ModelLoadError(f"{path / 'config.json'} gives {prefix}{name} with {len(value)} entries, but each "
                                 f"head rotates {pairs} pairs of dimensions (one entry each)",
                                 f'set "{prefix}{name}" in config.json to the list the model was made with, '
                                 f"{pairs} positive numbers (e.g. {_ones(pairs)})")
    for low, high, to in (("low_freq_factor", "high_freq_factor", "1.0 and 4.0"), ("beta_slow", "beta_fast",
                                                                                 "1.0 and 32.0")):
        a, b = block.get(low), block.get(high)
        if _number(a) and _number(b) and (a >= b if low == "low_freq_factor" else a > b):
            raise ModelLoadError(
                f"{path / 'config.json'} gives {prefix}{low} {json.dumps(a)} and {prefix}{high} {json.dumps(b)}, "
                f"but {low} must be below {high} (transformers divides by their difference or orders by them)",
                f'set "{prefix}{low}" and "{prefix}{high}" in config.json to the values the model was made with, '
                f"{low} below {high} (e.g. {to})")


def _ones(pairs: int | None) -> str:
    """An example longrope factor list: ``pairs`` ones, written out where short enough to copy."""
    if pairs is None:
        return "[1.0, 1.0, ...]"
    return json.dumps([1.0] * pairs) if pairs <= 16 else f"[1.0, 1.0, ...] ({pairs} entries)"


def _rotated_pairs(part: dict, block: dict) -> int | None:
    """The pairs of dimensions RoPE rotates in each head (longrope's factor lists hold one entry each), from
    head_dim (or the width over the heads) and the partial rotary factor; None where the config does not say."""
    dim = part.get("head_dim")
    if not _whole(dim):
        width, heads = part.get("hidden_size"), part.get("num_attention_heads")
        dim = width // heads if _whole(width) and _whole(heads) and width % heads == 0 else None
    share = block.get("partial_rotary_factor", part.get("partial_rotary_factor"))
    share = 1.0 if share is None else share
    if dim is None or not _number(share) or not 0 < share <= 1:
        return None
    return int(dim * share) // 2 or None


# decimal fields and the range a model computes in: eps 0 or a softcap of 0 gave NaN or all-zero logits silently
FLOAT_RANGES = {"rms_norm_eps": (False, "1e-06"), "layer_norm_eps": (False, "1e-05"),
                "layer_norm_epsilon": (False, "1e-05"), "norm_eps": (False, "1e-05"),
                "final_logit_softcapping": (False, "30.0"), "attn_logit_softcapping": (False, "50.0"),
                "router_jitter_noise": (True, "0.0"), "initializer_range": (True, "0.02")}
"""Field -> (0 allowed, an example): the others must be above 0. ``null`` is left to transformers' config."""
EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
"""A decimal epsilon ≤ 0 is left to the probe of the logits (it names the field with the NaN it computes); an
integer one, which transformers refuses for its type, gets its range in that refusal."""

POSITIVE_WHOLE = ("query_pre_attn_scalar",)  # gemma2/3 scale queries by its ** -0.5: 0 failed, -4 ran complex


def _refuse_out_of_range_numbers(path: Path, where: str, part: dict) -> None:
    """A decimal field of :data:`FLOAT_RANGES` outside its range, and a :data:`POSITIVE_WHOLE` field below 1."""
    for name in FLOAT_RANGES:
        value = part.get(name)
        if _number(value) and (name not in EPSILONS or isinstance(value, int)):
            _refuse_float_out_of_range(path, where, name, value)
    for name in POSITIVE_WHOLE:
        value = part.get(name)
        if value is not None and name in part and not _whole(value):
            dim = part.get("head_dim")
            written = isinstance(value, float) and value.is_integer() and 1 <= value <= 65536  # 256.0: the value
            example = (f"{int(value)}, the value written whole" if written else f"{dim}, this config's head_dim"
                       if _whole(dim) else "256")
            raise ModelLoadError(f"{path / 'config.json'} gives {where}{name} {json.dumps(value)[:60]}, but it "
                                 "must be a whole number of at least 1 (queries are scaled by its inverse square "
                                 "root)", f'set "{name}" in config.json to the value the model was made with, '
                                 f"usually its head_dim (e.g. {example})")


def _refuse_float_out_of_range(path: Path, where: str, name: str, value: Any) -> None:
    """A :data:`FLOAT_RANGES` field outside its range: named with the range and an example in it."""
    zero_ok, example = FLOAT_RANGES[name]
    if not (value >= 0 if zero_ok else value > 0):
        valid = "a decimal number of at least 0" if zero_ok else "a decimal number above 0"
        raise ModelLoadError(f"{path / 'config.json'} gives {where}{name} {json.dumps(value)}, but it must be "
                             f"{valid}", f'set "{name}" in config.json to the value the model was made with, '
                             f"{valid} (e.g. {example})")


# (width, heads) field pairs: each head gets width / heads of the width where the config gives no head_dim
_HEAD_SPLITS = (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"))
_HEAD_DIM_KEYS = ("head_dim", "head_size", "kv_channels")


def _refuse_heads_not_dividing(path: Path, where: str, part: dict, config: dict, *, head_dim_given: bool = True
                               ) -> None:
    """A head count that does not divide the width in a config with no head_dim (nor a default one in its
    family's config class): llama's config error came with a fix about layer_types, falcon's module error with
    "the weights may be corrupt". Named with both fields and a head count that divides the width. After
    transformers refused the config, ``head_dim_given=False``: the width is checked whatever head_dim says."""
    if head_dim_given and (any(_whole(part.get(key)) for key in _HEAD_DIM_KEYS) or _default_head_dim(part, config)):
        return
    for width_key, heads_key in _HEAD_SPLITS:
        width, heads = part.get(width_key), part.get(heads_key)
        if not (_whole(width) and _whole(heads)) or width % heads == 0:
            continue
        kv = part.get("num_key_value_heads")
        fits = [d for d in range(1, width + 1) if width % d == 0 and (not _whole(kv) or d % kv == 0)] or [1]
        dim = next((part.get(key) for key in _HEAD_DIM_KEYS if _whole(part.get(key))), None)
        held = _heads_held(path, kv, dim)
        to = held if held in fits else min(fits, key=lambda d: (abs(d - heads), -d))
        raise ModelLoadError(
            f"{path / 'config.json'} gives {where}{heads_key} {heads}, which does not divide {where}{width_key} "
            f"{width} (each head gets {width_key} / {heads_key} of the width"
            f"{'; this config gives no head_dim' if dim is None else ', which this family asks even with a head_dim'})",
            f'set "{heads_key}" in config.json to {to} (a divisor of {width_key} {width}'
            f"{', the heads the weights hold' if to == held else ''}; the value the model was made with)")


def _default_head_dim(part: dict, config: dict) -> bool:
    """Whether the family's config class gives head_dim a default of its own (gemma's 256), so the width need not
    split evenly into heads; an unknown family is taken to have one (transformers refuses it anyway)."""
    try:
        from transformers import CONFIG_MAPPING

        cls = CONFIG_MAPPING[str(part.get("model_type") or config.get("model_type"))]
    except Exception:  # noqa: BLE001 - no such model type: transformers' own config check names it
        return True
    return _whole(getattr(cls, "head_dim", None))


def _heads_held(path: Path, kv: Any, dim: int | None = None) -> int | None:
    """The attention heads the weights hold: the query projection's rows over ``dim`` (the config's head_dim) where
    it gives one, else over the key projection's rows per ``kv`` key head (a kv count edited too gave a wrong one)."""
    q = _header_shapes(path, ("self_attn.q_proj.weight",))[:1]
    if q and dim:
        return q[0][0] // dim if q[0][0] % dim == 0 else None
    if not _whole(kv):
        return None
    k = _header_shapes(path, ("self_attn.k_proj.weight",))[:1]
    if not (q and k) or k[0][0] % kv:
        return None
    dim = k[0][0] // kv
    return q[0][0] // dim if dim and q[0][0] % dim == 0 else None


def _rope_error(path: Path, field: str, value: Any, valid: str, example: str) -> ModelLoadError:
    shown = json.dumps(value)[:60]  # as config.json writes it: NaN, "x", 1.5
    return ModelLoadError(f"{path / 'config.json'} gives {field} {shown}, but it must be {valid}",
                          f'set "{field}" in config.json to {valid} (the value the model was made with, '
                          f"e.g. {example})")  # the dotted path: rope_parameters.rope_theta, not a top-level key


def _refuse_null_kv_heads(path: Path, where: str, part: dict) -> None:
    """``"num_key_value_heads": null`` (transformers then takes ``num_attention_heads``) with weights whose key
    projection holds fewer heads: "the weights do not have the shapes" (or a TypeError) named no field."""
    heads, width, dim = (part.get(k) for k in ("num_attention_heads", "hidden_size", "head_dim"))
    if "num_key_value_heads" not in part or part["num_key_value_heads"] is not None or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (heads, width)):
        return
    dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1 else width // heads
    if dim < 1:
        return
    kv = [rows // dim for rows, _ in _header_shapes(path, ("self_attn.k_proj.weight",))[:1] if rows % dim == 0]
    kv += [(rows // dim - heads) // 2 for rows, _ in _header_shapes(path, ("self_attn.qkv_proj.weight",))[:1]
           if rows % dim == 0 and (rows // dim - heads) % 2 == 0 and rows // dim > heads]
    if kv and kv[0] != heads:
        raise ModelLoadError(f"{path / 'config.json'} gives {where}num_key_value_heads null, so transformers takes "
                             f"num_attention_heads ({heads}), but the weights' key projection holds {kv[0]} heads",
                             f'set "num_key_value_heads" in config.json to {kv[0]}, the heads the weights hold')


_TYPE_WORDS = {"int": "a whole number", "float": "a decimal number (with a point, such as 1.0)", "str": "a string",
               "bool": "true or false", "dict": "an object", "list": "a list"}


def refuse_mistyped_field(path: Path, reason: str) -> None:
    """A field transformers' config refused for its type ("Field 'X' expected int, got float"), named with the
    type it takes: its own config error came with a fix about ``layer_types``, whatever the field. A size field
    (:data:`SIZE_FIELDS`) gets the size-field line, with the value the weights imply."""
    found = re.search(r"Field '(\w+)'", reason)
    config = _config_of(path)
    if config is None:
        return
    part = next(((w, p) for w, p in reversed(_config_parts(config)) if found and found.group(1) in p), None)
    if part is None:
        return
    where, values = part
    name = found.group(1)
    if name in SIZE_FIELDS:
        raise _size_error(path, where + name, values[name])
    wanted = re.search(rf"Field '{name}' expected (\w+)", reason)
    value = values[name]
    if wanted and wanted.group(1) == "float" and isinstance(value, int) and not isinstance(value, bool):
        # 1 is a number, but transformers' config takes a float field only as a float: the fix is 1.0
        raise ModelLoadError(f"{path / 'config.json'} gives {where + name} {value}, a whole number, but transformers "
                             "takes it only as a decimal number (written with a point)",
                             f'set "{name}" in config.json to {float(value)!r} (the same value with a point)')
    kind = _TYPE_WORDS.get(wanted.group(1), f"a {wanted.group(1)}") if wanted else "a value of the type it takes"
    shown = json.dumps(values[name])[:60] if isinstance(values[name], (bool, str, type(None))) else repr(values[name])[:60]
    raise ModelLoadError(f"{path / 'config.json'} gives {where + name} {shown}, which is not {kind}",
                         f'set "{name}" in config.json to {kind} (the value the model was made with), or use the '
                         "config.json saved with these weights")


def _config_parts(config: Any) -> list[tuple[str, dict]]:
    """The config's top level and its ``text_config`` (a multimodal config's language model), as ``(prefix, dict)``."""
    parts = [("", config)] if isinstance(config, dict) else []
    if parts and isinstance(config.get("text_config"), dict):
        parts.append(("text_config.", config["text_config"]))
    return parts


def _size_error(path: Path, field: str, value: Any) -> ModelLoadError:
    """The one line for a size field that is not a whole number of at least 1, with the value the weights imply."""
    name = field.rpartition(".")[2]
    held = _implied_size(path, name)
    to = f"{held[0]}, {held[1]}" if held else "a whole number of at least 1, the value the weights were made with"
    shown = "null" if value is None else json.dumps(value) if isinstance(value, (bool, str)) else repr(value)
    return ModelLoadError(f"{path / 'config.json'} gives {field} {shown[:60]}, but it must be a whole number of "
                          "at least 1", f'set "{name}" in config.json to {to}')


def _implied_size(path: Path, field: str) -> tuple[int, str] | None:
    """The value of ``field`` the directory's safetensors headers imply, with where it comes from, or None."""
    if field in _POSITION_FIELDS:
        rows = _position_rows_held(path)
        return (rows, "the rows of the weights' position table") if rows else None
    if field in _WIDTH_FIELDS:
        shapes = _header_shapes(path, _EMBEDDINGS)
        return (shapes[0][1], "the width of the weights' embedding") if len(shapes) == 1 else None
    if field == "vocab_size":
        shapes = _header_shapes(path, _EMBEDDINGS)
        return (shapes[0][0], "the rows the weights' embedding holds") if len(shapes) == 1 else None
    if field in _LAYER_COUNT_KEYS:
        try:
            from safetensors import safe_open

            held = set()
            for file in sorted(path.glob("*.safetensors")):
                with safe_open(str(file), framework="pt") as f:
                    held.update(int(m.group(1)) for key in f.keys() if (m := _LAYER_KEY.search(key)))  # noqa: SIM118
        except Exception:
            return None
        return (max(held) + 1, "the layers the weights hold") if held else None
    return None


def _header_shapes(path: Path, tails: tuple[str, ...]) -> list[list[int]]:
    """The shapes of the 2-d tensors whose names end in one of ``tails``, from the safetensors headers."""
    try:
        from safetensors import safe_open

        found = []
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                    if key.endswith(tails) and len(shape := f.get_slice(key).get_shape()) == 2:
                        found.append([int(n) for n in shape])
    except Exception:  # an unreadable header: the load reports it
        return []
    return found


def refuse_null_size(path: Path, reason: str) -> None:
    """A size field set to ``null`` that transformers refused (its reason names the field): the size-field line,
    not a fix about ``layer_types``. A ``null`` it accepts (``n_inner``, ``head_dim``) never gets here."""
    config = _config_of(path)
    if config is None:
        return
    for where, part in _config_parts(config):
        for field in SIZE_FIELDS:
            if field in part and part[field] is None and re.search(rf"\b{field}\b", reason):
                raise _size_error(path, where + field, None)


def _position_rows_held(path: Path) -> int | None:
    """The rows of the learned position table in the directory's safetensors headers, where it has one."""
    try:
        from safetensors import safe_open

        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                    if key.endswith(_POSITION_TABLES) and len(shape := f.get_slice(key).get_shape()) == 2:
                        return int(shape[0])
    except Exception:  # an unreadable header: the load reports it
        return None
    return None


def layer_fields(path: Path) -> str:
    """The config.json fields that count layers, as a fix names them: ``num_hidden_layers`` and, where the
    config lists one entry per layer, ``layer_types`` too (changing one alone is refused by transformers)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except Exception:
        return "num_hidden_layers"
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    count = next((k for k in _LAYER_COUNT_KEYS if k in config), "num_hidden_layers")
    return f"{count} and layer_types" if isinstance(config.get("layer_types"), list) else count


_LAYER_KEY = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def refuse_more_layers_than_weights(path: Path) -> None:
    """A config.json asking for more layers than the safetensors hold, refused from the files' headers
    before the model is built: transformers would build (and randomly fill) every layer first, which for
    an absurd count takes minutes and all the memory before :func:`refuse_load_gaps` could say so. Files
    this cannot read, or weights without numbered layers, are left to the load and its checks."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        wanted = next((config[k] for k in _LAYER_COUNT_KEYS if isinstance(config.get(k), int)), None)
        files = sorted(path.glob("*.safetensors"))
        if wanted is None or not files:
            return
        from safetensors import safe_open

        held = set()
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                held.update(int(m.group(1)) for key in f.keys() if (m := _LAYER_KEY.search(key)))  # noqa: SIM118
    except Exception:  # an unreadable config or header: the load reports it
        return
    gaps = sorted(set(range(max(held) + 1)) - held) if held else []
    if gaps:  # no layer count skips a layer: one inside the held ones is missing from the weights themselves
        past = f", and config.json asks for {wanted:,} layers" if wanted is not None and wanted > max(held) + 1 else ""
        raise ModelLoadError(
            f"the weights in {path} lack layer{'s' if len(gaps) > 1 else ''} {_numbers(gaps)} (they hold layers "
            f"{_numbers(sorted(held))}{past}); those would be random", "re-export the model with all its weights: "
            f"layer {gaps[0]}'s tensors are missing from the safetensors, which no layer count in config.json can fill")
    if held and wanted > max(held) + 1:
        n = max(held) + 1
        lacking = f"layer {n}" if wanted == n + 1 else f"layers {n}–{wanted - 1}"
        if not _shapes_fit(path, n):  # a pruned model whose config lost its entry: no layer count would load it
            raise ModelLoadError(
                f"the weights in {path} lack {lacking} (config.json asks for {wanted:,} layers), and the layers they "
                "hold do not have the shapes config.json gives them", "use the config.json saved with these weights "
                "(a pruned model's has a mechkit_pruning entry), or re-export the directory")
        raise ModelLoadError(
            f"the weights in {path} lack {lacking}: config.json asks for {wanted:,} layers "
            f"and they hold {n}; those would be random", "re-export the model with all its weights, "
            f"or set {layer_fields(path)} in config.json to the {n} layer{'s' * (n > 1)} the weights hold")


def _shapes_fit(path: Path, n_layers: int) -> bool:
    """Whether every tensor the safetensors hold has the shape a model built from ``path``'s config with
    ``n_layers`` layers gives it (built on the meta device: no memory, no random values); True where that cannot
    be asked (a config transformers cannot build), so the layer count alone is said."""
    try:
        import torch
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        text = config.get_text_config()
        key = next(k for k in _LAYER_COUNT_KEYS if isinstance(getattr(text, k, None), int))
        setattr(text, key, n_layers)
        with torch.device("meta"), load_report_muted():
            shapes = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - no __iter__
                    if name in shapes and tuple(f.get_slice(name).get_shape()) != shapes[name]:
                        return False
    except Exception:  # noqa: BLE001 - not askable: the layer count is the finding
        return True
    return True


def _numbers(values: list[int], limit: int = 8) -> str:
    """``[0, 1, 3]`` as "0, 1, 3"; runs of three or more as ranges ("0–5, 7"), at most ``limit`` parts."""
    parts, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            run = values[start:i]
            parts += [f"{run[0]}–{run[-1]}"] if len(run) > 2 else [str(v) for v in run]
            start = i
    return ", ".join(parts[:limit]) + (", …" if len(parts) > limit else "")


def refuse_load_gaps(info: dict, path: Any) -> None:
    """Refuse a load whose report (``from_pretrained(..., output_loading_info=True)``) shows tensors the
    config needs that the weights lack (randomly initialised), tensors of the wrong shape, or tensors the
    config has no place for (weights silently dropped: a config with fewer layers than the weights)."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    layers = layer_fields(path) if isinstance(path, Path) else "num_hidden_layers"
    if missing:
        _refuse_misindexed(path, missing)
        # an untied head whose weights were saved tied: the field to fix is the tie, not the layer count
        field = "tie_word_embeddings: true, so the head shares the embedding" if missing == ["lm_head.weight"] \
            else layers
        raise ModelLoadError(
            f"the weights in {path} lack {len(missing)} tensor(s) its config.json needs (first: {missing[0]}); "
            "they would be random", "re-export the model with all its weights" + (
                f", or set {field}" if missing == ["lm_head.weight"] else
                f"; where the config asks for more layers than the weights hold, set {field} to the layers they hold"))
    if mismatched:
        raise ModelLoadError(
            f"{len(mismatched)} tensor(s) in {path} have another shape than config.json says (first: {mismatched[0]})",
            "fix config.json (hidden_size, heads, vocab_size) to match the weights, or re-export the model")
    if unexpected:
        raise ModelLoadError(
            f"the weights in {path} hold {len(unexpected)} tensor(s) its config.json has no place for "
            f"(first: {unexpected[0]}); they would be ignored",
            f"re-export the model; where the weights hold more layers than the config asks for, set {layers} to "
            "the layers they hold")


def _refuse_misindexed(path: Any, missing: list[str]) -> None:
    """A tensor the load found missing that a file of the directory does hold: the shard index maps it to another
    file. "They lack lm_head.weight ... or set tie_word_embeddings: true" had a user load the embedding as the head
    while the stored head sat in another shard."""
    if not isinstance(path, Path) or not (path / "model.safetensors.index.json").is_file():
        return
    try:
        from safetensors import safe_open

        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                held = next((name for name in missing if name in f.keys()), None)  # noqa: SIM118
            if held is not None:
                raise ModelLoadError(
                    f"{path / 'model.safetensors.index.json'} maps {held} to a file that lacks it, while {file.name} "
                    "holds it", f'fix "weight_map" in model.safetensors.index.json to map {held} to '
                    f'"{file.name}" (or re-export the model with save_pretrained)')
    except ModelLoadError:
        raise
    except Exception:  # noqa: BLE001 - an unreadable header: the missing tensors are said as missing below
        return


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FN", "F8_E5M2FNUZ", "F8_E4M3FNUZ")


def refuse_non_float_weights(path: Path, model: Any) -> None:
    """Refuse a checkpoint that stores one of the model's floating-point parameters as integers or booleans,
    read from the safetensors headers: transformers casts it silently (an int8 or packed quantized tensor
    under a float name would be computed on as if its integers were the weights). Buffers stored that way
    (an old checkpoint's boolean attention mask) are not parameters and are left alone here; their values are
    :func:`refuse_file_buffers`' (run from here, the check every local load calls once its model is built)."""
    from safetensors import safe_open

    refuse_file_buffers(path, model)
    params = {name for name, p in model.named_parameters() if p.is_floating_point()}
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                names = f.keys()
                for key in names:  # noqa: SIM118 - no __iter__
                    dtype = f.get_slice(key).get_dtype()
                    if key in params and dtype not in _FLOAT_DTYPES:
                        raise ModelLoadError(
                            f"{file.name} in {path} stores {key} as {dtype}, not floating point: a quantized or "
                            "damaged checkpoint, which mechkit would compute on as if its integers were the weights",
                            "load the original float weights, or dequantize and re-save them "
                            "(save_pretrained from a float model)")
        except ModelLoadError:
            raise
        except Exception:  # a header this cannot read: the load already read it, or reported it
            continue


def refuse_file_buffers(path: Path, model: Any) -> None:
    """Refuse a checkpoint holding a copy of one of the model's buffers with other values than the model has.
    transformers computes buffers such as ``rotary_emb.inv_freq`` from the config and drops the file's copy
    without a word (it is no "unexpected" tensor), so a file whose RoPE frequencies differ (``inv_freq = ones``:
    an edited or mislabelled checkpoint) was computed on with the config's. A copy is one under a buffer's own
    name, or under a legacy name transformers drops as the same buffer (:func:`_legacy_copies`: an old
    checkpoint's per-layer ``model.layers.0.self_attn.rotary_emb.inv_freq``, which loaded silently while the
    same values under ``model.rotary_emb.inv_freq`` were refused). Equal copies, up to the stored dtype's
    rounding (old checkpoints carry them), and buffers loaded from the file (the same values) pass."""
    from safetensors import safe_open

    buffers = {name: b for name, b in model.named_buffers() if b is not None and b.device.type != "meta"}
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    ignored = _ignored_patterns(model, buffers)
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                names = f.keys()
                for key in names:  # noqa: SIM118 - no __iter__
                    name = key if key in buffers else f"{prefix}.{key}" if f"{prefix}.{key}" in buffers else None
                    copies = [name] if name is not None else _legacy_copies(key, buffers, ignored)
                    if not copies:
                        continue
                    held = f.get_tensor(key)
                    if not any(_close(held, buffers[c].detach().cpu()) for c in copies):
                        raise ModelLoadError(
                            f"{file.name} in {path} holds {key} with other values (or shape) than the model "
                            f"computes for its buffer {copies[0]} from config.json; transformers would drop the "
                            "file's copy silently", "fix config.json (e.g. its rope settings) to give the values the "
                            f"weights were made with, or remove {key} from the file if it is stale")
        except ModelLoadError:
            raise
        except Exception:  # a file or tensor this cannot read: the load already read it, or reported it
            continue


def _ignored_patterns(model: Any, buffers: dict) -> Any:
    """The file names transformers drops without a word when loading ``model`` (its
    ``_adjust_missing_and_unexpected_keys``): the model's ``_keys_to_ignore_on_load_unexpected`` patterns, and
    old checkpoints' per-layer ``rotary_emb.inv_freq`` and persistent ``position_ids`` where the model has such
    buffers. A compiled pattern, or None."""
    own = getattr(model, "_keys_to_ignore_on_load_unexpected", None)  # transformers gathers its submodels' here
    patterns = {str(p) for p in own} if isinstance(own, set | list | tuple) else set()
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        patterns.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        patterns.add(r"(^|\.)position_ids$")
    try:
        return re.compile("|".join(f"({p})" for p in sorted(patterns))) if patterns else None
    except re.error:  # a pattern transformers itself could not compile either
        return None


def _legacy_copies(key: str, buffers: dict, ignored: Any) -> list[str]:
    """The model's buffers a file tensor ``key`` that transformers drops (``ignored``) is an old copy of: every
    ``…rotary_emb.inv_freq`` for a rotary embedding's frequencies stored at any depth, else the buffers of the
    same last name (``original_inv_freq``, ``position_ids``). A dropped tensor of no buffer's name (a
    multi-token-prediction layer's weights) is none."""
    if ignored is None or key in buffers or ignored.search(key) is None:
        return []
    tail = "rotary_emb.inv_freq" if key.endswith("rotary_emb.inv_freq") else key.rsplit(".", 1)[-1]
    return sorted(name for name in buffers if name == tail or name.endswith("." + tail))


def _close(held: Any, ours: Any) -> bool:
    """Equal up to the rounding of the coarser of the two dtypes (a float16 copy of float32 frequencies)."""
    import torch

    if held.shape != ours.shape:
        return False
    eps = max(torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0 for t in (held, ours))
    wide = torch.complex128 if held.is_complex() or ours.is_complex() else torch.float64
    a, b = held.to(wide), ours.to(wide)
    return bool(torch.equal(a, b)) or bool(torch.allclose(a, b, rtol=4 * eps, atol=0.0, equal_nan=True))


def refuse_meta_weights(model: Any, label: Any) -> None:
    """Refuse a model object whose parameters have no data (built on the ``meta`` device, never loaded) and
    that no accelerate hook fills: there is nothing to compute on."""
    name = next((n for n, p in model.named_parameters() if p.device.type == "meta"), None)
    if name is not None:
        raise ModelLoadError(f"the model {label} has no weights in {name} (a meta tensor: built without data)",
                             "load its weights first (from_pretrained, or load_state_dict(..., assign=True)), "
                             "or pass the model directory to mk.load_model")


def _not_a_load_report(record: logging.LogRecord) -> bool:
    return "LOAD REPORT" not in str(record.msg)


@contextlib.contextmanager
def load_report_muted() -> Iterator[None]:
    """transformers' load table off: :func:`refuse_load_gaps` says what it would, in one line. The table is
    logged through the caller's logger (``transformers.modeling_utils``), not its own module's, so both get
    a filter that drops it and nothing else."""
    report = logging.getLogger(_LOAD_REPORT)
    level, report.disabled = report.disabled, True
    loggers = [logging.getLogger(name) for name in _LOAD_REPORT_LOGGERS]
    for logger in loggers:
        logger.addFilter(_not_a_load_report)
    try:
        yield
    finally:
        report.disabled = level
        for logger in loggers:
            logger.removeFilter(_not_a_load_report)


def refuse_non_finite_weights(model: Any, label: Any) -> None:
    """Refuse a model holding NaN or inf in a parameter held in memory (offloaded ones are not read back), or
    NaN in a floating buffer (``rotary_emb.inv_freq``): every forward's logits would be NaN, and a run then
    failed at its end as "the plugin left the model changed" (NaN equals nothing). Infinities in buffers are
    left alone: some models keep -inf masks there on purpose."""
    import torch

    for name, t in model.named_buffers():
        if t is None or t.device.type == "meta" or not (t.is_floating_point() or t.is_complex()):
            continue
        if bool(torch.isnan(t).any()):
            raise ModelLoadError(f"the model {label} has NaN values in its buffer {name}",
                                 "the model object is damaged (an edit or a bad conversion wrote NaN there): "
                                 "rebuild or reload it from its original weights, or put the buffer's values back")

    for name, t in model.named_parameters():
        if t.device.type == "meta" or not (t.is_floating_point() or t.is_complex()):
            continue
        if not bool(torch.isfinite(t).all()):
            what = "NaN" if bool(torch.isnan(t).any()) else "inf"
            if what == "inf" and t.dtype == torch.float16:  # most likely finite weights past float16's range
                raise ModelLoadError(f"the model {label} has inf values in {name} in float16: weights beyond "
                                     "±65504 (float16's range) become inf when cast to it",
                                     "load it in bfloat16 or float32 (--dtype bfloat16, dtype=\"bfloat16\"); if it "
                                     "still has inf values there, its weights are damaged")
            raise ModelLoadError(f"the model {label} has {what} values in {name}",
                                 "its weights are damaged (a diverged fine-tune, a bad conversion): "
                                 "use the original weights or re-export them")


def weights_checksums(model: Any) -> dict[str, int]:
    """A cheap, exact fingerprint of every parameter held in memory: the sum of its raw bits weighted by
    position (on its own device, one parameter at a time). Any change of any entry changes its sum, except
    for changes that cancel modulo 2**63 (not a plugin bug's pattern); restoring the exact bits restores it.
    Offloaded (meta) parameters are not read."""
    import torch

    weights: dict[torch.device, torch.Tensor] = {}
    with torch.no_grad():
        return {name: tensor_checksum(t, weights) for name, t in model.named_parameters() if t.device.type != "meta"}


def tensor_checksum(t: Any, weights: dict | None = None) -> int:
    """One tensor's :func:`weights_checksums` sum (its raw bits weighted by position); ``weights`` keeps the
    position weights made per device across calls. A complex tensor is read as its real and imaginary parts
    (a complex128 entry has no integer type of its size)."""
    import torch

    weights = {} if weights is None else weights
    flat = t.detach().contiguous().view(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    raw = flat.view(bits)
    if raw.device not in weights:  # position i weighs (i + 1) % 65521 + 1: a chunk of whole periods repeats it
        size = _PERIOD * (4 if raw.device.type == "cpu" else 256)
        weights[raw.device] = torch.arange(1, size + 1, device=raw.device, dtype=torch.int64) % _PERIOD + 1
    w = weights[raw.device]
    total = torch.zeros((), dtype=torch.int64, device=raw.device)  # int64 wraps as one whole sum would
    for start in range(0, raw.numel(), w.numel()):  # in cache-sized chunks: ~5x faster than at once on a CPU
        part = raw[start:start + w.numel()]
        total += (part.to(torch.int64) * w[:part.numel()]).sum()
    return int(total)


_PERIOD = 65521  # the largest prime below 2**16: the weights of neighbouring entries never coincide


def changed_weight(before: dict[str, int], after: dict[str, int]) -> str | None:
    """The first parameter whose checksum differs (or that appeared or vanished), else None."""
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            return name
    return None


def refuse_shard_gaps(path: Path) -> None:
    """A sharded directory whose index names a shard file that is not there, or that also holds a single
    ``model.safetensors``: refused naming the files. transformers loads ``model.safetensors`` and ignores the
    shards (two weight sets, one silently dropped), and a missing shard was refused as missing layers, with
    a fix (fewer layers in config.json) that would have computed on part of the model."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return
    if (path / "model.safetensors").is_file():
        raise ModelLoadError(f"{path} holds two sets of weights: model.safetensors and the shards "
                             "model.safetensors.index.json names; transformers would load the first and ignore "
                             "the shards", "remove the set that is not this model's (model.safetensors, or the "
                             "index and its shards)")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except Exception:  # an index this cannot read: the load reports it
        return
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index}: its weight_map is not an object of tensor name -> shard file name",
                             "re-export the model (save_pretrained writes the index with its shards)")
    shards = sorted(set(weight_map.values()))
    refuse_shards_elsewhere(path, shards)
    missing = [name for name in shards if not (path / str(name)).is_file()]
    if missing:
        raise ModelLoadError(f"{path} lacks {len(missing)} of the {len(shards)} shard files its "
                             f"model.safetensors.index.json names (first: {missing[0]})",
                             f"copy every shard the index names into {path} (a download or copy cut short), "
                             "or re-export the model")
    refuse_conflicting_copies(path, index)


def refuse_shards_elsewhere(path: Path, shards: list[str]) -> None:
    """An index naming a shard by a path (``../other/model-00001.safetensors``, ``/abs/file.safetensors``)
    instead of a file name in the directory: refused. transformers joins the name to the directory, so the
    model would compute on weights from outside the directory the user named. A shard file in the directory
    that is a symlink (the hub cache's layout) is fine: the index still names it by its own name."""
    for name in shards:
        if not name or "/" in name or "\\" in name or name in (".", "..") or Path(name).is_absolute():
            raise ModelLoadError(f"{path}/model.safetensors.index.json names the shard {name!r}, a path rather "
                                 "than a file in the model's directory: the weights would come from outside it",
                                 f"put the shard files in {path} and name them by file name in the index, or "
                                 "re-export the model")


def refuse_conflicting_copies(path: Path, index: Path) -> None:
    """A tensor the index maps to one shard but that another ``.safetensors`` file in the directory also holds
    with other values (a shard of an older export, or a stray file): refused naming both. transformers reads
    the index's copy only, so which weights the model has would depend on a file nobody looks at. Identical
    copies and files of other names (a Mistral ``consolidated.safetensors``) are fine."""
    try:
        from safetensors import safe_open

        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        holders: dict[str, list[str]] = {}
        for file in sorted(p.name for p in path.glob("*.safetensors") if p.is_file()):
            with safe_open(str(path / file), framework="pt") as f:
                names = f.keys()
                for key in names:
                    holders.setdefault(key, []).append(file)
    except Exception:  # a file or index this cannot read: the load reports it
        return
    for key, files in holders.items():
        mapped = weight_map.get(key)
        for other in (f for f in files if f != mapped and mapped in files):
            if not _same_tensor(path, key, mapped, other):
                raise ModelLoadError(f"{path}: tensor {key} is in {mapped}, where model.safetensors.index.json "
                                     f"maps it, and with other values in {other}",
                                     f"remove {other} if it is left from another export, or re-export the model")


def _same_tensor(path: Path, key: str, a: str, b: str) -> bool:
    import torch
    from safetensors import safe_open

    with safe_open(str(path / a), framework="pt") as fa, safe_open(str(path / b), framework="pt") as fb:
        x, y = fa.get_tensor(key), fb.get_tensor(key)
    return x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))



_OPENED = (".json", ".safetensors", ".model", "merges.txt", "vocab.txt", ".jinja", ".bin", ".gguf")
"""The files of a model directory a load opens (config, weights, tokenizer, chat template): of the ``.txt`` files
only the tokenizer's (a FIFO a user keeps as ``notes.txt`` beside the weights was refused though never read)."""


def refuse_special_files(path: Path) -> None:
    """Refuse (one line) a model directory where a file the load opens is a FIFO, a device or a socket (itself
    or what its link points to): ``--model DIR`` with a FIFO as ``model.safetensors`` hung for ever in the
    first read of the headers, and one as ``config.json`` was reported "missing"."""
    import stat

    try:
        children = list(path.iterdir())
    except OSError:
        return  # the load says what is wrong with the directory itself
    for child in sorted(children):
        if not child.name.endswith(_OPENED):
            continue
        try:
            mode = child.stat().st_mode
        except OSError:
            continue  # a broken link: the load reports the file missing
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ModelLoadError(f"{child} is not a regular file (a FIFO, a device or a socket), and a model "
                                 "directory's files are read as files", f"replace {child.name} with the real file, "
                                 "or point --model at the directory that holds it")
