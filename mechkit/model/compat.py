"""The one seam between mechkit and what changes across transformers releases.

transformers 5.24 renamed the KV cache of a forward from ``past_key_values`` to ``cache`` (argument and
output field); the old name still works there but warns, and is due to go in 5.40. Code above the model
layer never spells either name: it passes a cache with :func:`cache_kwargs`, reads one back with
:func:`cache_of`, and a forward hook finds the one it was given with :func:`cache_in`. Whatever the
installed release calls it, these three answer; nothing else in mechkit checks a version.

>>> sorted(cache_kwargs(None)) == [cache_name()]
True
>>> cache_in({cache_name(): "kv"})
'kv'
"""

from __future__ import annotations

import functools
from typing import Any

OLD, NEW = "past_key_values", "cache"


@functools.cache
def cache_name() -> str:
    """The installed transformers' name for a forward's KV cache (``cache`` from 5.24 on)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return NEW if NEW in CausalLMOutputWithPast.__dataclass_fields__ else OLD


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` to a model's forward (``model(ids, **cache_kwargs(c))``)."""
    return {cache_name(): cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward returned (None where it returned none)."""
    return getattr(output, cache_name(), None)


def set_cache(output: Any, cache: Any) -> None:
    """Put ``cache`` where :func:`cache_of` finds it (a backend that returns its own kind of cache)."""
    setattr(output, cache_name(), cache)


def cache_in(kwargs: dict[str, Any]) -> Any:
    """The cache a forward was called with, under either name (a forward pre-hook reads this)."""
    return kwargs.get(NEW) if kwargs.get(NEW) is not None else kwargs.get(OLD)


def pop_cache(kwargs: dict[str, Any]) -> Any:
    """Remove and return the cache from a forward's keyword arguments, under either name."""
    new, old = kwargs.pop(NEW, None), kwargs.pop(OLD, None)
    return new if new is not None else old
