"""Check the keyword arguments of a forward pass, so a misspelt one is refused rather than ignored.

transformers' causal-LM ``forward`` ends in ``**kwargs`` (``TransformersKwargs``) and drops what it does not
know: ``mk.gradients(m, names, ids, metric, atention_mask=mask)`` ran without the mask and exited 0. Here
an argument that neither the model class's ``forward`` nor transformers' shared keyword arguments name is
one line listing what is accepted.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> try:
...     m(m.to_tokens("hi"), atention_mask=None)
... except mk.MechkitError as err:
...     print(str(err).split(" — ")[0])
LlamaForCausalLM's forward takes no argument atention_mask
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable

from mechkit.errors import MechkitError

ALWAYS = frozenset({"use_cache", "past_key_values", "cache", "attention_mask", "position_ids"})
"""Accepted whatever the signature says: mechkit's own calls pass them (:mod:`mechkit.model.compat`)."""


@functools.lru_cache(maxsize=64)
def own(model_class: type) -> tuple[str, ...]:
    """The named keyword arguments of ``model_class.forward`` (the ones a fix should list)."""
    try:
        params = inspect.signature(model_class.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self")


@functools.lru_cache(maxsize=64)
def accepted(model_class: type) -> frozenset[str] | None:
    """The keyword arguments ``model_class.forward`` takes, with transformers' shared ones where it ends in
    ``**kwargs`` (``None``: its signature cannot be read, so nothing can be said)."""
    try:
        params = inspect.signature(model_class.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    names = set(own(model_class))
    if _returns_tuple_on_request(model_class.forward):
        names.add("return_dict")  # transformers' can_return_tuple reads it (a tuple for False)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        try:
            from transformers.utils.generic import TransformersKwargs

            names |= set(TransformersKwargs.__annotations__)
        except (ImportError, AttributeError):  # pragma: no cover - an older transformers
            return None
    return frozenset(names | ALWAYS)


def check_forward_kwargs(model: object, names: Iterable[str]) -> None:
    """Refuse (one line) a keyword argument the model's forward would silently ignore."""
    names = list(names)
    if not names:
        return
    known = accepted(type(model))
    if known is None:
        return
    unknown = [n for n in names if n not in known]
    unread = [n for n in unknown if n in NOT_READ]
    if unread:  # a real argument of transformers, of another version or family: not a misspelling
        raise MechkitError(f"{type(model).__name__}'s forward does not read {unread[0]} (in this transformers "
                           "version or for this model), so it would be ignored", NOT_READ[unread[0]])
    if unknown:
        shown = ", ".join(n for n in own(type(model)) if n != "input_ids")
        raise MechkitError(f"{type(model).__name__}'s forward takes no argument {', '.join(unknown)}",
                           f"check the spelling; it takes {shown} and transformers' shared keyword arguments")


NOT_READ = {
    "cache_position": "leave it out: the positions come from the cache (pass position_ids to set them)",
    "head_mask": "leave it out: to silence heads, ablate them (mk.ablate) or replace their output with mk.hooks",
    "token_type_ids": "leave it out: this model has no token type embeddings",
    "return_dict": "leave it out: this model's forward returns its output object",
}
"""transformers arguments that some versions or families read and this model's forward does not: the fix names
what to do instead (``cache_position`` from a transformers 4 decode loop was refused as a misspelling)."""


def _returns_tuple_on_request(forward: object) -> bool:
    """Whether ``forward`` is wrapped by transformers' ``can_return_tuple``, which reads ``return_dict``."""
    try:
        from transformers.utils.generic import can_return_tuple

        code = can_return_tuple(lambda self: None).__code__
    except (ImportError, AttributeError):  # pragma: no cover - an older transformers
        return False
    seen = 0
    while forward is not None and seen < 16:
        if getattr(forward, "__code__", None) is code:
            return True
        forward, seen = getattr(forward, "__wrapped__", None), seen + 1
    return False


def named_outputs(model: object) -> None:
    """Make ``model`` return its output object, as mechkit reads it (``.logits``, ``.past_key_values``): a
    config saved with ``"return_dict": false`` made transformers' own causal-LM head fail on its base model's
    tuple (``'tuple' object has no attribute 'last_hidden_state'``) in every analysis. It only sets the output's
    form, never a value; a caller's ``m.forward(ids, return_dict=False)`` still gets a tuple."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "return_dict", True) is False:
        config.return_dict = True


_PACKED = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""transformers' shared arguments for packed sequences: only flash attention (and Mamba kernels) read them."""


def refuse_ignored_kwargs(model: object, kwargs: dict) -> None:
    """Refuse (one line) a known keyword argument that this model, as loaded, would ignore or answer empty.

    ``check_forward_kwargs`` lets through transformers' shared arguments, but a model reads some of them only
    in one setting: ``output_attentions=True`` under SDPA returned no attentions (and transformers printed a
    warning), ``cu_seq_lens_q`` and the other packed-sequence arguments did nothing without flash attention,
    ``output_router_logits`` on a model without experts and ``num_items_in_batch`` without ``labels`` changed
    nothing, and ``encoder_hidden_states`` on GPT-2 without cross-attention raised a ValueError deep inside."""
    config = getattr(model, "config", None)
    # inside mechkit's pattern hooks the config names mechkit's wrapper of its kernel (mechkit.hooking.attention)
    attn = str(getattr(config, "_attn_implementation", "") or "").removeprefix("mechkit_")
    given = {k for k, v in kwargs.items() if v is not None and v is not False}
    if "output_attentions" in given and attn not in ("eager", ""):
        raise MechkitError(f"output_attentions=True returns no attention weights under {attn} attention, "
                           "which this model uses", "read the patterns with mk.run_with_cache(m, ids, "
                           "\"blocks.*.attn.hook_pattern\") instead")
    packed = [k for k in _PACKED if k in given]
    if packed and "flash" not in attn and not _has_module(model, "mamba"):
        raise MechkitError(f"{', '.join(packed)} are for packed sequences, which only flash attention reads, "
                           f"and this model uses {attn or 'another'} attention: they would be ignored",
                           "pass one row per sequence with an attention_mask instead, or leave them out")
    if "output_router_logits" in given and not hasattr(config, "output_router_logits"):
        raise MechkitError("output_router_logits asks for the routers' logits, and this model has no experts",
                           "leave it out")
    if "num_items_in_batch" in given and "labels" not in given:
        raise MechkitError("num_items_in_batch scales the loss of labels, and no labels are given: it would be "
                           "ignored", "pass labels too, or leave it out")
    cross = [k for k in ("encoder_hidden_states", "encoder_attention_mask") if k in given]
    if cross and not getattr(config, "add_cross_attention", False) and not getattr(config, "is_encoder_decoder", False):
        raise MechkitError(f"{', '.join(cross)} feed cross-attention, which this model does not have",
                           "leave them out (a decoder-only model reads only its own tokens)")


def _has_module(model: object, word: str) -> bool:
    modules = getattr(model, "modules", None)
    return callable(modules) and any(word in type(m).__name__.lower() for m in modules())


def refuse_outputs_beyond_logits(kwargs: dict) -> None:
    """Refuse (one line) asking ``m(ids, ...)``, which returns the logits alone, for other outputs: the
    hidden states or attentions were computed and dropped, silently."""
    asked = [k for k in ("output_hidden_states", "output_attentions", "output_router_logits") if kwargs.get(k)]
    if asked:
        raise MechkitError(f"m(ids, ...) returns the logits only, and {', '.join(asked)} would be dropped",
                           f"call m.forward(ids, {asked[0]}=True) for the whole output, or use mk.run_with_cache")
