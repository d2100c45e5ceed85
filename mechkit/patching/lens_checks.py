"""What :func:`~mechkit.patching.logit_lens` and :func:`~mechkit.patching.direct_logit_attribution` check
before they compute: one :class:`MechkitError` line for a cache that lacks a name they read, was recorded on
another model, or holds no tensor there; a position outside the recorded prompt; an answer token outside
the unembedding. Without these a negative token id or a cache of another model of the same width gives a
result silently computed on the wrong thing, and the rest fail as raw ``KeyError``/``IndexError``.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def lens_points(handle: ModelHandle) -> list[str]:
    """The concrete names :func:`logit_lens` reads."""
    n = handle.anatomy.n_layers
    return [f"blocks.{L}.hook_resid_pre" for L in range(n)] + [f"blocks.{n - 1}.hook_resid_post"]


def dla_points(handle: ModelHandle) -> list[str]:
    """The concrete names :func:`direct_logit_attribution` reads."""
    n = handle.anatomy.n_layers
    per_layer = [f"blocks.{L}.{s}" for s in ("attn.hook_z", "hook_attn_out", "hook_mlp_out") for L in range(n)]
    return ["blocks.0.hook_resid_pre", *per_layer, f"blocks.{n - 1}.hook_resid_post"]


def checked_cache(handle: ModelHandle, cache: Any, needed: list[str], who: str, names_fn: str) -> dict:
    """``{name: tensor}`` for ``needed``, read once from ``cache`` (a mechkit ``Cache``, a dict of tensors or a
    TransformerLens ``ActivationCache``), refused in one line where it cannot be what ``handle`` recorded."""
    fix = f"record them: from mechkit.patching import {names_fn}; _, cache = mk.run_with_cache(m, ids, {names_fn}(m))"
    if not (hasattr(cache, "__getitem__") and hasattr(cache, "keys")):
        raise MechkitError(f"{who} takes a recording (mk.run_with_cache's cache), not {type(cache).__name__}", fix)
    recorded = getattr(cache, "handle", None)
    if recorded is not None and not same_model(recorded, handle):
        other = "another model of that class" if recorded.spec == handle.spec else handle.spec
        raise MechkitError(f"this cache was recorded on {recorded.spec}, not on {other}",
                           f"pass the model it was recorded on, or record on {handle.spec}")
    keys = set(cache.keys())
    missing = [n for n in needed if n not in keys]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise MechkitError(f"{who} needs hook points the cache lacks: {shown}", fix)
    acts = {name: cache[name] for name in needed}
    for name, act in acts.items():
        if not isinstance(act, torch.Tensor) or act.ndim < 3:
            what = f"shape {list(act.shape)}" if isinstance(act, torch.Tensor) else f"a {type(act).__name__}"
            raise MechkitError(f"the cache holds {what} at {name}, not a [batch, pos, ...] activation", fix)
    _one_run(handle, acts, fix)
    width = acts[needed[-1]].shape[-1]
    if width != handle.anatomy.d_model:
        raise MechkitError(f"the cache's residual stream is {width} wide; {handle.spec}'s is "
                           f"{handle.anatomy.d_model}: it was recorded on another model", "pass the model it was recorded on")
    return acts


def _one_run(handle: ModelHandle, acts: dict, fix: str) -> None:
    """The activations are of one run: one batch and one prompt length everywhere, and each ``attn.hook_z``
    holds its layer's heads. A dict assembled from two runs broadcast silently (a batch of 2 beside one of 1),
    read another position at ``pos=-1``, or gave a head sum of the wrong heads; a flattened ``hook_z`` failed
    inside ``torch.stack``."""
    first_name, first = next(iter(acts.items()))
    for name, act in acts.items():
        if act.shape[:2] != first.shape[:2]:
            raise MechkitError(f"the cache holds {list(act.shape[:2])} (batch, positions) at {name} but "
                               f"{list(first.shape[:2])} at {first_name}: they are not of one run", fix)
        if name.endswith(".attn.hook_z"):
            layer = int(name.split(".")[1])
            heads, size = handle.anatomy.heads_in(layer), handle.anatomy.head_size(layer)
            if act.ndim != 4 or act.shape[2:] != (heads, size):
                raise MechkitError(f"the cache holds shape {list(act.shape)} at {name}, not [batch, pos, {heads} "
                                   f"heads, {size}] (this model's heads in layer {layer})", fix)


def same_model(recorded: Any, handle: ModelHandle) -> bool:
    """The recording's model is ``handle``'s: the same handle or module, or loaded from the same spec (an
    in-memory model's spec, ``<object LlamaForCausalLM>``, names only its class: it takes the same module)."""
    if recorded is handle or getattr(recorded, "model", None) is handle.model:
        return True
    where, here = getattr(recorded, "source", None), handle.source
    if where is not None and here is not None and _real(where) == _real(here):
        return True  # one directory named two ways ("dense", "./dense/", a symlink to it)
    spec = getattr(recorded, "spec", None)
    return spec == handle.spec and not str(spec).startswith("<")


def _real(path: Any) -> Path:
    return Path(path).expanduser().resolve()


def as_integer(value: Any) -> Any:
    """``value`` as a Python int where it is one integer (a one-element integer tensor, a NumPy integer);
    anything else as it was, to be refused by the caller (a bool is not a position or a token)."""
    if isinstance(value, torch.Tensor):
        return int(value) if value.numel() == 1 and not value.is_floating_point() and value.dtype != torch.bool else value
    if isinstance(value, int):  # bool included: refused by the caller
        return value
    if type(value).__name__.startswith(("int", "uint")) and hasattr(value, "__index__"):  # numpy.int64 and kin
        return operator.index(value)
    return value


def checked_pos(pos: Any, length: int, who: str, name: str = "pos") -> int:
    """``pos`` as an index into ``length`` recorded positions (negative counts from the end); ``name`` is the
    argument's (``answer_pos`` in patching)."""
    pos = as_integer(pos)
    if isinstance(pos, bool) or not isinstance(pos, int):
        raise MechkitError(f"{who}: {name} must be one integer position, not {pos!r}"[:200],
                           f"pass {name}=-1 (the last token) or another index; call it once per position")
    if not -length <= pos < length:
        raise MechkitError(f"{who}: {name}={pos} is outside the recorded prompt of {length} tokens",
                           f"pass a position from {-length} to {length - 1}")
    return pos


def checked_token(handle: ModelHandle, token: Any, which: str, who: str) -> int:
    """An answer token id inside the unembedding (a negative id would silently read another row)."""
    token = as_integer(token)
    rows = handle.n_vocab_rows()
    if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (rows is not None and token >= rows):
        bound = f" below {rows}" if rows is not None else ""
        raise MechkitError(f"{who}: {which}={token!r} is not a token id of the model"[:200],
                           f"pass an integer id from 0{bound} (mechkit.patching.answer_id(m, ' Mary') gives a word's id)")
    return token
