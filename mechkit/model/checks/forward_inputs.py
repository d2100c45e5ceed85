"""Check the tensors a forward pass takes beside the token ids, so a wrong one is one line, not a wrong result.

transformers reads a 2-D ``attention_mask`` as "nonzero attends": an additive mask (0 to attend, ``-inf``
to hide, as PyTorch and TransformerLens write them) ran with the padding attended and the tokens hidden,
and exited 0; ``0.5`` or ``2`` ran as all ones. ``position_ids`` of floats, of another length or batch, a
3-D mask, labels or GPT-2's ``token_type_ids`` outside the vocabulary, a KV cache of another model or
batch, and ``inputs_embeds`` beside the ids all failed deep inside the model (RuntimeError, IndexError,
AttributeError; on a GPU a device-side assert). Each is refused here in one line naming the fix.

>>> import mechkit as mk, torch
>>> m = mk.load_model("tiny:llama")
>>> ids = m.to_tokens("hi you")
>>> additive = torch.zeros(ids.shape)
>>> additive[0, 0] = float("-inf")                   # hide the first token, PyTorch's way
>>> try:
...     m(ids, attention_mask=additive)
... except mk.MechkitError as err:
...     print(str(err).split(":")[0])
attention_mask holds -inf, which is neither 0 nor 1
"""

from __future__ import annotations

from typing import Any

import torch

from mechkit.errors import MechkitError
from mechkit.model.checks.memo import remember, seen

MASK_FIX = "pass one mask value per token: torch.ones_like(ids) with 0 at padding"
IGNORE_INDEX = -100  # transformers' loss skips labels of this value


def normalise_positions(ids: torch.Tensor, kwargs: dict) -> None:
    """A 1-D ``position_ids`` of the ids' length becomes ``[1, pos]``: GPT-2 took it, Llama's rotary
    embedding failed on it (a RuntimeError); both now run it as the one row it is."""
    positions = kwargs.get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.dim() == 1 and positions.shape[0] == ids.shape[1]:
        kwargs["position_ids"] = positions.unsqueeze(0)


def check_positions(ids: torch.Tensor, positions: Any, model: Any = None) -> None:
    """``position_ids``: an integer tensor ``[batch or 1, pos]`` (3-D only for a model with multimodal
    rotary sections)."""
    fix = "pass position_ids as torch.arange(ids.shape[1]).unsqueeze(0) (one integer per token), or leave them out"
    if not isinstance(positions, torch.Tensor):
        raise MechkitError(f"position_ids must be a tensor of integers, not {type(positions).__name__}", fix)
    refuse_no_values("position_ids", positions, fix)
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise MechkitError(f"position_ids must be integers, not {str(positions.dtype).removeprefix('torch.')}", fix)
    batch, pos = ids.shape
    rows_ok = positions.dim() == 2 or (positions.dim() == 3 and _multimodal_rotary(model))
    if not rows_ok or positions.shape[-1] != pos or positions.shape[-2] not in (1, batch):
        raise MechkitError(f"position_ids have shape {tuple(positions.shape)}, not the token ids' {tuple(ids.shape)}",
                           fix)


def check_mask(ids: torch.Tensor, mask: torch.Tensor, past: int, cached: bool) -> None:
    """A 2-D (or 1-D) mask holds only 0 and 1; a 4-D one is ``[batch or 1, heads or 1, pos, past + pos]``;
    other ranks are refused (transformers indexes a 3-D mask as if it were 2-D)."""
    refuse_no_values("attention_mask", mask, MASK_FIX)
    batch, pos = ids.shape
    if mask.dim() == 4:
        kv = mask.shape[3]
        if mask.shape[0] not in (1, batch) or mask.shape[2] != pos or (kv < past + pos if cached else kv != pos):
            raise MechkitError(f"a 4-D attention_mask has shape {tuple(mask.shape)}, not [batch, 1, {pos}, "
                               f"{past + pos}] for these token ids{' and the cache' if past else ''}",
                               f"pass a 2-D mask instead ({MASK_FIX})")
        return
    if mask.dim() not in (1, 2):
        raise MechkitError(f"attention_mask has {mask.dim()} dimensions (shape {tuple(mask.shape)}); it is [batch, "
                           "pos], or a 4-D [batch, 1, pos, pos] mask", MASK_FIX)
    if mask.dtype == torch.bool:
        return
    if mask.is_complex():
        raise MechkitError(f"attention_mask must be 0 and 1, not {str(mask.dtype).removeprefix('torch.')}", MASK_FIX)
    if seen(mask, "mask01"):
        return  # the same mask through many forwards: its values checked once
    odd = (mask != 0) & (mask != 1)
    if bool(odd.any()):
        value = mask[odd].reshape(-1)[0].item()
        shown = float(value) if mask.is_floating_point() else int(value)
        additive = mask.is_floating_point() and bool(torch.isinf(mask).any() | (mask < 0).any())
        raise MechkitError(f"attention_mask holds {shown if shown == shown else 'nan'}, which is neither 0 nor 1 (a 2-D "
                           "mask is 1 at tokens and 0 at padding)" if not additive else
                           f"attention_mask holds {shown}, which is neither 0 nor 1: an additive mask (0 to attend, "
                           "-inf to hide) would run inverted, as transformers reads nonzero as 'attend'", MASK_FIX)
    remember(mask, "mask01")


def check_per_token(ids: torch.Tensor, kwargs: dict, n_vocab: int | None, model: Any = None) -> None:
    """``labels`` and ``token_type_ids``: integer tensors of the ids' shape, of ids the model embeds."""
    for name in ("labels", "token_type_ids"):
        value = kwargs.get(name)
        if value is None:
            continue
        fix = f"pass {name} as a tensor of integers shaped like the token ids, or leave it out"
        if not isinstance(value, torch.Tensor):
            raise MechkitError(f"{name} must be a tensor of integers, not {type(value).__name__}", fix)
        refuse_no_values(name, value, fix)
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise MechkitError(f"{name} must be integers, not {str(value.dtype).removeprefix('torch.')}", fix)
        if value.dim() != 2 or value.shape[1] != ids.shape[1] or value.shape[0] not in (1, ids.shape[0]) or (
                name == "labels" and value.shape[0] != ids.shape[0]):
            raise MechkitError(f"{name} have shape {tuple(value.shape)}, not the token ids' {tuple(ids.shape)}", fix)
        bound = _type_rows(model, n_vocab) if name == "token_type_ids" else n_vocab
        if value.numel() == 0 or bound is None:
            continue
        kept = value[value != IGNORE_INDEX] if name == "labels" else value
        if kept.numel() == 0:
            continue
        low, high = (int(v) for v in torch.aminmax(kept))
        if low < 0 or high >= bound:
            bad = low if low < 0 else high
            raise MechkitError(f"{name} holds {bad}, outside 0 to {bound - 1}"
                               + (f" (or {IGNORE_INDEX}, which the loss skips)" if name == "labels" else ""), fix)


def check_logits_to_keep(value: Any, n_tokens: int | None = None) -> None:
    """``logits_to_keep``: how many last positions get logits (0: all), or a 1-D tensor of positions. A
    negative count kept all but the first positions, silently."""
    fix = "pass logits_to_keep=N (the last N positions; 0 for all), or leave it out"
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise MechkitError(f"logits_to_keep must be a count of positions, not {type(value).__name__}", fix)
    if isinstance(value, int) and value < 0:
        raise MechkitError(f"logits_to_keep is {value}, and a count of positions is 0 or more", fix)
    if isinstance(value, torch.Tensor) and (value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool):
        raise MechkitError(f"logits_to_keep as a tensor must be 1-D integer positions, not {value.dtype} of shape "
                           f"{tuple(value.shape)}", fix)
    if isinstance(value, torch.Tensor) and n_tokens is not None and value.numel():
        refuse_no_values("logits_to_keep", value, fix)
        low, high = (int(v) for v in torch.aminmax(value))  # positions past the ids: an IndexError deep inside
        if low < -n_tokens or high >= n_tokens:
            raise MechkitError(f"logits_to_keep holds position {low if low < -n_tokens else high}, outside the "
                               f"{n_tokens} tokens (0 to {n_tokens - 1}, or -{n_tokens} to -1 from the end)", fix)


def check_inputs_embeds(kwargs: dict) -> None:
    if kwargs.get("inputs_embeds") is not None:
        raise MechkitError("inputs_embeds cannot be given with the token ids, which the model handle always passes",
                           "replace the embeddings with a hook on blocks.0.hook_resid_pre (mk.hooks), or call "
                           "m.model(inputs_embeds=...) yourself")


def check_cache(ids: torch.Tensor, cache: Any, anatomy: Any = None) -> None:
    """A KV cache is a transformers ``Cache`` of this model (its layers, KV heads and head size) and of the
    ids' batch: another model's or batch's cache failed in ``torch.cat`` deep inside attention."""
    fix = ("pass the cache an earlier forward of this model returned for these sequences "
           "(m.forward(ids, use_cache=True)), or leave it out")
    if not hasattr(cache, "get_seq_length"):
        raise MechkitError(f"the KV cache must be a transformers Cache (what m.forward(ids, use_cache=True) returns), "
                           f"not {type(cache).__name__}", fix)
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        return
    filled = [(i, layer.keys) for i, layer in enumerate(layers)
              if isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.dim() == 4 and layer.keys.numel()]
    n_layers = getattr(anatomy, "n_layers", None)
    if isinstance(n_layers, int) and filled and filled[-1][0] >= n_layers:
        raise MechkitError(f"the KV cache holds {filled[-1][0] + 1} layers, and this model has {n_layers}: it is "
                           "another model's cache", fix)
    for i, keys in filled:
        if keys.shape[0] != ids.shape[0]:
            raise MechkitError(f"the KV cache holds {keys.shape[0]} sequences, and the token ids {ids.shape[0]}", fix)
        want = _kv_shape(anatomy, i)
        if want is not None and (keys.shape[1], keys.shape[3]) != want:
            raise MechkitError(f"the KV cache's layer {i} holds {keys.shape[1]} KV heads of size {keys.shape[3]}, and "
                               f"this model's {want[0]} of size {want[1]}: it is another model's cache", fix)


def _kv_shape(anatomy: Any, layer: int) -> tuple[int, int] | None:
    try:
        heads, size = anatomy.kv_heads_in(layer), anatomy.head_size(layer)
    except Exception:  # an anatomy that cannot say (a family of another attention layout): nothing to compare
        return None
    return (heads, size) if isinstance(heads, int) and isinstance(size, int) else None


def _type_rows(model: Any, n_vocab: int | None) -> int | None:
    """How many token types a model embeds: ``type_vocab_size``, else (GPT-2 embeds them with the tokens)
    the vocabulary."""
    rows = getattr(getattr(model, "config", None), "type_vocab_size", None)
    return rows if isinstance(rows, int) and rows > 0 else n_vocab


def _multimodal_rotary(model: Any) -> bool:
    config = getattr(model, "config", None)
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    return "mrope_section" in str(rope)


def refuse_no_values(name: str, value: torch.Tensor, fix: str) -> None:
    if value.device.type == "meta":
        raise MechkitError(f"{name} is on the meta device (no values)", fix)
    if value.layout != torch.strided:
        raise MechkitError(f"{name} must be a plain (dense) tensor, not a sparse one", f"{fix} (.to_dense())")
