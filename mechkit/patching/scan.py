"""Every single patch of one hook point, layer by layer: the residual-stream heatmap and the head map.

``scan`` patches one position (``over="position"``) or one head (``over="head"``, all positions) at a
time, at every layer, and measures the metric at the answer position. Cost habits as in
:func:`mechkit.heads.effects.exact_effects`: a patch at layer L cannot change layers below L, so the
target's block inputs are captured in one forward and each patched run replays only blocks L… with
``batch_size`` patches as the rows of one forward, and unembeds only the answer position. On a backend
that runs whole forwards only (nnsight) the rows run as whole forwards, with the same values.

:func:`denoise` patches clean activations into the corrupted run (which parts suffice to restore the
answer); :func:`noise` patches corrupted activations into the clean run (which parts are necessary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mechkit.hooking.core import hooks
from mechkit.model.edit.partial import BlockInputs, capture_block_inputs, run_from
from mechkit.patching.answers import normalized_recovery
from mechkit.patching.patch import Patch, assign, check, point_length, source_cache
from mechkit.patching.source_checks import (
    checked_answer_pos,
    checked_batch_size,
    checked_layers,
    checked_metric,
    checked_rows,
    checked_target,
    same_layout,
    source_act,
)

if TYPE_CHECKING:
    from mechkit.hooking.core import Cache
    from mechkit.model.handle import ModelHandle

Metric = Callable[[torch.Tensor], torch.Tensor]  # [batch, vocab] logits at the answer position -> [batch]


@dataclass
class PatchScan:
    """``values[layer, i]``: the metric after patching position (or head) ``i`` of ``point`` at ``layer``;
    ``clean`` and ``corrupted``: the metric of the unpatched runs; ``direction``: denoising or noising."""

    point: str
    over: str
    values: torch.Tensor
    clean: float
    corrupted: float
    direction: str
    labels: list[str] = field(default_factory=list)

    @property
    def recovery(self) -> torch.Tensor:
        """``(patched − corrupted) / (clean − corrupted)`` per cell; NaN where the grid has no cell (a pruned
        layer's missing heads, :func:`padded`). A patched run's own metric is finite (:func:`checked_rows`)."""
        hole = self.values.isnan()
        filled = self.values.masked_fill(hole, self.corrupted)
        return normalized_recovery(filled, self.clean, self.corrupted).masked_fill(hole, float("nan"))


def scan(handle: ModelHandle, target: torch.Tensor, source: Cache | torch.Tensor, point: str, metric: Metric,
         over: str = "position", layers: Sequence[int] | None = None, answer_pos: int = -1,
         batch_size: int = 32) -> torch.Tensor:
    """``[len(layers), n]``: ``metric`` after each single patch of ``blocks.L.{point}`` from ``source`` into
    ``target`` (one prompt, ``[1, pos]``); ``n`` positions or heads. ``point`` is a block suffix
    (``hook_resid_pre``, ``attn.hook_z``…)."""
    a = handle.anatomy
    checked_metric(metric, "scan")
    layers = checked_layers(layers, a.n_layers, "scan")
    target = checked_target(target, "scan", one_prompt=True)
    answer_pos = checked_answer_pos(answer_pos, target.shape[-1], "scan")
    batch_size = checked_batch_size(batch_size, "scan")
    cache = source_cache(handle, source, [f"blocks.{L}.{point}" for L in layers], "scan")
    n_pos = target.shape[-1]
    rows = []
    with torch.no_grad():
        inputs = _capture(handle, target)
        for layer in layers:
            probe = Patch(f"blocks.{layer}.{point}")
            suffix = probe.suffix(handle)
            src = source_act(cache, probe.resolved(handle).name, 1, "scan")
            units = _units(handle, layer, point, suffix, over, n_pos)
            for u in units:
                check(handle, u, n_pos, point_length(src, suffix))
            values = []
            for start in range(0, len(units), batch_size):
                chunk = units[start:start + batch_size]
                logits = _rows(handle, layer, target, inputs, probe.point, _row_writer(src, suffix, chunk), len(chunk),
                               answer_pos)
                values.append(checked_rows(metric(logits), len(chunk), "scan"))
            rows.append(torch.cat(values).float().cpu())
    return padded(rows)


def padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Per-layer rows as one ``[n_layers, n]`` grid; NaN past a row's end (over heads, a pruned layer that
    kept fewer heads than the widest)."""
    width = max(len(r) for r in rows)
    return torch.stack([torch.cat([r, r.new_full((width - len(r),), float("nan"))]) for r in rows])


def _units(handle: ModelHandle, layer: int, point: str, suffix: str, over: str, n_pos: int) -> list[Patch]:
    name = f"blocks.{layer}.{point}"
    if over == "position":
        return [Patch(name, positions=(p,)) for p in range(n_pos)]
    if over == "head":
        a = handle.anatomy  # this layer's own heads (fewer where heads were pruned)
        n = a.kv_heads_in(layer) if suffix in ("attn.hook_k", "attn.hook_v") else a.heads_in(layer)
        return [Patch(name, heads=(h,)) for h in range(n)]
    from mechkit.errors import MechkitError

    raise MechkitError(f"over={over!r} is not position or head", "use over='position' or over='head'")


def _row_writer(src: torch.Tensor, suffix: str, units: list[Patch]):
    """A hook function giving row r of the batch the patch ``units[r]`` (carried as plain tuples)."""
    wheres = [unit.where() for unit in units]

    def fn(act: torch.Tensor, point) -> torch.Tensor:
        same_layout(src, act, suffix, point.name)
        new = act.clone()
        for row, where in enumerate(wheres):
            assign(new[row], src[0], suffix, where)
        return new

    return fn


def _capture(handle: ModelHandle, target: torch.Tensor) -> BlockInputs | None:
    if "module_calls" not in handle.backend.serves:
        return None
    with capture_block_inputs(handle) as inputs:
        handle(target)
    return inputs


def _rows(handle: ModelHandle, layer: int, target: torch.Tensor, inputs: BlockInputs | None, name: str, fn,
          k: int, answer_pos: int) -> torch.Tensor:
    """``[k, vocab]`` logits at the answer position of ``k`` copies of the target, ``fn`` patching them."""
    with hooks(handle, {name: fn}):
        if inputs is None:  # whole forwards (nnsight)
            return handle(target.expand(k, -1))[:, answer_pos]
        rep = BlockInputs({layer: inputs.hidden[layer].expand(k, -1, -1).contiguous()}, inputs.args, inputs.kwargs)
        pos = torch.tensor([answer_pos % target.shape[-1]])
        return run_from(handle, layer, rep, positions=pos)[:, 0]


def _directed(handle: ModelHandle, clean: torch.Tensor, corrupted: torch.Tensor, point: str, metric: Metric,
              over: str, denoising: bool, **kwargs) -> PatchScan:
    target, source = (corrupted, clean) if denoising else (clean, corrupted)
    checked_metric(metric, "scan")
    for ids in (clean, corrupted):  # before the two base runs read the answer position
        checked_answer_pos(kwargs.get("answer_pos", -1), checked_target(ids, "scan", one_prompt=True).shape[-1], "scan")
    checked_layers(kwargs.get("layers"), handle.anatomy.n_layers, "scan")  # before the two base runs too
    with torch.no_grad():
        base = {name: base_metric(metric, handle(ids)[:, kwargs.get("answer_pos", -1)], "scan")
                for name, ids in (("clean", clean), ("corrupted", corrupted))}
    values = scan(handle, target, source, point, metric, over=over, **kwargs)
    return PatchScan(point, over, values, base["clean"], base["corrupted"], "denoising" if denoising else "noising",
                     column_labels(handle, clean, corrupted, over, values.shape[1]))


def base_metric(metric: Metric, logits: torch.Tensor, who: str) -> float:
    """The metric of an unpatched run (``[1, vocab]`` logits) as a number, checked as a patched row's is: a
    metric giving a 0-dim tensor, a float or ``[batch, 2]`` raised a raw ``IndexError``/``TypeError``/
    ``ValueError`` here, before the scan that refuses it could."""
    return float(checked_rows(metric(logits), 1, who, "unpatched run(s)")[0])


def column_labels(handle: ModelHandle, clean: torch.Tensor, corrupted: torch.Tensor, over: str, n: int) -> list[str]:
    """Column labels: head indices, or tokens (a token the prompts disagree on shows both: clean/corrupted)."""
    if over != "position":
        return [str(h) for h in range(n)]
    return [a if a == b else f"{a}/{b}" for a, b in zip(handle.to_str_tokens(clean), handle.to_str_tokens(corrupted),
                                                        strict=True)]


def denoise(handle: ModelHandle, clean: torch.Tensor, corrupted: torch.Tensor, point: str, metric: Metric,
            over: str = "position", **kwargs) -> PatchScan:
    """Denoising: each clean activation patched into the corrupted run (does this part suffice?)."""
    return _directed(handle, clean, corrupted, point, metric, over, True, **kwargs)


def noise(handle: ModelHandle, clean: torch.Tensor, corrupted: torch.Tensor, point: str, metric: Metric,
          over: str = "position", **kwargs) -> PatchScan:
    """Noising: each corrupted activation patched into the clean run (is this part necessary?)."""
    return _directed(handle, clean, corrupted, point, metric, over, False, **kwargs)
