"""The model's buffers, for the unchanged check: what a forward reads besides the weights, checksummed.

A buffer is in no weight checksum and, read only by long inputs, in no probe's logits: a plugin that scaled a
dynamic RoPE's ``original_inv_freq`` in place passed every check, and every later forward past the model's
trained length computed with other frequencies (4.9e-3 off). Every buffer, persistent or not, is checksummed
here as the weights are (:func:`~mechkit.model.checks.integrity.tensor_checksum`: cheap and exact), before and
after a run.

One kind of buffer changes in an ordinary forward: transformers' ``dynamic_rope_update`` recomputes a rotary
embedding's ``inv_freq`` from the config when an input is longer than any before (dynamic RoPE), sets it back to
``original_inv_freq`` for a short one, and switches a LongRoPE's between its short and long sets. A plugin that
ran a long forward left the model as any caller's long forward leaves it. Such a buffer passes when its value is
one of those transformers would put there, computed afresh from the config (itself compared) and the
module's unchanged ``original_inv_freq``; any other value is a change.
"""

from __future__ import annotations

from typing import Any

from mechkit.model.checks.integrity import tensor_checksum


def buffer_state(model: Any) -> dict:
    """``{"sums": {name: checksum}, "library": {name: checksums transformers may leave there}}`` for every
    buffer held in memory (offloaded, meta ones are not read), under every name it has (after a dynamic RoPE's
    reset ``inv_freq`` and ``original_inv_freq`` are one tensor)."""
    import torch

    weights: dict = {}
    with torch.no_grad():
        sums = {name: tensor_checksum(b, weights) for name, b in model.named_buffers(remove_duplicate=False)
                if b is not None and b.device.type != "meta"}
        library: dict = {}
        for prefix, m in model.named_modules():
            for name in library_attrs(m):  # a LongRoPE's long set, kept as a plain attribute: read as a buffer
                sums[f"{prefix}.{name}" if prefix else name] = tensor_checksum(vars(m)[name], weights)
            for name, values in _rope_values(m).items():
                library[f"{prefix}.{name}" if prefix else name] = {tensor_checksum(v, weights) for v in values}
    return {"sums": sums, "library": library}


def changed_buffer(before: dict, after: dict) -> str | None:
    """The first buffer changed (or appeared, or vanished) to a value transformers' own forward would not leave
    there, in words, else None."""
    was, now, library = before["sums"], after["sums"], after["library"]
    for name in sorted(set(was) | set(now)):
        if was.get(name) == now.get(name) or (name in now and now[name] in library.get(name, ())):
            continue
        what = ("was removed" if name not in now else "was added" if name not in was else "holds other values")
        return f"its buffer {name} {what} and was not put back: every later forward reads it"
    return None


def library_attrs(m: Any) -> list[str]:
    """The tensors a LongRoPE's forward keeps as plain attributes of ``m`` (``long_inv_freq``: the long set it
    copies into ``inv_freq``), compared here by value, with the buffers, rather than by identity as other
    attributes are (:mod:`~mechkit.model.checks.state`): the first long forward sets it."""
    import torch

    if not _library_rope(m):
        return []
    return sorted(name for name, value in vars(m).items()
                  if name.endswith("long_inv_freq") and isinstance(value, torch.Tensor) and value.device.type != "meta")


def _rope_values(m: Any) -> dict:
    """``{buffer name: [values]}`` a rotary embedding wrapped by transformers' ``dynamic_rope_update`` may hold
    after a forward: its ``original_inv_freq`` (the reset, or a LongRoPE's short set), the frequencies a dynamic
    RoPE computes for the longest input seen (``max_seq_len_cached``), and a LongRoPE's long set."""
    if not _library_rope(m):
        return {}
    rope_type = getattr(m, "rope_type", None)
    kinds = rope_type.items() if isinstance(rope_type, dict) else [(None, rope_type)]
    found: dict = {}
    for layer_type, kind in kinds:
        prefix = f"{layer_type}_" if layer_type is not None else ""
        inv, original = getattr(m, f"{prefix}inv_freq", None), getattr(m, f"{prefix}original_inv_freq", None)
        if inv is None or original is None or not isinstance(kind, str):
            continue
        values = [original]
        try:
            if "dynamic" in kind:
                cached = getattr(m, f"{prefix}max_seq_len_cached", getattr(m, "max_seq_len_cached", None))
                values.append(_recomputed(m, kind, layer_type, inv.device, cached))
            elif kind == "longrope":
                values.append(_recomputed(m, kind, layer_type, inv.device, _long_length(m, layer_type)))
        except Exception:  # a config the function cannot read: only the reset is known
            pass
        found[f"{prefix}inv_freq"] = values
        if kind == "longrope" and len(values) > 1:
            found[f"{prefix}long_inv_freq"] = values[1:]
    return found


def _recomputed(m: Any, kind: str, layer_type: Any, device: Any, seq_len: Any) -> Any:
    """The frequencies transformers computes for ``seq_len`` (passed as it keeps it: a tensor after a growth,
    which the computation treats otherwise than an int), as ``dynamic_rope_update`` calls it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[kind](m.config, device, seq_len=seq_len, layer_type=layer_type)[0]


def _long_length(m: Any, layer_type: Any) -> int:
    """The length a LongRoPE computes its long frequencies for: one past its original trained length."""
    params = m.config.rope_parameters
    params = params[layer_type] if layer_type is not None else params
    return params["original_max_position_embeddings"] + 1


def _library_rope(m: Any) -> bool:
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
