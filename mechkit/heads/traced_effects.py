"""Head effects (:mod:`mechkit.heads.effects`) on a backend that runs whole forwards: nnsight.

There are no partial forwards to replay from, so the exact sweep runs one whole forward per batch and
layer, the batch repeated once per head of the layer with copy h's head h zeroed (one trace per batch and
layer, never one per head). Attribution is one forward and backward per batch. Each of those traces is a
*unit*, kept as the same resumable step the native sweep keeps, with the same value.

Remote, the units still to run go to the server in jobs of up to ``backend.traces_per_job`` traces — one
``model.session`` each, so a default sweep (one batch of prompts; 31 traces on the embedded model) is one
job, where trace by trace it would be one job per layer. Every trace reduces its output on the server to
what the step keeps (per-row log-prob and exact match; per-head attribution sums), so a reply carries
kilobytes. The trade-off: a job's steps are written when the job returns, so a sweep stopped while a job
runs resumes at that job's first unit (finished jobs are kept). In process (``traces_per_job`` 1) every
trace is its own unit of progress and of resume, as natively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mechkit.eval.scoring import Batch, batches, row_metrics, supports_logits_to_keep
from mechkit.heads.sums import HeadEffects, LogprobSum, absent_nan
from mechkit.hooking.points import resolve
from mechkit.hooking.traced import GradTraceProgram, TraceProgram, planner
from mechkit.io.steps import Step, stored
from mechkit.model.backends.nnsight_backend import Trace

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle





@dataclass
class _Unit:
    """One trace of a sweep: its step key, how to build it, and what of its result the step keeps."""

    key: str
    trace: Callable[[], Trace]
    keep: Callable[[Any, dict], Any]  # (trace result, values found so far) -> the step's value


def run_units(handle: ModelHandle, units: Sequence[_Unit], step: Step, done: Callable[[_Unit], None]) -> dict:
    """Every unit's step value: stored ones read back, the rest run in jobs of ``traces_per_job`` traces
    (in unit order, so a unit's inputs — a batch's clean metrics — are found before it). ``done(unit)``
    follows each unit, stored or run."""
    values: dict = {}
    for unit in units:
        found, value = stored(step, unit.key)
        if found:
            values[unit.key] = value
            done(unit)
    pending = [u for u in units if u.key not in values]
    per_job = max(1, int(getattr(handle.backend, "traces_per_job", 1)))
    for start in range(0, len(pending), per_job):
        chunk = pending[start:start + per_job]
        results = handle.backend.run_group([u.trace() for u in chunk])
        for unit, result in zip(chunk, results, strict=True):
            values[unit.key] = step(unit.key, lambda unit=unit, result=result: unit.keep(result, values))
            done(unit)
    return values


class _RowMetrics:
    """Reduces a forward's logits to per-row (answer log-prob, exact match), inside the trace."""

    def __init__(self, batch: SimpleNamespace, kept: bool) -> None:
        self.batch, self.kept = batch, kept

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.kept:
            logits = logits[:, self.batch.keep.to(logits.device)]
        return row_metrics(logits, self.batch)


class _ZeroEach:
    """Zeroes head h in copy h of a batch stacked once per head (``rows`` rows a copy)."""

    mechkit_pure = True  # no side effects: remote, the head outputs stay on the server

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __call__(self, z: torch.Tensor, _point: Any) -> torch.Tensor:
        z = z.clone()
        for h in range(z.shape[2]):
            z[h * self.rows:(h + 1) * self.rows, :, h] = 0.0
        return z


def _forward(handle: ModelHandle, batch: Batch, plan: TraceProgram, kept: bool, grad: bool = False, repeat: int = 1) -> Trace:
    kwargs = {"use_cache": False, "attention_mask": batch.mask.to(handle.device)}
    if kept:
        kwargs["logits_to_keep"] = batch.keep.to(handle.device)
    return Trace(batch.ids.to(handle.device), plan, kwargs, grad, repeat)


def _clean_trace(handle: ModelHandle, batch: Batch) -> Trace:
    kept = supports_logits_to_keep(handle.model)
    return _forward(handle, batch, TraceProgram([], replay=handle.backend.remote is not None,
                                        reduce=_RowMetrics(_answers(batch), kept)), kept)


def _answers(batch: Batch, copies: int = 1) -> SimpleNamespace:
    """What per-row metrics read of a batch — answer positions and tokens — for ``copies`` stacked copies
    of it, as plain data (a :class:`Batch` is a dataclass, which NDIF refuses to unpickle: see
    :mod:`mechkit.model.backends.whitelist`); its ids stay out (they travel once, as the trace's input)."""
    return SimpleNamespace(keep=batch.keep, cols=batch.cols * copies, targets=batch.targets * copies)


def _ablated_trace(handle: ModelHandle, batch: Batch, layer: int) -> Trace:
    """The batch repeated once per head of ``layer``, copy h with head h zeroed; per-row metrics back.
    The trace carries the batch once (every layer's trace the same tensors) and repeats it where it runs."""
    n_heads = handle.anatomy.heads_in(layer)  # this layer's own heads (fewer where heads were pruned)
    kept = supports_logits_to_keep(handle.model)
    point = resolve(handle.anatomy, f"blocks.{layer}.attn.hook_z")[0]
    plan = planner(handle)([(point, _ZeroEach(len(batch.cols)))])
    plan.reduce = _RowMetrics(_answers(batch, n_heads), kept)
    return _forward(handle, batch, plan, kept, repeat=n_heads)


def _layer_row(result: tuple, clean: list, n_heads: int) -> dict:
    """Summed (ablated − clean) log-prob and accuracy over the batch's rows, per head (as natively)."""
    base_lp, base_acc = (torch.tensor(v, dtype=torch.float32) for v in clean)
    abl_lp, abl_acc = (t.view(n_heads, -1) for t in result)
    return {"logprob": [float((abl_lp[h] - base_lp.to(abl_lp.device)).sum()) for h in range(n_heads)],
            "accuracy": [float((abl_acc[h] - base_acc.to(abl_acc.device)).sum()) for h in range(n_heads)]}


def exact_traced(handle: ModelHandle, prompts: Sequence, batch_size: int = 16, on_layer=None,
                 step: Step | None = None) -> HeadEffects:
    """:func:`~mechkit.heads.effects.exact_effects` as whole forwards, grouped into jobs (module docstring)."""
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    units, sizes = [], []
    for b, batch in enumerate(batches(handle, prompts, batch_size)):
        clean = f"exact|batch{b}|clean"
        units.append(_Unit(clean, lambda batch=batch: _clean_trace(handle, batch),
                           lambda result, _values: [t.tolist() for t in result]))
        for layer in range(a.n_layers):
            units.append(_Unit(f"exact|batch{b}|layer{layer}",
                               lambda batch=batch, layer=layer: _ablated_trace(handle, batch, layer),
                               lambda result, values, clean=clean, layer=layer:
                               _layer_row(result, values[clean], a.heads_in(layer))))
        sizes.append((clean, len(batch.cols)))

    def done(unit: _Unit) -> None:
        if on_layer and "|layer" in unit.key:
            on_layer()

    values = run_units(handle, units, step, done)
    lp = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    acc = torch.zeros_like(lp)
    clean_lp = clean_acc = 0.0
    for b, (clean, _rows) in enumerate(sizes):
        base_lp, base_acc = (torch.tensor(v, dtype=torch.float32) for v in values[clean])
        clean_lp += float(base_lp.sum())
        clean_acc += float(base_acc.sum())
        for layer in range(a.n_layers):
            row = values[f"exact|batch{b}|layer{layer}"]
            lp[layer, :len(row["logprob"])] += torch.tensor(row["logprob"], dtype=torch.float64)
            acc[layer, :len(row["accuracy"])] += torch.tensor(row["accuracy"], dtype=torch.float64)
    n = sum(rows for _, rows in sizes)
    return HeadEffects(absent_nan(lp / n, a), absent_nan(acc / n, a), clean_lp / n, clean_acc / n, "exact")


class _AttributionSums:
    """Reduces one batch's head outputs and gradients to summed (0 − z)·∂metric/∂z per head, in the trace."""

    def __init__(self, mask: torch.Tensor, n_layers: int, n_heads: int) -> None:
        self.mask, self.n_layers, self.n_heads = mask, n_layers, n_heads

    def __call__(self, value: torch.Tensor, found: dict) -> dict:
        est = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)
        with torch.no_grad():
            for layer in range(self.n_layers):
                z, g = found[f"blocks.{layer}.attn.hook_z"]
                valid = self.mask.to(g.device)[:, :, None, None].to(g.dtype)
                est[layer, :z.shape[2]] += ((-z.to(g.device)) * g * valid).sum(dim=(0, 1, 3)).double().cpu()
        return {"estimate": est.tolist(), "clean_logprob": float(value)}


def _attribution_trace(handle: ModelHandle, batch: Batch) -> Trace:
    a = handle.anatomy
    kept = supports_logits_to_keep(handle.model)
    plan = GradTraceProgram(planner(handle).sites(resolve(a, "blocks.*.attn.hook_z")), metric=LogprobSum(_answers(batch), kept),
                    reduce_grads=_AttributionSums(batch.mask, a.n_layers, a.n_heads))
    return _forward(handle, batch, plan, kept, grad=True)


def attribution_traced(handle: ModelHandle, prompts: Sequence, batch_size: int = 16,
                       step: Step | None = None) -> HeadEffects:
    """:func:`~mechkit.heads.effects.attribution_effects` with every batch's trace grouped into jobs."""
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    found = batches(handle, prompts, batch_size)
    units = [_Unit(f"attribution|batch{b}", lambda batch=batch: _attribution_trace(handle, batch),
                   lambda result, _values: result) for b, batch in enumerate(found)]
    values = run_units(handle, units, step, lambda _unit: None)
    est = np.zeros((a.n_layers, a.n_heads))
    clean_lp = 0.0
    for unit in units:
        est += np.asarray(values[unit.key]["estimate"], dtype=np.float64)
        clean_lp += values[unit.key]["clean_logprob"]
    n = sum(len(batch.cols) for batch in found)
    return HeadEffects(absent_nan(est / n, a), None, clean_lp / n, None, "attribution")
