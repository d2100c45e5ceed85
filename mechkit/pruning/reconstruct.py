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
Statistics are accumulated per batch (``X Xᵀ``, ``X Yᵀ`` and sums), solved in float64, one layer at a
time: memory holds one layer's ``(n+1)²`` moments, never the activations of the calibration set.

*One-shot* (``sequential=False``): ``x`` comes from the dense model and ``y = W x``.
*Sequential*: layers are pruned and refitted bottom up; ``x`` comes from the model pruned and
refitted so far (for the MLP, with this layer's attention already refitted) and ``y`` is the dense
model's output on its own inputs, so each fit also absorbs the error of the layers below.

>>> import mechkit as mk
>>> from mechkit import pruning
>>> m = mk.load_model("tiny:llama")
>>> calib = pruning.calibrate(m, ["capitalize"], n=4, shots=2)
>>> plan = pruning.PrunePlan(mlp={0: list(range(32))}, compensate=True)
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
from mechkit.model.linear import weight_out_in
from mechkit.model.partial import capture_block_inputs
from mechkit.pruning.stats import encode

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.plan import PrunePlan

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
    """Weighted first and second moments of inputs ``x [T, n]`` and, optionally, targets ``y [T, m]``."""

    def __init__(self, n: int, m: int | None = None):
        self.w = 0.0
        self.sx = torch.zeros(n, dtype=torch.float64)
        self.sxx = torch.zeros(n, n, dtype=torch.float64)
        self.sy = torch.zeros(m, dtype=torch.float64) if m else None
        self.sxy = torch.zeros(n, m, dtype=torch.float64) if m else None

    def add(self, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor | None = None) -> None:
        # one product per batch (a few hundred tokens) in the activations' dtype, at least float32,
        # summed in float64
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(dtype)
        w = weight.to(x.device, dtype)[:, None]
        xw = x * w
        self.w += float(w.sum())
        self.sx += xw.sum(0).double().cpu()
        self.sxx += (xw.T @ x).double().cpu()
        if y is not None:
            y = y.to(dtype)
            self.sy += (y * w).sum(0).double().cpu()
            self.sxy += (xw.T @ y).double().cpu()


def solve(weight: torch.Tensor, keep: torch.Tensor, mom: Moments, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [out, kept], b [out])`` of the module docstring, in float64, from ``weight [out, in]`` (the dense
    projection) and the moments of its inputs (with targets, else ``y = W x``)."""
    W = weight.detach().double().cpu()
    n = max(mom.w, 1e-300)
    mu = mom.sx / n
    cov = mom.sxx / n - torch.outer(mu, mu)
    cov = (cov + cov.T) / 2
    k = keep.cpu()
    s_kk = cov[k][:, k]
    w_k = W[:, k]
    if mom.sxy is None:  # y = W x: Σ_Ky − Σ_KK W_Kᵀ = Σ_KR W_Rᵀ
        r = torch.ones(W.shape[1], dtype=torch.bool)
        r[k] = False
        mu_y, rhs = W @ mu, cov[k][:, r] @ W[:, r].T
    else:
        mu_y = mom.sy / n
        rhs = mom.sxy[k] / n - torch.outer(mu[k], mu_y) - s_kk @ w_k.T
    scale = float(s_kk.diagonal().mean()) if len(k) else 0.0
    lhs = s_kk + (ridge * scale if scale > 0 else 0.0) * torch.eye(len(k), dtype=torch.float64)
    chol, info = torch.linalg.cholesky_ex(lhs)
    if int(info) == 0 and ridge > 0:
        delta = torch.cholesky_solve(rhs, chol)
    else:  # singular (ridge 0 with dependent or dead inputs): the minimum-norm solution
        delta = torch.linalg.lstsq(lhs, rhs, driver="gelsd").solution
    a = w_k + delta.T
    return a, mu_y - a @ mu[k]


@contextlib.contextmanager
def _edited(edits: dict[nn.Module, Fit]) -> Iterator[None]:
    """Run dense modules as their fits: output ``x[..., keep] @ Aᵀ + bias`` (plus their own bias)."""
    removers = []

    def make(fit: Fit):
        def hook(module, args, _output):
            x = args[0]
            out = x[..., fit.keep.to(x.device)] @ fit.weight.to(x).T + fit.bias.to(x)
            bias = getattr(module, "bias", None)
            return out + bias if bias is not None else out

        return hook

    try:
        for module, fit in edits.items():
            removers.append(module.register_forward_hook(make(fit)))
        yield
    finally:
        for r in removers:
            r.remove()


@contextlib.contextmanager
def _inputs(modules: Sequence[nn.Module], sink: dict) -> Iterator[None]:
    """Record each module's input (``sink[module]``) during the forwards inside the context."""
    removers = []
    try:
        for module in modules:
            removers.append(module.register_forward_pre_hook(
                lambda mod, args: sink.__setitem__(mod, args[0].detach())))
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


def _stages(handle: ModelHandle, plan: PrunePlan, layer: int) -> list[tuple[nn.Module, torch.Tensor]]:
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


def reconstruct(handle: ModelHandle, plan: PrunePlan, batches: Sequence[TokenBatch], ridge: float = 1e-3,
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
            stages = _stages(handle, plan, layer) if layer not in gone else []
            edits: dict[nn.Module, Fit] = {}
            dense_in: list[dict] = [{} for _ in states]
            modules = [m for m, _ in stages]
            for s, inputs in zip(states, dense_in, strict=True):  # the dense path, one block up
                seen: dict = {}
                with _inputs(modules, seen):
                    nxt = _run_block(handle, layer, s.dense, s.args[layer], s.kwargs[layer])
                for m in modules:
                    inputs[m] = seen[m][s.mask]
                s.dense = nxt
            for module, keep in stages:
                w = weight_out_in(module)
                mom = Moments(w.shape[1], w.shape[0] if sequential else None)
                for s, inputs in zip(states, dense_in, strict=True):
                    if sequential:  # the input the pruned model sees; the dense output as target
                        seen = {}
                        with _inputs([module], seen), _edited(edits):
                            _run_block(handle, layer, s.pruned, s.args[layer], s.kwargs[layer])
                        x = inputs[module]
                        mom.add(seen[module][s.mask], s.weight, x @ w.detach().T.to(x))
                    else:
                        mom.add(inputs[module], s.weight)
                wk, bias = solve(w, keep, mom, ridge)
                edits[module] = Fit(wk.to(w.dtype), bias.to(w.dtype), keep)
                fits[names[id(module)]] = edits[module]
            for s in states:
                if not sequential:
                    s.pruned = s.dense
                elif layer not in gone:  # a removed block passes its input through
                    with _edited(edits):
                        s.pruned = _run_block(handle, layer, s.pruned, s.args[layer], s.kwargs[layer])
    return fits

