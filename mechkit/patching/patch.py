"""One activation patch: a hook point, where in it, and the run its value comes from.

A :class:`Patch` names one hook point of one layer (TransformerLens' names: ``blocks.3.hook_resid_pre``,
``blocks.3.attn.hook_z``…) and optionally the positions, heads (``hook_q/k/v/z/pattern``) or neurons
(``mlp.hook_post``) to overwrite. :func:`run_patched` runs the target prompt with those values taken from
a source recording (a :class:`~mechkit.hooking.Cache`, or a second prompt recorded first). Source and
target must have the same length unless ``source_positions`` says where each patched position reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.hooking.core import hooks, record
from mechkit.hooking.points import READ_ONLY, resolve
from mechkit.patching.source_checks import (
    checked_source,
    checked_target,
    same_layout,
    source_act,
    unit_indices,
)

if TYPE_CHECKING:
    from mechkit.hooking.core import Cache
    from mechkit.model.handle import ModelHandle

# Index layout of each patchable point (after the batch dim): which dims hold positions, heads, neurons.
_HEADS = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_pattern")
_KV = ("attn.hook_k", "attn.hook_v")


@dataclass(frozen=True)
class Patch:
    """Overwrite ``point`` at ``positions`` (all where None; query positions for a pattern), for ``heads`` or
    ``neurons`` only where given, with the source's values at ``source_positions`` (default: the same)."""

    point: str
    positions: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    neurons: tuple[int, ...] | None = None
    source_positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:  # integers only, as plain tuples (one integer is a tuple of one)
        for field in ("positions", "heads", "neurons", "source_positions"):
            object.__setattr__(self, field, unit_indices(getattr(self, field), field))

    def where(self) -> tuple:
        """``(positions, heads, neurons, source_positions)`` as plain tuples: what a hook function carries, so
        a remote job ships plain data, not this class."""
        return self.positions, self.heads, self.neurons, self.source_positions

    def suffix(self, handle: ModelHandle) -> str:
        return self.resolved(handle).suffix

    def resolved(self, handle: ModelHandle):
        points = resolve(handle.anatomy, self.point)
        if len(points) != 1:
            raise MechkitError(f"a patch names one hook point; {self.point!r} matches {len(points)}",
                               "name one layer (blocks.3.hook_resid_pre), not a pattern")
        return points[0]


def check(handle: ModelHandle, patch: Patch, target_len: int, source_len: int) -> None:
    """Refuse, in one line, a patch that cannot be applied: unknown or read-only point, positions, heads or
    neurons out of range, or prompts of different lengths without ``source_positions``."""
    point = patch.resolved(handle)
    a = handle.anatomy
    if point.suffix in READ_ONLY:
        raise MechkitError(f"{point.name} can be read, not patched", "patch the residual stream it is computed from")
    _in_range("position", patch.positions, target_len, f"the {target_len}-token target prompt")
    _in_range("source position", patch.source_positions, source_len, f"the {source_len}-token source prompt")
    if patch.source_positions is None and source_len != target_len:
        raise MechkitError(f"the source prompt has {source_len} tokens and the target {target_len}",
                           "give prompts of the same length, or source_positions= (where each patched position reads)")
    if patch.source_positions is not None:
        if patch.positions is None or len(patch.positions) != len(patch.source_positions):
            raise MechkitError("source_positions needs one entry per patched position", "give positions= of the same length")
        if point.suffix == "attn.hook_pattern" and source_len != target_len:
            raise MechkitError("a pattern cannot be patched between prompts of different lengths (its key positions "
                               "differ)", "patch attn.hook_z instead")
    if patch.heads is not None:
        if point.suffix not in _HEADS:
            raise MechkitError(f"heads= applies to {', '.join(_HEADS)}, not {point.suffix}", "drop heads=")
        layer = point.layer
        _in_range("head", patch.heads, a.kv_heads_in(layer) if point.suffix in _KV else a.heads_in(layer),
                  "this layer's heads", False)
    if patch.neurons is not None:
        if point.suffix != "mlp.hook_post":
            raise MechkitError(f"neurons= applies to mlp.hook_post, not {point.suffix}", "drop neurons=")
        _in_range("neuron", patch.neurons, a.mlp_width(point.layer), "the MLP's neurons", False)


def _in_range(what: str, values: Sequence[int] | None, n: int, of: str, negative: bool = True) -> None:
    for v in values or ():
        if not (-n if negative else 0) <= v < n:
            raise MechkitError(f"{what} {v} is out of range for {of} ({n})",
                               f"use 0..{n - 1}" + (" (or negative from the end)" if negative else ""))


def assign(new: torch.Tensor, src: torch.Tensor, suffix: str, where: tuple) -> None:
    """Write ``src``'s values into ``new`` (one row each, no batch dim) where a :meth:`Patch.where` says."""
    positions, heads, neurons, source_positions = where
    src = src.to(device=new.device, dtype=new.dtype)
    all_pos = range(new.shape[1] if suffix == "attn.hook_pattern" else new.shape[0])
    pos = list(positions) if positions is not None else list(all_pos)
    spos = list(source_positions) if source_positions is not None else pos
    if suffix == "attn.hook_pattern":  # [heads, q, k]
        heads = list(heads) if heads is not None else list(range(new.shape[0]))
        new[torch.tensor(heads)[:, None], torch.tensor(pos)[None, :]] = \
            src[torch.tensor(heads)[:, None], torch.tensor(spos)[None, :]]
        return
    second = heads if heads is not None else neurons
    if second is None:
        new[pos] = src[spos]
    else:
        idx = torch.tensor(list(second))[None, :]
        new[torch.tensor(pos)[:, None], idx] = src[torch.tensor(spos)[:, None], idx]


def source_cache(handle: ModelHandle, source: Cache | torch.Tensor, names: list[str], who: str = "run_patched") -> Cache:
    """``source`` itself (a recording of this model), or the named points recorded on the source prompt
    ``source`` (token ids)."""
    source = checked_source(handle, source, who)
    if not isinstance(source, torch.Tensor):
        return source
    points = list(dict.fromkeys(p.name for name in names for p in resolve(handle.anatomy, name)))  # each once
    with torch.no_grad(), record(handle, points) as cache:
        handle(source)
    cache.ids = source
    return cache


def run_patched(handle: ModelHandle, target: torch.Tensor, source: Cache | torch.Tensor,
                patches: Patch | Sequence[Patch]) -> torch.Tensor:
    """Logits of ``target`` (token ids ``[1, pos]`` or a batch the source matches) with every patch applied.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> clean, corrupt = m.to_tokens("ab"), m.to_tokens("ba")
    >>> logits = run_patched(m, corrupt, clean, Patch("blocks.0.hook_resid_pre"))   # the whole stream
    >>> torch.allclose(logits, m(clean), atol=1e-5)
    True
    """
    patches = [patches] if isinstance(patches, Patch) else list(patches)
    target = checked_target(target, "run_patched")
    cache = source_cache(handle, source, [p.resolved(handle).name for p in patches])
    fns: dict[str, list] = {}
    for p in patches:
        point = p.resolved(handle)
        src = source_act(cache, point.name, target.shape[0] if target.ndim > 1 else 1, "run_patched")
        check(handle, p, target.shape[-1], point_length(src, point.suffix))
        fns.setdefault(point.name, []).append(_writer(src, point.suffix, p.where()))
    with torch.no_grad(), hooks(handle, fns):
        return handle(target)


def point_length(act: torch.Tensor, suffix: str) -> int:
    return act.shape[2] if suffix == "attn.hook_pattern" else act.shape[1]


def _writer(src: torch.Tensor, suffix: str, where: tuple):
    def fn(act: torch.Tensor, point) -> torch.Tensor:
        same_layout(src, act, suffix, point.name)
        new = act.clone()
        for row in range(new.shape[0]):
            assign(new[row], src[row if src.shape[0] == new.shape[0] else 0], suffix, where)
        return new

    return fn
