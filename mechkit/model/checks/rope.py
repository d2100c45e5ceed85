"""A rotary embedding whose ``forward`` transformers wraps in ``dynamic_rope_update``: the state that forward
keeps and changes itself, checked for the unchanged check and set aside while it probes.

A dynamic RoPE remembers the longest input it has seen (``max_seq_len_cached``) with the frequencies computed
for it (``inv_freq``), and goes back to ``original_inv_freq`` and ``original_max_seq_len`` after an input
shorter than that trained length; what a later input computes depends on both. Two mistakes followed from
reading either apart. The probe's 16 tokens, no shorter than a trained length of 16, kept the frequencies a
plugin's ordinary 40-token forward had grown, and a plugin that changed nothing was refused on its logits;
and ``max_seq_len_cached`` set to 10**6 and left passed (it was taken for transformers' own bookkeeping),
while every later long forward stopped growing its frequencies. So here (:func:`changed_rope`) the pair is
compared with what transformers' own update leaves: the frequencies computed afresh from the config for the
length it records (after a growth), or ``original_inv_freq`` with ``original_max_seq_len`` (after a reset);
anything else is refused naming the field. And the probe runs each RoPE as loaded (:func:`ropes_as_loaded`),
then puts back what it held, so the logits before and after a run compare like with like.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mechkit.model.checks.integrity import tensor_checksum


def library_rope(m: Any) -> bool:
    """``m``'s class's ``forward`` is wrapped by transformers' own ``dynamic_rope_update`` (its inner function's
    code, in that module's namespace): a module that only names itself a rotary embedding is not exempt."""
    import sys
    import types

    rope = sys.modules.get("transformers.modeling_rope_utils")
    update = getattr(rope, "dynamic_rope_update", None)
    forward = getattr(type(m), "forward", None)
    if not isinstance(update, types.FunctionType) or not isinstance(forward, types.FunctionType):
        return False
    inner = [c for c in update.__code__.co_consts if isinstance(c, types.CodeType)]
    return forward.__code__ in inner and forward.__globals__ is vars(rope)


def rope_kinds(m: Any) -> list[tuple[str, Any, str]]:
    """``(attribute prefix, layer type, rope type)`` for each set of frequencies ``m`` keeps (one per layer
    type in a model such as gemma3), as ``dynamic_rope_update`` reads them."""
    rope_type = getattr(m, "rope_type", None)
    kinds = rope_type.items() if isinstance(rope_type, dict) else [(None, rope_type)]
    return [(f"{t}_" if t is not None else "", t, kind) for t, kind in kinds if isinstance(kind, str)]


def rope_attrs(m: Any) -> list[str]:
    """The plain attributes a dynamic RoPE's own forward writes on ``m`` (the longest length seen, the scaling it
    computed with it): compared here with the frequencies they go with, not by value alone."""
    if not library_rope(m):
        return []
    dynamic = [prefix for prefix, _, kind in rope_kinds(m) if "dynamic" in kind]
    return sorted({"max_seq_len_cached", "attention_scaling", *(f"{p}max_seq_len_cached" for p in dynamic)}) \
        if dynamic else []


def _cached(m: Any, prefix: str) -> Any:
    """The longest length ``m`` records for ``prefix``, read as ``dynamic_rope_update`` reads it."""
    return vars(m).get(f"{prefix}max_seq_len_cached", vars(m).get("max_seq_len_cached"))


def recomputed(m: Any, kind: str, layer_type: Any, device: Any, seq_len: Any) -> tuple[Any, Any]:
    """The frequencies and scaling transformers computes for ``seq_len`` (passed as it keeps it: a tensor after
    a growth, which the computation treats otherwise than an int), as ``dynamic_rope_update`` calls it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[kind](m.config, device, seq_len=seq_len, layer_type=layer_type)


def _long_length(m: Any, layer_type: Any) -> int:
    """The length a LongRoPE computes its long frequencies for: one past its original trained length."""
    params = m.config.rope_parameters
    params = params[layer_type] if layer_type is not None else params
    return params["original_max_position_embeddings"] + 1


def rope_values(m: Any) -> dict:
    """``{buffer name: [values]}`` a rotary embedding wrapped by transformers' ``dynamic_rope_update`` may hold
    after a forward: its ``original_inv_freq`` (the reset, or a LongRoPE's short set), the frequencies a dynamic
    RoPE computes for the longest input seen (``max_seq_len_cached``), and a LongRoPE's long set; each also cast to
    the buffer's dtype (a LongRoPE copies its float32 set into a bfloat16 ``inv_freq``: a plugin's plain long
    forward on a model loaded in bfloat16 was refused)."""
    if not library_rope(m):
        return {}
    found: dict = {}
    for prefix, layer_type, kind in rope_kinds(m):
        inv, original = getattr(m, f"{prefix}inv_freq", None), getattr(m, f"{prefix}original_inv_freq", None)
        if inv is None or original is None:
            continue
        values = [original]
        try:
            if "dynamic" in kind:
                values.append(recomputed(m, kind, layer_type, inv.device, _cached(m, prefix))[0])
            elif kind == "longrope":
                values.append(recomputed(m, kind, layer_type, inv.device, _long_length(m, layer_type))[0])
        except Exception:  # a config the function cannot read: only the reset is known
            pass
        cast = [v.to(inv.dtype) for v in values if v.dtype != inv.dtype]  # copied into a bf16 buffer, cast
        found[f"{prefix}inv_freq"] = values + cast
        if kind == "longrope" and len(values) > 1:
            found[f"{prefix}long_inv_freq"] = values[1:] + [v.to(inv.dtype) for v in values[1:]]
    return found


def _length(value: Any) -> Any:
    """A recorded length as an int (transformers keeps a 0-d integer tensor after a growth), else its repr:
    a value no forward writes, accepted only where it was already there."""
    import torch

    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
            and not value.is_complex() and value.dtype is not torch.bool and value.device.type != "meta":
        return int(value.item())
    return repr(value)


def rope_state(model: Any, weights: dict) -> dict:
    """``{"name.prefix": {...}}`` for each dynamic RoPE's set of frequencies in ``model``: its recorded length,
    the checksums of ``inv_freq``, ``original_inv_freq`` and of what transformers computes for that length,
    its scaling (and the one computed), and its ``original_max_seq_len``, for :func:`changed_rope`."""
    found: dict = {}
    for name, m in model.named_modules():
        if not library_rope(m):
            continue
        for prefix, layer_type, kind in rope_kinds(m):
            inv, original = getattr(m, f"{prefix}inv_freq", None), getattr(m, f"{prefix}original_inv_freq", None)
            if "dynamic" not in kind or inv is None or original is None or inv.device.type == "meta":
                continue
            cached = _cached(m, prefix)
            try:
                grown, scaling = recomputed(m, kind, layer_type, inv.device, cached)
                grown = tensor_checksum(grown, weights)
            except Exception:  # a length the function cannot take: no growth is known
                grown, scaling = None, None
            found[f"{name}.{prefix}"] = {
                "label": name or "the model", "prefix": prefix, "cached": _length(cached), "inv": tensor_checksum(inv, weights),
                "original": tensor_checksum(original, weights), "grown": grown, "grown_scaling": scaling,
                "scaling": vars(m).get("attention_scaling"), "limit": vars(m).get("original_max_seq_len")}
    return found


def changed_rope(before: dict, after: dict) -> str | None:
    """The first dynamic RoPE left in a state transformers' own forward does not leave, in words, else None:
    unchanged, reset (``original_inv_freq`` with ``original_max_seq_len``), or grown (the frequencies computed
    for a length past the one it started from, recorded as ``max_seq_len_cached``) are accepted."""
    for key, was in before.items():
        now = after.get(key)
        if now is None:
            continue  # the module itself gone: compared with the modules
        label, prefix = now["label"], now["prefix"]
        if all(now[k] == was[k] for k in ("cached", "inv", "scaling")):
            continue
        limit = was["limit"]
        start = was["cached"] if isinstance(was["cached"], int) else limit
        reset = now["cached"] == limit and now["inv"] == now["original"]
        grown = isinstance(now["cached"], int) and isinstance(limit, int) and now["cached"] > min(start, limit) \
            and now["grown"] is not None and now["inv"] == now["grown"]
        if not (reset or grown):
            what = (f"{prefix}max_seq_len_cached was set to {now['cached']} (was {was['cached']})"
                    if now["cached"] != was["cached"] else f"{prefix}inv_freq was changed while "
                    f"{prefix}max_seq_len_cached stayed {now['cached']}")
            return (f"its rotary embedding {label}: {what}, a state no forward of transformers leaves (after a long "
                    f"input it holds the frequencies computed for that length, after one shorter than {limit} "
                    "original_inv_freq): every later long input computes otherwise")
        if now["scaling"] != was["scaling"] and now["scaling"] != now["grown_scaling"]:
            return (f"its rotary embedding {label}: attention_scaling was set to {now['scaling']!r} (was "
                    f"{was['scaling']!r}), not what transformers computes for its length: every later input "
                    "computes otherwise")
    return None


def _loaded_scaling(m: Any, kind: str, now: Any) -> Any:
    """The scaling ``m`` was built with (its rope type's, computed for no length), else ``now``."""
    try:
        return recomputed(m, kind, None, None, None)[1]
    except Exception:  # a config the function cannot read: left as it is
        return now


@contextmanager
def ropes_as_loaded(model: Any) -> Iterator[None]:
    """Run the body with every dynamic RoPE in ``model`` as loaded (``inv_freq`` a copy of ``original_inv_freq``,
    ``max_seq_len_cached`` its ``original_max_seq_len``), then put back every RoPE's buffers (objects and
    values: a LongRoPE writes its set in place), recorded lengths and scaling as they were: the probe's logits
    do not depend on the longest input a plugin (or the caller) ran, and the probe leaves no trace."""
    import torch

    saved = []
    for m in (model.modules() if hasattr(model, "modules") else ()):
        if not library_rope(m):
            continue
        buffers = {k: (b, b.detach().clone()) for k, b in m._buffers.items()
                   if k.endswith("inv_freq") and b is not None and b.device.type != "meta"}
        names = set(rope_attrs(m)) | {k for k in vars(m) if k.endswith("long_inv_freq")}
        saved.append((m, buffers, {k: vars(m)[k] for k in names if k in vars(m)}, names))
    try:
        with torch.no_grad():
            for m, buffers, _, _ in saved:
                for prefix, _, kind in rope_kinds(m):
                    original = buffers.get(f"{prefix}original_inv_freq")
                    limit = vars(m).get("original_max_seq_len")
                    if "dynamic" in kind and original is not None and f"{prefix}inv_freq" in buffers and limit:
                        m._buffers[f"{prefix}inv_freq"] = original[1].clone()
                        setattr(m, f"{prefix}max_seq_len_cached", limit)
                        if not prefix and "attention_scaling" in vars(m):
                            m.attention_scaling = _loaded_scaling(m, kind, m.attention_scaling)
        yield
    finally:
        with torch.no_grad():
            for m, buffers, attrs, names in saved:
                for k, (obj, values) in buffers.items():
                    m._buffers[k] = obj
                    if not torch.equal(obj, values):
                        obj.copy_(values)
                for k in names:
                    if k in attrs:
                        setattr(m, k, attrs[k])
                    else:
                        vars(m).pop(k, None)
