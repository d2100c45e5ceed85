"""Remember which input tensors a forward check already passed, so a loop that runs the same tensor through
many forwards (an ablation sweep over one batch) pays for a value check once: on a GPU each such check is a
host sync.

A tensor is known by its identity and its version counter (an in-place write, also through a view, bumps
it), with what it was checked against (``tag``: the vocabulary size, say). Only tensors on an accelerator
are remembered: on the CPU a check costs no host sync, and CPU memory is written past the version counter
(``t.data[0] = x``, a NumPy array sharing it through ``torch.from_numpy``, ``t.untyped_storage()``), so
ids changed that way ran unchecked (an IndexError) and a mask was taken with a 5 in it. Inference tensors
(made under ``torch.inference_mode``) have no version counter and are never remembered. The limit left:
on a GPU, a write through ``t.data`` or DLPack is not seen until the tensor is passed anew.

>>> import torch
>>> t = torch.tensor([1, 2], device="meta")   # stands in for a GPU tensor here
>>> seen(t, "v"), remember(t, "v"), seen(t, "v")
(False, None, True)
>>> _ = t.add_(1)
>>> seen(t, "v")
False
>>> cpu = torch.tensor([1, 2]); remember(cpu, "v"); seen(cpu, "v")   # a CPU tensor is checked every time
False
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable

import torch

_SEEN: dict[tuple[int, Hashable], tuple] = {}


def _memoisable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s checks may be remembered (see the module doc): on an accelerator, with a version counter."""
    return tensor.device.type != "cpu" and not tensor.is_inference()


def seen(tensor: torch.Tensor, tag: Hashable) -> bool:
    """Whether ``tensor``, unchanged since, passed the check named ``tag``."""
    if not _memoisable(tensor):
        return False
    entry = _SEEN.get((id(tensor), tag))
    return entry is not None and entry[0]() is tensor and entry[1] == tensor._version


def remember(tensor: torch.Tensor, tag: Hashable) -> None:
    """Record that ``tensor`` passed the check named ``tag`` (forgotten when the tensor is freed)."""
    if not _memoisable(tensor):
        return
    if len(_SEEN) > 512:
        _SEEN.clear()
    key = (id(tensor), tag)
    _SEEN[key] = (weakref.ref(tensor, lambda _, key=key: _SEEN.pop(key, None)), tensor._version)
