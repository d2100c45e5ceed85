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
module's unchanged ``original_inv_freq``; any other value is a change. Which of them it may hold depends on the
length the module records, compared with it in :mod:`.rope`.
"""

from __future__ import annotations

from typing import Any

from mechkit.model.checks.integrity import tensor_checksum
from mechkit.model.checks.rope import changed_rope, library_rope, rope_kinds, rope_state, rope_values


def buffer_state(model: Any) -> dict:
    """``{"sums": {name: checksum}, "library": {name: checksums transformers may leave there}, "rope": each dynamic
    RoPE's recorded length with its frequencies (:func:`~mechkit.model.checks.rope.rope_state`)}`` for every
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
                value, key = read_as_forward(m, name), f"{prefix}.{name}" if prefix else name
                if isinstance(value, torch.Tensor) and value.device.type != "meta":
                    sums[key] = tensor_checksum(value, weights)
                elif isinstance(value, str):  # what its class holds under the name: never transformers'
                    sums[key] = value
            for name, values in rope_values(m).items():
                library[f"{prefix}.{name}" if prefix else name] = {tensor_checksum(v, weights) for v in values}
        rope = rope_state(model, weights)
    return {"sums": sums, "library": library, "rope": rope}


def changed_buffer(before: dict, after: dict) -> str | None:
    """The first buffer changed (or appeared, or vanished) to a value transformers' own forward would not leave
    there, or a dynamic RoPE's length and frequencies left as no forward leaves them, in words, else None."""
    was, now, library = before["sums"], after["sums"], after["library"]
    for name in sorted(set(was) | set(now)):
        if was.get(name) == now.get(name) or (name in now and now[name] in library.get(name, ())):
            continue
        if name not in now and name.endswith("long_inv_freq") and name in library:
            continue  # a LongRoPE's long set, dropped: its next long forward computes it afresh from the config
        what = ("was removed" if name not in now else f"was {now[name]}" if isinstance(now[name], str)
                else "was added" if name not in was else "holds other values")
        return f"its buffer {name} {what} and was not put back: every later forward reads it"
    return changed_rope(before.get("rope", {}), after.get("rope", {}))


def library_attrs(m: Any) -> list[str]:
    """The names under which a LongRoPE's forward keeps a tensor as a plain attribute of ``m`` (``long_inv_freq``:
    the long set it copies into ``inv_freq``), compared here by value, with the buffers, rather than by identity
    as other attributes are (:mod:`~mechkit.model.checks.state`): the first long forward sets it, and one
    dropped (deleted, or set to None) is computed afresh by the next."""
    if not library_rope(m):
        return []
    longrope = {f"{prefix}long_inv_freq" for prefix, _, kind in rope_kinds(m) if kind == "longrope"}
    return sorted(longrope | {name for name in vars(m) if name.endswith("long_inv_freq")})


def read_as_forward(m: Any, name: str) -> Any:
    """``m``'s ``name`` as transformers' ``getattr(self, name, None)`` reads it, without running any code: its
    own value; anything its class (or a base) holds under that name is no value transformers puts there, and is
    returned as words naming the class (refused as a change). A long set deleted with a tensor put on the class,
    or a property on the class (which wins over the module's own value), passed, and every later long forward
    read the class's."""
    on_class = next((c for c in type(m).__mro__ if name in vars(c)), None)
    if on_class is not None:
        return f"set on the class {on_class.__qualname__} ({type(vars(on_class)[name]).__name__})"
    return vars(m).get(name)
