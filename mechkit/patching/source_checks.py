"""What patching (:func:`~mechkit.patching.run_patched`, :func:`~mechkit.patching.scan`,
:func:`~mechkit.patching.attribute`) checks before it writes a source's values into a target run: one
:class:`MechkitError` line where the source is no recording, was recorded on another model, holds no
activation at a point, or has a batch the target cannot take; where a target is no token ids; and where a
patch's positions, heads or neurons are not integers. Without these a cache of another model of the same
width was patched in silently, a source of three rows into a target of two silently used row 0, and the
rest failed as raw ``TypeError``/``AttributeError``/``IndexError`` from inside torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import MechkitError
from mechkit.patching.lens_checks import as_integer, checked_pos, same_model

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

_SOURCE_FIX = "pass the clean prompt's token ids (m.to_tokens(text)) or mk.run_with_cache(m, ids, names)'s cache"


def unit_indices(value: Any, what: str) -> tuple[int, ...] | None:
    """A :class:`~mechkit.patching.Patch` field as a tuple of Python ints: None, one integer, or a sequence
    (list, tuple, range, 1-D integer tensor or array) of them; a float or bool is refused (a float indexed
    torch silently or failed inside it, ``True`` was read as a mask)."""
    if value is None:
        return None
    one = as_integer(value)
    if isinstance(one, int) and not isinstance(one, bool):
        return (one,)
    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.ndim == 1 and not value.is_floating_point() and value.dtype != torch.bool \
            else [value]
    elif hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:  # a NumPy array
        value = value.tolist()
    items = list(value) if isinstance(value, list | tuple | range) else None
    ints = None if items is None else [as_integer(v) for v in items]
    if ints is None or any(isinstance(v, bool) or not isinstance(v, int) for v in ints):
        raise MechkitError(f"Patch {what}={value!r} is not a list of integers"[:200],
                           f"pass {what}=(0, 3) or one integer, {what}=3")
    return tuple(ints)


def checked_target(target: Any, who: str, one_prompt: bool = False) -> torch.Tensor:
    """``target`` as token ids ``[batch, pos]`` (``[1, pos]`` where ``one_prompt``)."""
    if not isinstance(target, torch.Tensor):
        raise MechkitError(f"{who}: the target must be token ids (a tensor), not {type(target).__name__}",
                           "pass m.to_tokens(text)")
    if one_prompt and (target.ndim != 2 or target.shape[0] != 1):
        raise MechkitError(f"{who} patches one prompt, [1, pos] token ids; the target is {list(target.shape)}",
                           "pass one prompt (m.to_tokens(text)), or call it once per prompt")
    return target


def checked_source(handle: ModelHandle, source: Any, who: str) -> Any:
    """``source`` as token ids or a recording of ``handle`` (a mechkit ``Cache`` records its model: another
    model's is refused; a plain dict cannot say, and its shapes are checked at each point)."""
    if isinstance(source, torch.Tensor):
        return source
    if not (hasattr(source, "__getitem__") and hasattr(source, "keys")) or isinstance(source, str | bytes):
        raise MechkitError(f"{who}: the source must be token ids or a recording, not {type(source).__name__}",
                           _SOURCE_FIX)
    recorded = getattr(source, "handle", None)
    if recorded is not None and not same_model(recorded, handle):
        other = "another model of that class" if recorded.spec == handle.spec else handle.spec
        raise MechkitError(f"{who}: the source cache was recorded on {recorded.spec}, not on {other}",
                           f"record the source on {handle.spec}, or pass its token ids")
    return source


def source_act(cache: Any, name: str, target_batch: int, who: str) -> torch.Tensor:
    """The source's activation at ``name``: a ``[batch, ...]`` tensor (at least 3-D) whose batch is 1 or the
    target's (row ``r`` of the target reads row ``r`` of the source, or the one row for all)."""
    act = cache[name]
    if not isinstance(act, torch.Tensor) or act.ndim < 3:
        what = f"shape {list(act.shape)}" if isinstance(act, torch.Tensor) else f"a {type(act).__name__}"
        raise MechkitError(f"{who}: the source holds {what} at {name}, not a [batch, pos, ...] activation",
                           _SOURCE_FIX)
    if act.shape[0] not in (1, target_batch):
        raise MechkitError(f"{who}: the source has {act.shape[0]} rows at {name} and the target {target_batch}",
                           "give a source of one row (used for every target row) or of the target's rows")
    return act


def checked_answer_pos(answer_pos: Any, length: int, who: str) -> int:
    """``answer_pos`` inside the target (``pos % length`` silently read another position past the end)."""
    return checked_pos(answer_pos, length, who, "answer_pos")


def checked_batch_size(batch_size: Any, who: str) -> int:
    value = as_integer(batch_size)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MechkitError(f"{who}: batch_size={batch_size!r} is not a positive integer"[:200], "pass batch_size=32")
    return value


def checked_metric(metric: Any, who: str) -> None:
    """A metric is a function of the logits: ``None`` or a number raised a raw ``TypeError`` at the first run."""
    if not callable(metric):
        raise MechkitError(f"{who}: the metric is {type(metric).__name__}, not a function of the logits",
                           "pass a function such as lambda logits: logit_diff(logits, a, b)")


def checked_rows(values: Any, k: int, who: str, rows: str = "patched row(s)") -> torch.Tensor:
    """A metric's result on ``k`` patched rows: ``k`` real numbers (a bool was read as 1.0 and a complex one
    lost its imaginary part with a mere warning; :func:`~mechkit.patching.normalized_recovery` refuses both)."""
    if not isinstance(values, torch.Tensor) or values.shape != (k,):
        got = f"shape {list(values.shape)}" if isinstance(values, torch.Tensor) else type(values).__name__
        raise MechkitError(f"{who}: the metric returned {got} for {k} row(s) of logits; it gives one number per row",
                           "return one value per row of the [batch, vocab] logits, e.g. logit_diff(logits, a, b)")
    checked_real(values, who)
    bad = int((~torch.isfinite(values)).sum()) if values.is_floating_point() else 0
    if bad:  # a NaN here would read as a hole of the grid (a pruned layer's missing head) further on
        raise MechkitError(f"{who}: the metric gave NaN or inf on {bad} of {k} {rows}",
                           "check the model's logits there (NaN weights, a float16 overflow) or the metric")
    return values


def same_layout(src: torch.Tensor, act: torch.Tensor, suffix: str, name: str) -> None:
    """The source's values fit the target's activation at ``name`` (all but batch and positions; a pattern's
    heads): a plain dict of another model's activations failed inside torch's indexing otherwise."""
    fixed = (1,) if suffix == "attn.hook_pattern" else tuple(range(2, act.ndim))
    if src.ndim != act.ndim or any(src.shape[d] != act.shape[d] for d in fixed):
        raise MechkitError(f"the source's {name} is {list(src.shape)}; the target's is {list(act.shape)}: it was "
                           "recorded on another model", f"record the source on this model ({_SOURCE_FIX})")


def checked_real(values: torch.Tensor, who: str) -> torch.Tensor:
    """A metric's tensor refused in one line where it holds no real numbers (bool, complex, meta)."""
    if values.dtype == torch.bool or values.is_complex() or values.is_meta:
        raise MechkitError(f"{who}: the metric returned {'meta ' if values.is_meta else ''}"
                           f"{str(values.dtype).removeprefix('torch.')} values, not real numbers",
                           "return the metric's real values per row, e.g. logit_diff(logits, a, b) (a float tensor)")
    return values


def checked_layers(layers: Any, n_layers: int, who: str) -> list[int]:
    """``layers`` (None for all, one integer, or a sequence, tensor or array of them) as layer indices of the
    model, refused in one line otherwise: a string raised a raw ``KeyError`` further on, an integer a
    ``TypeError``, a tensor's elements a ``KeyError``, and ``[True]`` or ``[0.0]`` were looked up as hook
    names ``blocks.True`` and ``blocks.0.0``."""
    if layers is None:
        return list(range(n_layers))
    fix = f"pass layers as layer indices from 0 to {n_layers - 1}, e.g. layers=[0, 1], or leave it out for all"
    if isinstance(layers, str | bytes):
        raise MechkitError(f"{who}: layers={layers!r} is text, not layer indices"[:200], fix)
    try:
        indices = unit_indices(layers, "layers")
    except MechkitError:
        raise MechkitError(f"{who}: layers={layers!r} is not a list of integers"[:200], fix) from None
    if not indices:
        raise MechkitError(f"{who}: layers is empty", fix)
    bad = [i for i in indices if not 0 <= i < n_layers]
    if bad:
        raise MechkitError(f"{who}: layer {bad[0]} is not a layer of this model ({n_layers} layers)", fix)
    return list(indices)
