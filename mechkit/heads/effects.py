"""How much each head matters for a task: the effect of zero-ablating it, one head at a time.

Metric: mean log-probability of the answer tokens (teacher-forced) and teacher-forced exact
match. Two methods:

- ``exact``: every head is really ablated. A head at layer L cannot change layers below L, so
  the clean forward's block inputs are captured once and each ablated run replays only blocks
  L…end (:func:`mechkit.model.partial.run_from`), unembedding only the answer positions.
- ``attribution`` (attribution patching): one forward and one backward pass give ∂metric/∂z for
  every head output z; zero-ablation's effect is estimated as (0 − z)·∂metric/∂z. A first-order
  approximation, so the report gives its rank agreement with ``exact``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.eval.scoring import Batch, batches, forward_kept, row_metrics, supports_logits_to_keep
from mechkit.hooking.core import gradients, hooks
from mechkit.model.partial import capture_block_inputs, run_from

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def _zero_head(h: int) -> Callable:
    def fn(z, _point):
        return z.index_fill(2, torch.tensor([h], device=z.device), 0.0)

    return fn


@dataclass
class HeadEffects:
    """Effects of ablating each head, ``[n_layers, n_heads]``: ablated − clean."""

    logprob: np.ndarray
    accuracy: np.ndarray | None
    clean_logprob: float
    clean_accuracy: float | None
    method: str


def exact_effects(handle: ModelHandle, prompts: Sequence, batch_size: int = 16, on_layer=None,
                  step: Callable[[str, Callable], object] | None = None) -> HeadEffects:
    """Ablate every head for real, replaying only the blocks at and above its layer.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each (batch, layer) result, so an
    interrupted sweep resumes at the first unfinished layer with identical sums; the clean forward
    of a batch runs again only while some of its layers are unfinished.
    """
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
                lp[layer] += torch.tensor(row["logprob"], dtype=torch.float64)
                acc[layer] += torch.tensor(row["accuracy"], dtype=torch.float64)
                if on_layer:
                    on_layer()
    return HeadEffects((lp / n).numpy(), (acc / n).numpy(), clean_lp / n, clean_acc / n, "exact")


class _CleanRun:
    """A batch's clean forward — block inputs and per-row metrics — run once, and only if needed."""

    def __init__(self, handle: ModelHandle, batch) -> None:
        self.handle, self.batch = handle, batch
        self._done: tuple | None = None

    def run(self) -> tuple:
        if self._done is None:
            if "module_calls" not in self.handle.backend.serves:  # no partial forwards to replay from
                inputs, logits = None, forward_kept(self.handle, self.batch)
            else:
                with capture_block_inputs(self.handle) as inputs:
                    logits = forward_kept(self.handle, self.batch)
            self._done = (inputs, row_metrics(logits, self.batch))
        return self._done

    def metrics(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run()[1]


def _layer_effects(clean: _CleanRun, layer: int, base_lp: torch.Tensor, base_acc: torch.Tensor) -> dict:
    """Summed (ablated − clean) log-prob and accuracy over the batch's rows, for each head of ``layer``."""
    handle, batch = clean.handle, clean.batch
    if "module_calls" not in handle.backend.serves:  # nnsight: whole forwards, every head of the layer in one
        return _layer_effects_stacked(handle, batch, layer, base_lp, base_acc)
    inputs, _ = clean.run()
    keep = batch.keep.to(handle.device)
    out = {"logprob": [], "accuracy": []}
    for h in range(handle.anatomy.n_heads):
        with hooks(handle, {f"blocks.{layer}.attn.hook_z": _zero_head(h)}):
            logits = run_from(handle, layer, inputs, positions=keep)
        abl_lp, abl_acc = row_metrics(logits, batch)
        out["logprob"].append(float((abl_lp - base_lp.to(abl_lp.device)).sum()))
        out["accuracy"].append(float((abl_acc - base_acc.to(abl_acc.device)).sum()))
    return out


def _layer_effects_stacked(handle: ModelHandle, batch, layer: int, base_lp: torch.Tensor,
                           base_acc: torch.Tensor) -> dict:
    """:func:`_layer_effects` as one whole forward: the batch repeated once per head of ``layer``, copy h
    with head h zeroed (for backends that run whole forwards only: one trace per batch and layer)."""
    n_heads, rows = handle.anatomy.n_heads, len(batch.cols)
    stacked = Batch(batch.ids.repeat(n_heads, 1), batch.mask.repeat(n_heads, 1), batch.keep,
                    batch.cols * n_heads, batch.targets * n_heads)

    def zero_each(z, _point):
        z = z.clone()
        for h in range(z.shape[2]):
            z[h * rows:(h + 1) * rows, :, h] = 0.0
        return z

    with hooks(handle, {f"blocks.{layer}.attn.hook_z": zero_each}):
        abl_lp, abl_acc = row_metrics(forward_kept(handle, stacked), stacked)
    abl_lp, abl_acc = abl_lp.view(n_heads, rows), abl_acc.view(n_heads, rows)
    return {"logprob": [float((abl_lp[h] - base_lp.to(abl_lp.device)).sum()) for h in range(n_heads)],
            "accuracy": [float((abl_acc[h] - base_acc.to(abl_acc.device)).sum()) for h in range(n_heads)]}


def attribution_effects(handle: ModelHandle, prompts: Sequence, batch_size: int = 16,
                        step: Callable[[str, Callable], object] | None = None) -> HeadEffects:
    """Estimate every head's zero-ablation effect from one forward and one backward pass per batch.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each batch's sums, so an interrupted run
    resumes at the first unfinished batch.
    """
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    est = np.zeros((a.n_layers, a.n_heads))
    clean_lp, n = 0.0, 0
    for b, batch in enumerate(batches(handle, prompts, batch_size)):
        part = step(f"attribution|batch{b}", lambda batch=batch: _attribution_sums(handle, batch))
        est += np.asarray(part["estimate"], dtype=np.float64)
        clean_lp += part["clean_logprob"]
        n += len(batch.cols)
    return HeadEffects(est / n, None, clean_lp / n, None, "attribution")


def _attribution_sums(handle: ModelHandle, batch) -> dict:
    """One batch's summed (0 − z)·∂metric/∂z per head (``[n_layers][n_heads]``) and summed clean log-prob.

    One forward and one backward (:func:`mechkit.hooking.gradients`: inside the trace on nnsight, so a
    remote run sends back only the head outputs and their gradients)."""
    a = handle.anatomy
    est = torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64)
    ids, mask = batch.ids.to(handle.device), batch.mask.to(handle.device)
    kept = supports_logits_to_keep(handle.model)
    kwargs = {"attention_mask": mask, **({"logits_to_keep": batch.keep.to(handle.device)} if kept else {})}
    metric = _LogprobSum(batch, kept)
    value, found = gradients(handle, "blocks.*.attn.hook_z", ids, metric, **kwargs)
    with torch.no_grad():
        for layer in range(a.n_layers):
            z, g = found[f"blocks.{layer}.attn.hook_z"]
            valid = batch.mask.to(g.device)[:, :, None, None].to(g.dtype)
            est[layer] += ((-z.to(g.device)) * g * valid).sum(dim=(0, 1, 3)).double().cpu()
    return {"estimate": est.tolist(), "clean_logprob": float(value)}


class _LogprobSum:
    """The attribution metric: summed mean answer log-prob of a batch's rows, from its logits."""

    def __init__(self, batch, kept: bool) -> None:
        self.batch, self.kept = batch, kept

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.kept:
            logits = logits[:, self.batch.keep.to(logits.device)]
        return row_metrics(logits, self.batch)[0].sum()


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman rank correlation of two score grids; ``None`` where it is undefined (a constant grid).

    >>> spearman(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])) is None
    True
    """
    import warnings

    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on a constant input before returning NaN
        rho = float(spearmanr(np.ravel(a), np.ravel(b)).statistic)
    return rho if np.isfinite(rho) else None
