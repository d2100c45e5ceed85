"""Execution plans: which blocks, heads, MLP channels and tokens a forward runs, switched at run time.

A plan names what is *skipped*, in the dense model's indices:

- ``layers``: whole blocks, bypassed — the residual stream passes through unchanged and the block is
  not computed at all (no attention, no MLP, no KV-cache entry);
- ``heads``: query heads per layer, whose output (``blocks.L.attn.hook_z``) reads zero — exactly
  a zero ablation of those heads;
- ``mlp``: MLP channels per layer (in practice whole channel groups of a guide's order), whose
  activation (``blocks.L.mlp.hook_post``) reads zero;
- ``tokens``: context tokens dropped after a layer (:mod:`mechkit.adapt.tokens`).

:func:`run_plan` applies a plan to the one loaded model: blocks through a forward wrapper that
bypasses or runs them, heads and channels through hooks, tokens by narrowing the hidden states
and the arguments the model passes to the blocks above the selection (position embeddings,
position ids, attention mask). No weight is copied or edited, so switching plans costs nothing,
and every wrapper and hook is removed when the context exits (also on error). The plan can also be
chosen *during* the forward, after an early block, from that block's output (``choose=``): the
input-adaptive scheduler (:mod:`mechkit.adapt.scheduler`) works that way.

It runs inside the model's own ``forward``, so everything that calls the model — scoring,
``generate`` with a KV cache — runs under the plan. Block 0 always runs (the KV cache's length,
hence the positions of generated tokens, is read from it).

>>> import mechkit as mk, torch
>>> m = mk.load_model("tiny:llama")
>>> ids = m.to_tokens("input: cat\\noutput:")
>>> dense = m(ids)
>>> with run_plan(m, ExecutionPlan()):
...     same = m(ids)
>>> torch.equal(dense, same)
True
>>> with run_plan(m, ExecutionPlan(layers=(1,), tokens=None)):
...     shallow = m(ids)
>>> torch.equal(dense, shallow)
False
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from mechkit.adapt.tokens import (
    TokenSelection,
    gather_positions,
    keep_positions,
    kept_share,
    received_attention,
    scatter_positions,
)
from mechkit.errors import MechkitError
from mechkit.hooking.attention import pattern_hooks
from mechkit.hooking.core import hooks
from mechkit.model.compat import cache_in

if TYPE_CHECKING:
    from mechkit.model.anatomy import Anatomy
    from mechkit.model.handle import ModelHandle


NARROWED = ("position_embeddings", "position_ids", "attention_mask", "cache_position")
"""The block arguments that follow the sequence and are narrowed to the kept tokens."""


def _units(d: dict | None) -> dict[int, tuple[int, ...]]:
    return {int(k): tuple(sorted({int(u) for u in v})) for k, v in (d or {}).items() if v}


@dataclass
class ExecutionPlan:
    """What one forward skips (dense indices); the empty plan runs the dense model.

    ``attn_layers`` / ``mlp_layers`` bypass a block's whole attention / MLP (not computed; the
    output is what its output projection gives for zero input, its bias or zero). ``heads`` /
    ``mlp`` naming *every* head / channel of a layer become those when the plan is checked: the same
    function as the mask, without the compute.
    """

    layers: tuple[int, ...] = ()
    heads: dict[int, tuple[int, ...]] = field(default_factory=dict)
    mlp: dict[int, tuple[int, ...]] = field(default_factory=dict)
    tokens: TokenSelection | None = None
    name: str = ""
    attn_layers: tuple[int, ...] = ()
    mlp_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.layers = tuple(sorted({int(x) for x in self.layers}))
        self.attn_layers = tuple(sorted({int(x) for x in self.attn_layers} - set(self.layers)))
        self.mlp_layers = tuple(sorted({int(x) for x in self.mlp_layers} - set(self.layers)))
        gone_attn, gone_mlp = set(self.layers) | set(self.attn_layers), set(self.layers) | set(self.mlp_layers)
        self.heads = {k: v for k, v in _units(self.heads).items() if k not in gone_attn}
        self.mlp = {k: v for k, v in _units(self.mlp).items() if k not in gone_mlp}

    @property
    def is_dense(self) -> bool:
        return not (self.layers or self.attn_layers or self.mlp_layers or self.heads or self.mlp or self.tokens)

    def check(self, anatomy: Anatomy, first: int = 1) -> ExecutionPlan:
        """The plan for this model: indices checked (blocks below ``first`` always run: block 0 holds
        the KV cache's length; an adaptive plan is chosen after its signal block), and whole-layer
        head or channel sets turned into sub-block bypasses."""
        L = anatomy.n_layers
        for what, layers in (("layer", self.layers), ("attention", self.attn_layers), ("MLP", self.mlp_layers)):
            bad = [x for x in layers if not first <= x < L]
            if bad:
                raise MechkitError(f"the plan skips {what}(s) of layer(s) {bad}, outside {first}..{L - 1}",
                                   f"skip layers {first}..{L - 1} only (layers below {first} always run)")
        for what, units, size in (("heads", self.heads, anatomy.n_heads), ("mlp", self.mlp, anatomy.d_mlp)):
            for layer, idx in units.items():
                if not first <= layer < L or any(not 0 <= u < size for u in idx):
                    raise MechkitError(f"the plan's {what} at layer {layer} ({list(idx)[:5]}…) are outside the model",
                                       f"use layers {first}..{L - 1} and {what} indices 0..{size - 1}")
        if self.tokens is not None:
            self.tokens.check(L, anatomy.n_heads)
            t = self.tokens
            if t.layer < first - 1 or t.layer in self.layers or (t.needs_ranking and t.layer in self.attn_layers):
                raise MechkitError(f"token selection after layer {t.layer} needs that layer (and its attention) "
                                   "to run", f"select after a layer >= {max(first - 1, 0)} that the plan keeps")
        whole_attn = [k for k, v in self.heads.items() if len(v) == anatomy.n_heads]
        whole_mlp = [k for k, v in self.mlp.items() if len(v) == anatomy.d_mlp]
        if not whole_attn and not whole_mlp:
            return self
        return replace(self, attn_layers=self.attn_layers + tuple(whole_attn),
                       mlp_layers=self.mlp_layers + tuple(whole_mlp))

    def key(self) -> str:
        """A canonical string: equal plans have equal keys (the name is not part of it)."""
        d = self.as_dict()
        d.pop("name")
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        if self.name:
            return self.name
        parts = []
        if self.layers:
            parts.append("skip L" + ",".join(map(str, self.layers)))
        if self.attn_layers:
            parts.append("no attn L" + ",".join(map(str, self.attn_layers)))
        if self.mlp_layers:
            parts.append("no MLP L" + ",".join(map(str, self.mlp_layers)))
        if self.heads:
            parts.append(f"-{sum(map(len, self.heads.values()))} heads")
        if self.mlp:
            parts.append(f"-{sum(map(len, self.mlp.values()))} MLP ch")
        if self.tokens:
            parts.append(self.tokens.label())
        return "; ".join(parts) or "dense"

    def counts(self) -> dict[str, int]:
        return {"layers": len(self.layers), "attn_layers": len(self.attn_layers), "mlp_layers": len(self.mlp_layers),
                "heads": sum(map(len, self.heads.values())), "mlp_channels": sum(map(len, self.mlp.values()))}

    def as_dict(self) -> dict:
        return {"name": self.name, "layers": list(self.layers), "attn_layers": list(self.attn_layers),
                "mlp_layers": list(self.mlp_layers), "heads": {str(k): list(v) for k, v in self.heads.items()},
                "mlp": {str(k): list(v) for k, v in self.mlp.items()},
                "tokens": self.tokens.as_dict() if self.tokens else None}

    @classmethod
    def from_dict(cls, d: dict) -> ExecutionPlan:
        tokens = d.get("tokens")
        return cls(tuple(d.get("layers", ())), d.get("heads", {}), d.get("mlp", {}),
                   TokenSelection.from_dict(tokens) if tokens else None, d.get("name", ""),
                   tuple(d.get("attn_layers", ())), tuple(d.get("mlp_layers", ())))


def channel_groups(scores: Sequence[float], n_groups: int) -> list[list[int]]:
    """A layer's MLP channels in ``n_groups`` groups of (nearly) equal size, least important first
    by ``scores`` (higher = more important): skipping the first ``k`` groups skips the least
    important ``k/n_groups`` of the layer.

    >>> channel_groups([0.3, 0.1, 0.9, 0.2], 2)
    [[1, 3], [0, 2]]
    """
    order = sorted(range(len(scores)), key=lambda j: (scores[j], j))
    size, extra = divmod(len(order), n_groups)
    out, start = [], 0
    for g in range(n_groups):
        stop = start + size + (g < extra)
        out.append(sorted(order[start:stop]))
        start = stop
    return out


Chooser = Callable[[torch.Tensor, torch.Tensor], ExecutionPlan]
"""``choose(features, lengths)``: the plan for a batch from ``[batch, d_model]`` early-layer features
(each row's hidden state averaged over its prompt) and ``[batch]`` prompt lengths in tokens."""


class PlanRunner:
    """The plan in force inside a :func:`run_plan` context, and a log of what each sequence ran.

    ``log`` holds one entry per prefill (a new sequence): the plan's key and label, and the share
    of each row's tokens the selection kept (1.0 without token selection).
    """

    def __init__(self, handle: ModelHandle, plan: ExecutionPlan, choose: Chooser | None, choose_after: int):
        self.handle, self.initial, self.choose, self.choose_after = handle, plan, choose, choose_after
        self.plan = plan
        self.log: list[dict] = []
        self.decisions: list = []  # the scheduler's decisions, where one chooses (mechkit.adapt.adaptive)
        self._query_override: torch.Tensor | None = None
        self._prefill = False
        self._valid: torch.Tensor | None = None
        self._query: torch.Tensor | None = None
        self._keep: torch.Tensor | None = None
        self._selected: torch.Tensor | None = None
        self._extra = 0  # tokens run after the prefill (cached steps), this forward's included
        self._step = 0  # tokens in this forward
        self._keep_after = -1
        self._length = 0
        self._pattern: torch.Tensor | None = None
        self._tuple_out = False
        self.parts: dict[str, set[int]] = {}  # layers whose attn / mlp wrappers and heads / channels hooks exist
        self._shapes: dict[str, int] = {}  # tuple lengths the attention / MLP modules return (0: a tensor)
        self._narrowed: dict[int, object] = {}
        # a plan chosen after block ``choose_after`` may select tokens right there, ranked by that
        # block's attention: then the pattern is captured before the choice is known
        self.rank_at_choice = False

    def set_queries(self, positions: Sequence[int] | torch.Tensor | None) -> None:
        """From the next new sequence on, each row's query position (the prompt's last token) is
        ``positions[row]`` instead of its last real token (None: back to that): for teacher-forced
        scoring, where answer tokens follow the prompt. Ignored for batches of another size."""
        self._query_override = None if positions is None else torch.as_tensor(positions, dtype=torch.long).cpu()

    @contextlib.contextmanager
    def queries(self, positions: Sequence[int] | torch.Tensor) -> Iterator[None]:
        """:meth:`set_queries` while the context is open."""
        self.set_queries(positions)
        try:
            yield
        finally:
            self.set_queries(None)

    # --- the model's forward: a new sequence or a cached continuation --------------------------------

    def start(self, _module, args, kwargs) -> None:
        x = kwargs.get("input_ids")
        if x is None:
            x = args[0] if args else kwargs.get("inputs_embeds")
        past = cache_in(kwargs)
        seen = past.get_seq_length() if past is not None and hasattr(past, "get_seq_length") else 0
        self._narrowed = {}
        b, p = x.shape[:2]
        if seen:
            self._prefill, self._step = False, p
            self._extra += p
            return
        mask = kwargs.get("attention_mask")
        valid = mask.bool().cpu() if torch.is_tensor(mask) and mask.dim() == 2 else torch.ones(b, p, dtype=torch.bool)
        override = self._query_override
        if override is not None and len(override) == b:
            query = override.clone()
        else:  # the last real token of each row (left or right padding)
            query = p - 1 - valid.flip(1).int().argmax(1)
        self._prefill, self._valid, self._query, self._length = True, valid, query, p
        self.plan, self._keep, self._selected, self._keep_after = self.initial, None, None, -1
        self._pattern, self._extra, self._step = None, 0, p

    # --- one block -----------------------------------------------------------------------------------

    def wrap(self, layer: int, original: Callable) -> Callable:
        signature = inspect.signature(original)

        def forward(*args, **kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            plan = self.plan
            if layer in plan.layers:
                out = (hidden,) if self._tuple_out else hidden  # bypassed: the residual passes through
            else:
                if self._keep is not None and layer > self._keep_after:
                    args, kwargs = self._narrow(signature, args, kwargs)
                t = plan.tokens
                ranks = t is not None and t.layer == layer and t.needs_ranking
                if self._prefill and (ranks or (self.rank_at_choice and layer == self.choose_after)):
                    with pattern_hooks(self.handle, {layer: [self._capture]}):
                        out = original(*args, **kwargs)
                else:
                    out = original(*args, **kwargs)
                self._tuple_out = isinstance(out, tuple)
            return self._after(layer, out) if self._prefill else out

        return forward

    def wrap_part(self, layer: int, part: str, original: Callable, out_proj: torch.nn.Module) -> Callable:
        """The attention (``part="attn"``) or MLP of block ``layer``: bypassed where the plan says,
        returning what its output projection gives for zero input, in the structure the module returns."""
        d_model = self.handle.anatomy.d_model

        def forward(*args, **kwargs):
            skipped = self.plan.attn_layers if part == "attn" else self.plan.mlp_layers
            if layer not in skipped:
                out = original(*args, **kwargs)
                self._shapes[part] = len(out) if isinstance(out, tuple) else 0
                return out
            hidden = args[0] if args else kwargs["hidden_states"]
            zero = hidden.new_zeros(*hidden.shape[:-1], d_model)
            bias = getattr(out_proj, "bias", None)
            if bias is not None:
                zero = zero + bias.to(zero)
            n = self._shapes.get(part, 2 if part == "attn" else 0)
            return (zero, *([None] * (n - 1))) if n else zero

        return forward

    def _capture(self, pattern: torch.Tensor) -> None:
        b = pattern.shape[0]
        self._pattern = pattern[torch.arange(b), :, self._query.to(pattern.device)].detach()

    def _after(self, layer: int, out):
        """After block ``layer`` of a new sequence: choose the plan, select tokens, put them back at the end."""
        hidden = out[0] if isinstance(out, tuple) else out
        changed, last = False, layer == self.handle.anatomy.n_layers - 1
        if self.choose is not None and layer == self.choose_after:
            plan = self.choose(self._features(hidden), self._query + 1).check(self.handle.anatomy, first=layer + 1)
            self._installed(plan)
            self.plan = plan
        plan = self.plan
        if plan.tokens is not None and plan.tokens.layer == layer:
            t = plan.tokens
            received = received_attention(self._pattern, self._query, t.heads) if t.needs_ranking else None
            self._keep, self._selected = keep_positions(t, received, self._valid, self._query)
            self._keep_after = layer
            self._pattern = None
            hidden, changed = gather_positions(hidden, self._keep, 1), True
        if last:
            # dropped positions get zero hidden states: the model's output keeps its length, and the
            # kept positions (the query and what follows it) have their logits where callers look
            if self._keep is not None:
                hidden, changed = scatter_positions(hidden, self._keep, self._length), True
            shares = kept_share(self._selected, self._valid) if self._keep is not None else [1.0] * len(self._valid)
            self.log.append({"plan": plan.key(), "label": plan.label(), "kept": shares})
        if not changed:
            return out
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    def _installed(self, plan: ExecutionPlan) -> None:
        needs = {"attn": set(plan.attn_layers), "mlp": set(plan.mlp_layers), "heads": set(plan.heads),
                 "channels": set(plan.mlp)}
        missing = {k: sorted(v - self.parts.get(k, set())) for k, v in needs.items() if v - self.parts.get(k, set())}
        if missing:
            raise MechkitError(f"the chosen plan {plan.label()!r} touches units no candidate plan announced: {missing}",
                               "list every plan the chooser may return in run_plan(candidates=...)")

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[b, d]``: each row's hidden state averaged over its real prompt tokens (up to the query)."""
        pos = torch.arange(hidden.shape[1])
        w = (self._valid & (pos[None] <= self._query[:, None])).to(hidden.device, hidden.dtype)
        return (hidden * w[..., None]).sum(1) / w.sum(1, keepdim=True).clamp(min=1)

    def _narrow(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The block's arguments for the kept tokens: positions and mask rows (prefill) and mask columns.
        Arguments are found by name whether passed by keyword or by position (GPT-2 passes the mask
        positionally)."""
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            if name in NARROWED:
                key = id(value)
                if key not in self._narrowed:
                    self._narrowed[key] = self._narrow_one(name, value)
                bound.arguments[name] = self._narrowed[key]
        return bound.args, bound.kwargs

    def _narrow_one(self, name: str, value):
        keep = self._keep
        m, n = keep.shape[1], self._length
        if name == "attention_mask":
            return self._mask(value)
        if value is None:
            return None
        if name == "position_embeddings":
            return tuple(gather_positions(t, keep, 1) for t in value) if self._prefill else value
        if name == "position_ids":
            return gather_positions(value, keep, 1) if self._prefill else value
        return torch.arange(m, device=value.device) if self._prefill else value - (n - m)  # cache_position

    def _mask(self, value):
        """The attention mask over the kept keys (fillers masked out): the model's own mask narrowed
        (rows too in the prefill), or, where the model passes none (causal SDPA), a boolean one built
        only when some kept position is a filler."""
        keep, n = self._keep, self._length
        b, m = keep.shape
        extra = self._extra if not self._prefill else 0  # tokens after the prefill, this forward's included
        cols = torch.cat([keep, torch.arange(n, n + extra).expand(b, extra)], dim=1)
        col_ok = torch.cat([self._selected, torch.ones(b, extra, dtype=torch.bool)], dim=1)
        if value is None:
            if bool(col_ok.all()):
                return None
            rows = keep if self._prefill else torch.arange(n + extra - self._step, n + extra).expand(b, self._step)
            allowed = (cols[:, None, :] <= rows[:, :, None]) & col_ok[:, None, :]
            return allowed[:, None].to(self.handle.device)
        if not torch.is_tensor(value):
            raise MechkitError(f"token selection cannot narrow an attention mask of type {type(value).__name__}",
                               "use the sdpa or eager attention implementation")
        kv = value.shape[-1]
        if kv == n + extra:  # sized from a block below the selection: every position has a column
            value = gather_positions(value, cols, value.dim() - 1)
        elif kv != m + extra:  # else sized from a block above it (Gemma-2's first full-attention layer)
            raise MechkitError(f"an attention mask over {kv} keys fits neither {n + extra} positions nor "
                               f"{m + extra} kept ones", "run this model without token selection")
        if self._prefill and value.dim() == 4:
            value = gather_positions(value, keep, 2)
        if bool(col_ok.all()):
            return value
        shape = (b, *([1] * (value.dim() - 2)), col_ok.shape[1])
        ok = col_ok.reshape(shape).to(value.device)
        return value & ok if value.dtype == torch.bool else value.masked_fill(~ok, torch.finfo(value.dtype).min)


@contextlib.contextmanager
def run_plan(handle: ModelHandle, plan: ExecutionPlan | None = None, *, choose: Chooser | None = None,
             choose_after: int = 0, candidates: Sequence[ExecutionPlan] = ()) -> Iterator[PlanRunner]:
    """Run ``handle`` under ``plan`` (default: dense) while the context is open; yields the runner.

    With ``choose``, the plan of each new sequence is ``choose(features)`` from the output of block
    ``choose_after`` (``plan`` runs until then); ``candidates`` lists every plan it may return, so
    the hooks their heads and channels need are in place. Bypassing wrappers and hooks are removed
    on exit, also on error.
    """
    plan = (plan or ExecutionPlan()).check(handle.anatomy)
    runner = PlanRunner(handle, plan, choose, choose_after)
    first = choose_after + 1 if choose is not None else 1
    every = [plan, *(c.check(handle.anatomy, first=first) for c in candidates)]
    runner.rank_at_choice = choose is not None and any(
        p.tokens is not None and p.tokens.layer == choose_after and p.tokens.needs_ranking for p in every[1:])
    fns: dict[str, object] = {}
    runner.parts["heads"] = {x for p in every for x in p.heads}
    runner.parts["channels"] = {x for p in every for x in p.mlp}
    for layer in sorted(runner.parts["heads"]):
        fns[f"blocks.{layer}.attn.hook_z"] = lambda z, point: _zero(z, runner.plan.heads.get(point.layer), 2)
    for layer in sorted(runner.parts["channels"]):
        fns[f"blocks.{layer}.mlp.hook_post"] = lambda x, point: _zero(x, runner.plan.mlp.get(point.layer), -1)
    a = handle.anatomy
    for part in ("attn", "mlp"):  # layer 0 always runs: it tells the module's output structure
        layers = {x for p in every for x in getattr(p, f"{part}_layers")}
        runner.parts[part] = layers | {0} if layers else set()
    modules = [(a.block(i), lambda i=i, f=None: runner.wrap(i, f)) for i in range(a.n_layers)]
    modules += [(a.attn(i), lambda i=i, f=None: runner.wrap_part(i, "attn", f, a.attn_out(i)))
                for i in sorted(runner.parts["attn"])]
    modules += [(a.mlp(i), lambda i=i, f=None: runner.wrap_part(i, "mlp", f, a.mlp_out(i)))
                for i in sorted(runner.parts["mlp"])]
    previous = [m.__dict__.get("forward") for m, _ in modules]
    with hooks(handle, fns):
        remover = handle.model.register_forward_pre_hook(runner.start, with_kwargs=True)
        try:
            for (module, make), prev in zip(modules, previous, strict=True):
                module.forward = make(f=prev or module.forward)
            yield runner
        finally:
            remover.remove()
            for (module, _), prev in zip(modules, previous, strict=True):
                if prev is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.forward = prev


def _zero(x: torch.Tensor, units: tuple[int, ...] | None, dim: int) -> torch.Tensor | None:
    if not units:
        return None
    return x.index_fill(dim, torch.tensor(units, device=x.device), 0.0)
