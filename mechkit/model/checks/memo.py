"""Remember which input tensors a forward check already passed, so a loop that runs the same tensor through
many forwards (an ablation sweep over one batch) pays for a value check once: on a GPU each such check is a
host sync.

A tensor is known by its identity and its version counter (an in-place write, also through a view, bumps
it), with what it was checked against (``tag``: the vocabulary size, say).

>>> import torch
>>> t = torch.tensor([1, 2])
>>> seen(t, "v"), remember(t, "v"), seen(t, "v")
(False, None, True)
>>> t[0] = 5
>>> seen(t, "v")
False
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable

import torch

_SEEN: dict[tuple[int, Hashable], tuple] = {}


def seen(tensor: torch.Tensor, tag: Hashable) -> bool:
    """Whether ``tensor``, unchanged since, passed the check named ``tag``."""
    entry = _SEEN.get((id(tensor), tag))
    return entry is not None and entry[0]() is tensor and entry[1] == tensor._version


def remember(tensor: torch.Tensor, tag: Hashable) -> None:
    """Record that ``tensor`` passed the check named ``tag`` (forgotten when the tensor is freed)."""
    if len(_SEEN) > 512:
        _SEEN.clear()
    key = (id(tensor), tag)
    _SEEN[key] = (weakref.ref(tensor, lambda _, key=key: _SEEN.pop(key, None)), tensor._version)
