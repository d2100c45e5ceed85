"""Check token ids before a forward pass, so a wrong input is one line and not an embedding's IndexError.

``handle(ids)`` is what every analysis and every user's notebook calls. Given text instead of ids, a list,
a float or bool tensor, an empty batch or an id outside the embedding, torch raises from deep inside the
model (``'str' object has no attribute 'to'``, ``index out of range in self``), and on a GPU a device-side
assert that poisons the process. Here each is refused in one line naming the fix; a list of ints and a 1-D
tensor are taken as one sequence, as TransformerLens takes them.

>>> import mechkit as mk, torch
>>> m = mk.load_model("tiny:llama")
>>> try:
...     m(torch.tensor([[1, 2, 10_000]]))
... except mk.MechkitError as err:
...     print(err)
token id 10000 is outside the model's vocabulary (0 to 258) — pass ids from m.to_tokens(text), or ids below 259
"""

from __future__ import annotations

from typing import Any

import torch

from mechkit.errors import MechkitError
from mechkit.model.checks.memo import remember, seen

FIX = "pass ids from m.to_tokens(text)"


def vocab_rows(model: torch.nn.Module) -> int | None:
    """How many token ids the model embeds: its input embedding's rows, else ``config.vocab_size``."""
    try:
        emb = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # a model class without the accessor
        emb = None
    rows = getattr(emb, "num_embeddings", None)
    if rows is None:
        rows = getattr(getattr(model, "config", None), "vocab_size", None)
    return rows if isinstance(rows, int) and rows > 0 else None


def checked_ids(input_ids: Any, n_vocab: int | None, tokenizer: Any = None) -> torch.Tensor:
    """``input_ids`` as a 2-D integer tensor ``[batch, pos]`` of ids in ``[0, n_vocab)``, or one line why not
    (naming the model's ``tokenizer`` where it is the one that gives such ids)."""
    if isinstance(input_ids, str):
        raise MechkitError("the model was given text, not token ids", f"{FIX} (or mk.run_with_cache(m, m.to_tokens(text)))")
    if isinstance(input_ids, (list, tuple)):
        input_ids = _from_list(input_ids)
    if not isinstance(input_ids, torch.Tensor):
        raise MechkitError(f"token ids must be a tensor of integers, not {type(input_ids).__name__}", FIX)
    if input_ids.is_nested:  # one tensor per sequence, of other lengths: torch has no min/max for it
        raise MechkitError("token ids must be a plain [batch, pos] tensor, not a nested tensor",
                           f"{FIX}, padded to one length (or one sequence at a time)")
    if input_ids.layout != torch.strided or input_ids.is_quantized:
        raise MechkitError(f"token ids must be a plain (dense) tensor, not a {'quantized' if input_ids.is_quantized else 'sparse'} one",
                           f"{FIX}, or convert with .to_dense().long()" if not input_ids.is_quantized else FIX)
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise MechkitError(f"token ids must be integers, not {str(input_ids.dtype).removeprefix('torch.')}",
                           f"{FIX}, or convert with .long()")
    if input_ids.dtype in _WIDE_UNSIGNED:  # torch has no min/max for them; ids fit int64 or are refused below
        input_ids = _unsigned_as_long(input_ids)
    if input_ids.dtype not in (torch.int64, torch.int32):  # uint8, int16...: the embedding takes only these
        input_ids = input_ids.long()
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise MechkitError(f"token ids must be [batch, pos] with at least one token, not shape {tuple(input_ids.shape)}",
                           FIX)
    if input_ids.device.type == "meta":
        raise MechkitError("token ids are on the meta device (no values)", FIX)
    if seen(input_ids, ("ids", n_vocab)):
        return input_ids  # checked before and unchanged since: no second pass (on a GPU, no second host sync)
    low, high = (int(v) for v in torch.aminmax(input_ids))
    bad = low if low < 0 else high if n_vocab is not None and high >= n_vocab else None
    if bad is not None:
        _refuse_tokenizer_beyond(bad, n_vocab, tokenizer)
        bound = f"0 to {n_vocab - 1}" if n_vocab is not None else "0 or more"
        raise MechkitError(f"token id {bad} is outside the model's vocabulary ({bound})",
                           f"{FIX}, or ids below {n_vocab}" if n_vocab is not None else FIX)
    remember(input_ids, ("ids", n_vocab))  # the same ids through many forwards: range-checked once
    return input_ids


POSITION_NAMES = ("wpe", "embed_positions", "position_embeddings")  # learned absolute positions (GPT-2, OPT...)


def position_rows(model: torch.nn.Module) -> int | None:
    """How many positions a model with *learned* absolute position embeddings can take (GPT-2's 512);
    ``None`` for rotary or ALiBi models, which have no such table and no hard limit."""
    rows = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_NAMES:
            n = module.num_embeddings - int(getattr(module, "offset", 0) or 0)  # OPT keeps 2 rows before 0
            rows = n if rows is None else min(rows, n)
    return rows if rows is not None and rows > 0 else None


def check_forward_inputs(ids: torch.Tensor, n_positions: int | None, kwargs: dict, model: Any = None,
                         anatomy: Any = None, n_vocab: int | None = None) -> None:
    """One line for what would fail deep inside the model (an IndexError, or a device-side assert on a GPU)
    or run silently wrong: more tokens than a learned position table holds, ``position_ids`` outside it or
    not one integer per token, an ``attention_mask`` that is not 0/1 of the ids' shape ``[batch, pos]`` (or
    a 4-D mask of the ids' and cache's sizes), a KV cache of another model or batch, ``labels`` and
    ``token_type_ids`` of another shape or outside the vocabulary (:mod:`mechkit.model.checks.forward_inputs`)."""
    from mechkit.model.checks import forward_inputs as fi
    from mechkit.model.compat import cache_in

    fi.check_inputs_embeds(kwargs)
    cache = cache_in(kwargs)
    if cache is not None:
        fi.check_cache(ids, cache, anatomy)
    try:  # decoding step by step: the new tokens sit after the cached ones
        past = int(cache.get_seq_length()) if cache is not None else 0
    except Exception:  # a cache of another kind: its length is not ours to read
        past = 0
    if kwargs.get("position_ids") is not None:
        fi.check_positions(ids, kwargs["position_ids"], model)
    fi.check_per_token(ids, kwargs, n_vocab, model)
    if "logits_to_keep" in kwargs:
        fi.check_logits_to_keep(kwargs["logits_to_keep"], ids.shape[1])
    if n_positions is not None and past + ids.shape[1] > n_positions:
        held = f" after the {past} cached" if past else ""
        raise MechkitError(f"{ids.shape[1]} tokens{held} are more than the model's {n_positions} positions "
                           "(it learned one embedding per position)",
                           f"pass at most {n_positions} tokens per sequence, cache included: shorter text, fewer "
                           "--shots or a shorter --prompt/--clean where a command builds it, or a model with a "
                           "longer context")
    positions = kwargs.get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.numel() and not positions.is_floating_point():
        low, high = (int(v) for v in torch.aminmax(positions))
        if low < 0 or (n_positions is not None and high >= n_positions):
            bound = f"0 to {n_positions - 1}" if n_positions is not None else "0 or more"
            raise MechkitError(f"position id {low if low < 0 else high} is outside the model's positions ({bound})",
                               "pass position_ids in that range, or leave them out")
    mask = kwargs.get("attention_mask")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise MechkitError(f"attention_mask must be a tensor, not {type(mask).__name__}",
                           "pass torch.ones_like(ids) with 0 at padding, or leave it out")
    fi.refuse_no_values("attention_mask", mask, fi.MASK_FIX)
    shape = tuple(mask.reshape(1, -1).shape if mask.dim() == 1 else mask.shape)
    cached = cache is not None  # decoding step by step: the mask covers the past too
    if mask.dim() <= 2 and (shape[0] != ids.shape[0] or (shape[1] < ids.shape[1] if cached else shape[1] != ids.shape[1])):
        raise MechkitError(f"attention_mask has shape {tuple(mask.shape)}, not the token ids' {tuple(ids.shape)}",
                           "pass one mask value per token: torch.ones_like(ids) with 0 at padding")
    fi.check_mask(ids, mask, past, cached)


def _refuse_tokenizer_beyond(bad: int, n_vocab: int | None, tokenizer: Any) -> None:
    """An id past the embedding that the model's own tokenizer gives (a token added to the tokenizer, or the
    tokenizer of another model beside these weights): "pass ids from m.to_tokens(text)" would be no fix,
    since they came from it."""
    try:
        size = len(tokenizer) if tokenizer is not None else 0
    except TypeError:
        return
    if n_vocab is None or not 0 <= bad < size or size <= n_vocab:
        return
    try:
        token = repr(tokenizer.convert_ids_to_tokens(bad))
    except Exception:
        token = "a token"
    raise MechkitError(f"the model's tokenizer gives {token} id {bad}, but the model embeds only {n_vocab} ids: the "
                       f"tokenizer ({size} tokens) is not the one these weights were made with",
                       "use the tokenizer saved with these weights, or resize the embeddings "
                       "(model.resize_token_embeddings(len(tokenizer))) and fine-tune before analysing text with it")


_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))
_LONG_MAX = 2**63 - 1


def _unsigned_as_long(ids: torch.Tensor) -> torch.Tensor:
    """A uint16/32/64 tensor as int64; an id too large for int64 is refused (it is outside any vocabulary)."""
    if ids.dtype == getattr(torch, "uint64", None):
        big = [int(v) for v in ids.reshape(-1).tolist() if int(v) > _LONG_MAX]
        if big:
            raise MechkitError(f"token id {big[0]} is outside the model's vocabulary", FIX)
    return ids.to(torch.long)


def _from_list(ids: list | tuple) -> torch.Tensor:
    rows = [isinstance(row, (list, tuple)) for row in ids]
    if any(rows) and not all(rows):
        raise MechkitError("token ids given as lists must be one list of integers, or one list per sequence, "
                           "not a mix of both", FIX)
    flat = [i for row in ids for i in (row if isinstance(row, (list, tuple)) else [row])]
    if not flat or not all(isinstance(i, int) and not isinstance(i, bool) for i in flat):
        raise MechkitError("token ids given as a list must be integers (one list, or one list per sequence)", FIX)
    outside = next((i for i in flat if not -_LONG_MAX <= i <= _LONG_MAX), None)
    if outside is not None:  # torch.tensor would overflow: say what is wrong with the id
        raise MechkitError(f"token id {outside} is outside the model's vocabulary", FIX)
    try:
        return torch.tensor(ids, dtype=torch.long)
    except (ValueError, TypeError):
        raise MechkitError("token ids given as lists must have one length per batch", FIX) from None
