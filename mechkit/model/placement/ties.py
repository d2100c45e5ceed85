"""Which weights are one tensor under several names (tied embeddings), also once accelerate hides it."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


# Tied groups found before dispatch: accelerate's hooks give each offloaded module a fresh meta
# parameter at every forward, so after one forward the ties cannot be seen on the model any more.
_TIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember_ties(model: nn.Module, source: nn.Module | None = None) -> None:
    from accelerate.utils import find_tied_parameters

    _TIES[model] = [list(group) for group in find_tied_parameters(source if source is not None else model)]


def _config_ties(model: nn.Module) -> list[list[str]]:
    """The input and output embeddings, where the config ties them (HF models): accelerate's
    ``cpu_offload`` unties them on ``meta`` before mechkit ever sees the model."""
    config = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    text = get_text(decoder=True) if callable(get_text) else config
    if not getattr(text, "tie_word_embeddings", False) or not hasattr(model, "get_output_embeddings"):
        return []
    try:
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return []
    if out_emb is None or in_emb is None:
        return []
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    if id(out_emb) not in names or id(in_emb) not in names:
        return []
    group = sorted({f"{names[id(in_emb)]}.weight", f"{names[id(out_emb)]}.weight"})
    return [group] if len(group) == 2 else []


def tied_names(model: nn.Module) -> dict[str, list[str]]:
    """For every tied tensor name, all the names sharing its weights (empty for untied models): the
    ties found before dispatch, on the model, and the embeddings its config ties."""
    from accelerate.utils import find_tied_parameters

    groups = _TIES.get(model)
    if groups is None:
        groups = find_tied_parameters(model)
    out: dict[str, set[str]] = {}
    for group in [*groups, *_config_ties(model)]:
        merged = set(group).union(*(out.get(name, set()) for name in group))
        for name in merged:
            out[name] = merged
    return {name: sorted(group) for name, group in out.items()}


def distinct_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """``dict(model.named_parameters())`` with tied weights once (under their first name), also where
    accelerate's hooks gave each tied module its own ``meta`` parameter; values are the model's own
    parameters (on ``meta`` where offloaded: read them with :func:`stored_tensor`).

    >>> import mechkit as mk
    >>> "lm_head.weight" in distinct_parameters(mk.load_model("tiny:gpt2").model)
    False
    """
    ties = tied_names(model)
    out: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():
        if not any(other in out for other in ties.get(name, ())):
            out[name] = param
    return out


def weight_bytes(tensors) -> int:
    """The bytes of ``tensors``, each counted once (tied weights share one tensor): what safetensors saves."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())
