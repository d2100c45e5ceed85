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
    if unknown:
        shown = ", ".join(n for n in own(type(model)) if n != "input_ids")
        raise MechkitError(f"{type(model).__name__}'s forward takes no argument {', '.join(unknown)}",
                           f"check the spelling; it takes {shown} and transformers' shared keyword arguments")
