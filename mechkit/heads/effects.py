"""How much each head matters for a task: the effect of zero-ablating it, one head at a time.

Metric: mean log-probability of the answer tokens (teacher-forced) and teacher-forced exact
match. Two methods:

- ``exact``: every head is really ablated. A head at layer L cannot change layers below L, so
  the clean forward's block inputs are captured once and each ablated run replays only blocks
  L…end (:func:`mechkit.model.edit.partial.run_from`), unembedding only the answer positions.
- ``attribution`` (attribution patching): one forward and one backward pass give ∂metric/∂z for
  every head output z; zero-ablation's effect is estimated as (0 − z)·∂metric/∂z. A first-order
  approximation, so the report gives its rank agreement with ``exact``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.eval.scoring import batches, forward_kept, row_metrics, supports_logits_to_keep
from mechkit.heads.sums import HeadEffects, LogprobSum, absent_nan
from mechkit.hooking.core import gradients, hooks
from mechkit.model.edit.partial import capture_block_inputs, run_from

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def _zero_head(h: int) -> Callable:
    def fn(z, _point):
        return z.index_fill(2, torch.tensor([h], device=z.device), 0.0)

    return fn


def exact_effects(handle: ModelHandle, prompts: Sequence, batch_size: int = 16, on_layer=None,
                  step: Callable[[str, Callable], object] | None = None, map_units: Callable | None = None
                  ) -> HeadEffects:
    """Ablate every head for real, replaying only the blocks at and above its layer.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each (batch, layer) result, so an
    interrupted sweep resumes at the first unfinished layer with identical sums; the clean forward
    of a batch runs again only while some of its layers are unfinished. On nnsight (whole forwards
    only) the same steps are traces grouped into remote jobs (:mod:`mechkit.heads.traced_effects`).

    ``map_units`` (a plugin's ``ctx.map_units``) submits the same steps as units to the run's executor
    (:func:`exact_units`): with ``--executor ray`` the layers run on workers, with identical sums.
    """
    if handle.backend.traced:
        from mechkit.heads.traced_effects import exact_traced

        return exact_traced(handle, prompts, batch_size, on_layer, step)
    if map_units is not None:
        return _exact_mapped(handle, prompts, batch_size, on_layer, map_units)
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    lp = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    acc = torch.zeros_like(lp)
    clean_lp = clean_acc = 0.0
    n = 0
    with torch.no_grad():
        for b, batch in enumerate(batches(handle, prompts, batch_size)):
            clean = _CleanRun(handle, batch)
            base = step(f"exact|batch{b}|clean", lambda clean=clean: [t.tolist() for t in clean.metrics()])
            base_lp, base_acc = (torch.tensor(v, dtype=torch.float32) for v in base)
            clean_lp += float(base_lp.sum())
            clean_acc += float(base_acc.sum())
            n += len(batch.cols)
            for layer in range(a.n_layers):
                row = step(f"exact|batch{b}|layer{layer}",
                           lambda clean=clean, layer=layer, base_lp=base_lp, base_acc=base_acc:
                           _layer_effects(clean, layer, base_lp, base_acc))
                lp[layer, :len(row["logprob"])] += torch.tensor(row["logprob"], dtype=torch.float64)
                acc[layer, :len(row["accuracy"])] += torch.tensor(row["accuracy"], dtype=torch.float64)
                if on_layer:
                    on_layer()
    return HeadEffects(absent_nan(lp / n, a), absent_nan(acc / n, a), clean_lp / n, clean_acc / n, "exact")


class _CleanRun:
    """A batch's clean forward — block inputs and per-row metrics — run once, and only if needed."""

    def __init__(self, handle: ModelHandle, batch) -> None:
        self.handle, self.batch = handle, batch
        self._done: tuple | None = None

    def run(self) -> tuple:
        if self._done is None:
            with capture_block_inputs(self.handle) as inputs:
                logits = forward_kept(self.handle, self.batch)
            self._done = (inputs, row_metrics(logits, self.batch))
        return self._done

    def metrics(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run()[1]


def _layer_effects(clean: _CleanRun, layer: int, base_lp: torch.Tensor, base_acc: torch.Tensor) -> dict:
    """Summed (ablated − clean) log-prob and accuracy over the batch's rows, for each head of ``layer``."""
    handle, batch = clean.handle, clean.batch
    inputs, _ = clean.run()
    keep = batch.keep.to(handle.device)
    out = {"logprob": [], "accuracy": []}
    for h in range(handle.anatomy.heads_in(layer)):  # this layer's own heads (fewer where heads were pruned)
        with hooks(handle, {f"blocks.{layer}.attn.hook_z": _zero_head(h)}):
            logits = run_from(handle, layer, inputs, positions=keep)
        abl_lp, abl_acc = row_metrics(logits, batch)
        out["logprob"].append(float((abl_lp - base_lp.to(abl_lp.device)).sum()))
        out["accuracy"].append(float((abl_acc - base_acc.to(abl_acc.device)).sum()))
    return out


def exact_units(handle: ModelHandle, shared: tuple, units: list):
    """The exact sweep's units, for an executor: ``("clean", b)`` gives batch b's per-row clean log-prob and
    exact match, ``("layer", b, L)`` the summed effects of each head of layer L on batch b. ``shared`` is
    ``(prompts, batch_size)``. A batch's clean forward runs once for its units in one call, and each
    unit's value depends on nothing else, so any split of the units gives the same values."""
    prompts, batch_size = shared
    batched = batches(handle, prompts, batch_size)
    current, clean = None, None
    for kind, b, *layer in units:
        if b != current:
            current, clean = b, _CleanRun(handle, batched[b])
        with torch.no_grad():
            value = [t.tolist() for t in clean.metrics()] if kind == "clean" else \
                _layer_effects(clean, layer[0], *clean.metrics())
        yield value


def _exact_mapped(handle: ModelHandle, prompts: Sequence, batch_size: int, on_layer, map_units: Callable
                  ) -> HeadEffects:
    """:func:`exact_effects` with its (batch, layer) steps submitted as units through ``map_units``:
    the same keys, values and order of summation as the loop above."""
    a = handle.anatomy
    sizes = [len(batch.cols) for batch in batches(handle, prompts, batch_size)]
    units = [u for b in range(len(sizes)) for u in (("clean", b), *(("layer", b, L) for L in range(a.n_layers)))]
    keys = [f"exact|batch{u[1]}|" + ("clean" if u[0] == "clean" else f"layer{u[2]}") for u in units]

    def done(i: int, _value) -> None:
        if on_layer and units[i][0] == "layer":
            on_layer()

    values = map_units(exact_units, (list(prompts), batch_size), units, keys, on_result=done)
    lp = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    acc = torch.zeros_like(lp)
    clean_lp = clean_acc = 0.0
    for unit, value in zip(units, values, strict=True):
        if unit[0] == "clean":
            base_lp, base_acc = (torch.tensor(v, dtype=torch.float32) for v in value)
            clean_lp += float(base_lp.sum())
            clean_acc += float(base_acc.sum())
        else:
            lp[unit[2], :len(value["logprob"])] += torch.tensor(value["logprob"], dtype=torch.float64)
            acc[unit[2], :len(value["accuracy"])] += torch.tensor(value["accuracy"], dtype=torch.float64)
    n = sum(sizes)
    return HeadEffects(absent_nan(lp / n, a), absent_nan(acc / n, a), clean_lp / n, clean_acc / n, "exact")


def attribution_effects(handle: ModelHandle, prompts: Sequence, batch_size: int = 16,
                        step: Callable[[str, Callable], object] | None = None) -> HeadEffects:
    """Estimate every head's zero-ablation effect from one forward and one backward pass per batch.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each batch's sums, so an interrupted run
    resumes at the first unfinished batch. On nnsight the batches' traces are grouped into remote jobs.
    """
    if handle.backend.traced:
        from mechkit.heads.traced_effects import attribution_traced

        return attribution_traced(handle, prompts, batch_size, step)
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    est = np.zeros((a.n_layers, a.n_heads))
    clean_lp, n = 0.0, 0
    for b, batch in enumerate(batches(handle, prompts, batch_size)):
        part = step(f"attribution|batch{b}", lambda batch=batch: _attribution_sums(handle, batch))
        est += np.asarray(part["estimate"], dtype=np.float64)
        clean_lp += part["clean_logprob"]
        n += len(batch.cols)
    return HeadEffects(absent_nan(est / n, a), None, clean_lp / n, None, "attribution")


def _attribution_sums(handle: ModelHandle, batch) -> dict:
    """One batch's summed (0 − z)·∂metric/∂z per head (``[n_layers][n_heads]``) and summed clean log-prob.

    One forward and one backward (:func:`mechkit.hooking.gradients`: inside the trace on nnsight, so a
    remote run sends back only the head outputs and their gradients)."""
    a = handle.anatomy
    est = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    ids, mask = batch.ids.to(handle.device), batch.mask.to(handle.device)
    kept = supports_logits_to_keep(handle.model)
    kwargs = {"attention_mask": mask, **({"logits_to_keep": batch.keep.to(handle.device)} if kept else {})}
    metric = LogprobSum(batch, kept)
    value, found = gradients(handle, "blocks.*.attn.hook_z", ids, metric, **kwargs)
    with torch.no_grad():
        for layer in range(a.n_layers):
            z, g = found[f"blocks.{layer}.attn.hook_z"]
            valid = batch.mask.to(g.device)[:, :, None, None].to(g.dtype)
            est[layer, :z.shape[2]] += ((-z.to(g.device)) * g * valid).sum(dim=(0, 1, 3)).double().cpu()
    return {"estimate": est.tolist(), "clean_logprob": float(value)}


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman rank correlation of two score grids over the cells both have (a pruned layer's missing heads
    are NaN in both); ``None`` where it is undefined (a constant grid).

    >>> spearman(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])) is None
    True
    """
    import warnings

    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on a constant input before returning NaN
        a, b = np.ravel(a).astype(float), np.ravel(b).astype(float)
        both = np.isfinite(a) & np.isfinite(b)
        rho = float(spearmanr(a[both], b[both]).statistic)
    return rho if np.isfinite(rho) else None
