"""Least-squares reconstruction: refit what reads the pruned units, so each layer's output stays the dense one.

When a plan removes MLP channels (or query heads) of a layer, the projection that read them
(the MLP's down projection; the attention output projection) loses those input columns. Mean
compensation (FLAP) adds ``W_R·E[x_R]`` as a bias. Reconstruction refits the kept columns ``A`` and
a bias ``b`` on calibration activations instead (token-weighted expectations, ``λ`` the ridge)::

    A, b = argmin E‖y − A x_K − b‖² + λ‖A − W_K‖²

``x`` is the projection's input, ``y`` the dense projection's output (bias excluded), ``K`` the
kept inputs. Centred, ``Aᵀ = W_Kᵀ + (Σ_KK + λI)⁻¹(Σ_Ky − Σ_KK W_Kᵀ)`` and ``b = E[y] − A E[x_K]``.
With ``y = W x``: ``λ → ∞`` is mean compensation (``A = W_K``, ``b = W_R E[x_R]``), its zero-order
special case; ``λ = 0`` the exact least-squares fit, which recovers the dense output exactly when
the removed inputs are affine in the kept ones. ``λ`` is ``ridge × mean(diag Σ_KK)`` (scale-free).
The target ``y`` is the dense projection's output (recorded, not recomputed), so only the kept
inputs' moments are accumulated (``X_K X_Kᵀ``, ``X_K Yᵀ`` and sums, per batch, about the first batch's
mean) — at 45% of channels removed, a third of the full ``X Xᵀ`` — and solved in float64, one layer
at a time, block by block: memory holds one layer's moments, the calibration tokens' hidden states
at that layer (the dense and the pruned path) and the dense outputs of that layer's refitted
projections (one-shot, also their kept inputs) — never every layer's activations.

*One-shot* (``sequential=False``): ``x`` comes from the dense model; one forward of the calibration
tokens plus the first one that captures block 0's inputs (kept for the next plan on the same batches).
*Sequential*: layers are pruned and refitted bottom up; ``x`` comes from the model pruned and
refitted so far (for the MLP, with this layer's attention already refitted) and ``y`` is the dense
model's output on its own inputs, so each fit also absorbs the error of the layers below; per
layer, one dense block pass, one pruned pass per refitted projection and one to move up (about
2–3 forwards in all, the pruned ones cheaper).

>>> import mechkit as mk
>>> from mechkit import pruning
>>> m = mk.load_model("tiny:llama")
>>> calib = pruning.calibrate(m, ["capitalize"], n=4, shots=2)
>>> plan = pruning.UnitsToRemove(mlp={0: list(range(32))}, compensate=True)
>>> fits = pruning.reconstruct(m, plan, calib.token_batches(m), ridge=1e-3)
>>> small = pruning.prune_copy(m, plan, calib.stats, fits)
>>> tuple(small.model.model.layers[0].mlp.down_proj.weight.shape), small.model.model.layers[0].mlp.down_proj.bias is not None
((64, 96), True)
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mechkit.eval.scoring import last_logits_only
from mechkit.model.edit.partial import capture_block_inputs
from mechkit.model.modules.linear import weight_out_in
from mechkit.model.placement.stored import module_tensor
from mechkit.pruning.stats import encode

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.plan import UnitsToRemove

METHODS = ("none", "mean", "lsq")


@dataclass
class TokenBatch:
    """Calibration tokens: padded ``ids`` and ``mask`` and each real token's weight (``mask`` order)."""

    ids: torch.Tensor
    mask: torch.Tensor
    weight: torch.Tensor  # [n real tokens], float64; all batches of a calibration set sum to 1
    _blocks: tuple | None = field(default=None, repr=False)  # (weakref to the model, block-0 input, args, kwargs)

    def block_inputs(self, handle: ModelHandle) -> tuple[torch.Tensor, dict, dict]:
        """Block 0's input and every block's other arguments (masks, rotary embeddings) for these
        tokens, from one forward of ``handle``, kept for the next reconstruction of the same model."""
        if self._blocks is None or self._blocks[0]() is not handle.model:
            with torch.no_grad(), capture_block_inputs(handle) as cap:
                handle(self.ids.to(handle.device), attention_mask=self.mask.to(handle.device),
                       **last_logits_only(handle))
            self._blocks = (weakref.ref(handle.model), cap.hidden[0], cap.args, cap.kwargs)
        return self._blocks[1:]


@dataclass
class Fit:
    """A refitted output projection: kept input columns ``weight [out, kept]`` (``[out, in]`` layout),
    the ``bias`` added to its output, and the kept input indices ``keep`` (dense numbering)."""

    weight: torch.Tensor
    bias: torch.Tensor
    keep: torch.Tensor


def token_batches(handle: ModelHandle, groups: Sequence[tuple[Sequence[str], float]],
                  batch_size: int = 8) -> list[TokenBatch]:
    """Batches of every group's texts, each group's tokens sharing its weight equally (groups with
    weight 0 or no text are left out; the weights of the rest are renormalised to sum to 1)."""
    groups = [(list(texts), float(w)) for texts, w in groups if texts and w > 0]
    total = sum(w for _, w in groups) or 1.0
    out = []
    for texts, w in groups:
        lengths = [int(encode(handle, [t])["attention_mask"].sum()) for t in texts]
        per_token = w / total / max(sum(lengths), 1)
        order = sorted(range(len(texts)), key=lambda i: lengths[i])  # little padding
        for start in range(0, len(order), batch_size):
            chunk = [texts[i] for i in order[start:start + batch_size]]
            enc = encode(handle, chunk)
            n = int(enc["attention_mask"].sum())
            out.append(TokenBatch(enc["input_ids"], enc["attention_mask"],
                                  torch.full((n,), per_token, dtype=torch.float64)))
    return out


class Moments:
    """Weighted first and second moments of inputs ``x [T, n]`` and, optionally, targets ``y [T, m]``.

    Sums are taken about the first batch's weighted mean (``cx``, ``cy``), so the covariance is not the
    difference of two large numbers: an input whose mean dwarfs its spread (an attention head that
    mostly reads the first token) keeps its variance even though each batch's products are in float32.
    """

    def __init__(self, n: int, m: int | None = None):
        self.w = 0.0
        self.cx = torch.zeros(n, dtype=torch.float64)
        self.cy = torch.zeros(m, dtype=torch.float64) if m else None
        self.sx = torch.zeros(n, dtype=torch.float64)
        self.sxx = torch.zeros(n, n, dtype=torch.float64)
        self.sy = torch.zeros(m, dtype=torch.float64) if m else None
        self.sxy = torch.zeros(n, m, dtype=torch.float64) if m else None

    def add(self, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor | None = None) -> None:
        # one product per batch (a few thousand tokens) in the activations' dtype, at least float32,
        # summed in float64
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        w = weight.to(x.device, dtype)[:, None]
        if self.w == 0.0:
            self.cx = _weighted_mean(x, w)
            self.cy = _weighted_mean(y, w) if y is not None else None
        x = x.to(dtype) - self.cx.to(x.device, dtype)
        xw = x * w
        self.w += float(w.sum())
        self.sx += xw.sum(0).double().cpu()
        self.sxx += (xw.T @ x).double().cpu()
        if y is not None:
            y = y.to(dtype) - self.cy.to(y.device, dtype)
            self.sy += (y * w).sum(0).double().cpu()
            self.sxy += (xw.T @ y).double().cpu()

    def stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(E[x], Cov(x, x), E[y], Cov(x, y))`` in float64 (the last two ``None`` without targets)."""
        n = max(self.w, 1e-300)
        dx = self.sx / n
        cov = self.sxx / n - torch.outer(dx, dx)
        cov = (cov + cov.T) / 2
        if self.sxy is None:
            return self.cx + dx, cov, None, None
        dy = self.sy / n
        return self.cx + dx, cov, self.cy + dy, self.sxy / n - torch.outer(dx, dy)


def _weighted_mean(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    t = t.double()
    return ((t * w.to(t)).sum(0) / w.sum().clamp_min(1e-300).to(t)).cpu()


def solve(weight: torch.Tensor, keep: torch.Tensor, mom: Moments, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [out, kept], b [out])`` of the module docstring, in float64, from ``weight [out, in]`` (the dense
    projection) and the moments of its inputs (with targets, else ``y = W x``)."""
    W = weight.detach().double().cpu()
    mu, cov, mu_y, cov_xy = mom.stats()
    k = keep.cpu()
    s_kk = cov[k][:, k]
    w_k = W[:, k]
    if cov_xy is None:  # y = W x: Σ_Ky − Σ_KK W_Kᵀ = Σ_KR W_Rᵀ
        r = torch.ones(W.shape[1], dtype=torch.bool)
        r[k] = False
        mu_y, rhs = W @ mu, cov[k][:, r] @ W[:, r].T
    else:
        rhs = cov_xy[k] - s_kk @ w_k.T
    scale = float(s_kk.diagonal().mean()) if len(k) else 0.0
    lhs = s_kk + (ridge * scale if scale > 0 else 0.0) * torch.eye(len(k), dtype=torch.float64)
    chol, info = torch.linalg.cholesky_ex(lhs)
    if int(info) == 0 and ridge > 0:
        delta = torch.cholesky_solve(rhs, chol)
    else:  # singular (ridge 0 with dependent or dead inputs): the minimum-norm solution
        delta = torch.linalg.lstsq(lhs, rhs, driver="gelsd").solution
    a = w_k + delta.T
    return a, mu_y - a @ mu[k]


def _bias(module: nn.Module) -> torch.Tensor | None:
    """The module's bias, also where accelerate offloaded it (its forward hooks run after the offload
    hook has put the parameter back on ``meta``)."""
    bias = getattr(module, "bias", None)
    return module_tensor(module, "bias") if bias is not None and bias.device.type == "meta" else bias


@contextlib.contextmanager
def _edited(edits: dict[nn.Module, Fit]) -> Iterator[None]:
    """Run dense modules as their fits: output ``x[..., keep] @ Aᵀ + bias`` (plus their own bias)."""
    removers = []

    def make(fit: Fit):
        def hook(module, args, _output):
            x = args[0]
            out = x[..., fit.keep.to(x.device)] @ fit.weight.to(x).T + fit.bias.to(x)
            bias = _bias(module)
            return out + bias.to(out) if bias is not None else out

        return hook

    try:
        for module, fit in edits.items():
            removers.append(module.register_forward_hook(make(fit)))
        yield
    finally:
        for r in removers:
            r.remove()


@contextlib.contextmanager
def _recording(keep: dict[nn.Module, torch.Tensor], inputs: dict | None, outputs: dict | None) -> Iterator[None]:
    """During the forwards inside the context, record each module's kept input columns
    (``inputs[module]``, ``[..., len(keep)]``) and its output without its own bias (``outputs[module]``)."""
    removers = []

    def pre(module, args):
        inputs[module] = args[0].detach()[..., keep[module].to(args[0].device)]

    def post(module, _args, output):
        bias = _bias(module)
        outputs[module] = (output - bias.to(output) if bias is not None else output).detach()

    try:
        for module in keep:
            if inputs is not None:
                removers.append(module.register_forward_pre_hook(pre))
            if outputs is not None:
                removers.append(module.register_forward_hook(post))
        yield
    finally:
        for r in removers:
            r.remove()


def _run_block(handle: ModelHandle, layer: int, hidden: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    out = handle.anatomy.layers[layer](hidden, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


@dataclass
class _State:
    """One calibration batch moving up the layers: the dense and the pruned path's hidden states."""

    dense: torch.Tensor
    pruned: torch.Tensor
    args: dict
    kwargs: dict
    mask: torch.Tensor
    weight: torch.Tensor


def _stages(handle: ModelHandle, plan: UnitsToRemove, layer: int) -> list[tuple[nn.Module, torch.Tensor]]:
    """The projections to refit in ``layer``, bottom up, with their kept input indices."""
    a = handle.anatomy
    out = []
    heads = sorted(plan.heads.get(layer, []))
    if heads:
        kept = [h for h in range(a.n_heads) if h not in set(heads)]
        out.append((a.attn_out(layer), torch.cat([torch.arange(h * a.d_head, (h + 1) * a.d_head) for h in kept])))
    channels = sorted(plan.mlp.get(layer, []))
    if channels:
        out.append((a.mlp_out(layer), torch.tensor([i for i in range(a.d_mlp) if i not in set(channels)])))
    return out


def reconstruct(handle: ModelHandle, plan: UnitsToRemove, batches: Sequence[TokenBatch], ridge: float = 1e-3,
                sequential: bool = False) -> dict[str, Fit]:
    """Least-squares refits of every output projection ``plan`` prunes (see the module docstring), keyed
    by the dense model's module names. ``handle`` is only read (hooks are removed on exit)."""
    a = handle.anatomy
    names = {id(m): n for n, m in handle.model.named_modules()}
    gone = set(plan.layers)
    todo = [layer for layer in range(a.n_layers) if layer not in gone and _stages(handle, plan, layer)]
    fits: dict[str, Fit] = {}
    if not todo:
        return fits
    states = []
    with torch.no_grad():
        for b in batches:
            hidden, args, kwargs = b.block_inputs(handle)
            states.append(_State(hidden, hidden, args, kwargs, b.mask.to(handle.device).bool(), b.weight))
        for layer in range(todo[-1] + 1):
            stages = dict(_stages(handle, plan, layer)) if layer not in gone else {}
            dense = _dense_step(handle, layer, states, stages, sequential)
            edits: dict[nn.Module, Fit] = {}
            for module, keep in stages.items():
                w = weight_out_in(module)
                mom = Moments(len(keep), w.shape[0])
                for s, (x, y) in zip(states, dense, strict=True):
                    if sequential:  # the input the pruned model sees (this layer's earlier fits applied)
                        x = {}
                        with _recording({module: keep}, x, None), _edited(edits):
                            _run_block(handle, layer, s.pruned, s.args[layer], s.kwargs[layer])
                    mom.add(x[module][s.mask], s.weight, y[module])
                wk, bias = solve(w[:, keep], torch.arange(len(keep)), mom, ridge)
                edits[module] = Fit(wk.to(w.dtype), bias.to(w.dtype), keep)
                fits[names[id(module)]] = edits[module]
            for s in states:
                if not sequential:
                    s.pruned = s.dense
                elif layer not in gone:  # a removed block passes its input through
                    with _edited(edits):
                        s.pruned = _run_block(handle, layer, s.pruned, s.args[layer], s.kwargs[layer])
    return fits


def _dense_step(handle: ModelHandle, layer: int, states: list[_State], stages: dict[nn.Module, torch.Tensor],
                sequential: bool) -> list[tuple[dict, dict]]:
    """Move every batch's dense path one block up, recording per refitted projection the dense output
    of the real tokens (the target ``y = W x``) and, one-shot, its kept input columns (the ``x``)."""
    out = []
    for s in states:
        x: dict = {}
        y: dict = {}
        with _recording(stages, None if sequential else x, y):
            s.dense = _run_block(handle, layer, s.dense, s.args[layer], s.kwargs[layer])
        out.append((x, {m: v[s.mask] for m, v in y.items()}))
    return out
