"""The checks behind the coverage matrix (:mod:`tools.arch_coverage`): each mechkit primitive on one tiny
model, compared with the model's own HF forward. A check returns nothing or raises with one line."""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMES = ("blocks.*.attn.hook_z", "blocks.*.attn.hook_pattern", "blocks.*.hook_resid_pre",
         "blocks.*.hook_resid_post", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out")


def _mlp_point(anatomy) -> str:
    """The MLP's units: dense neurons, or a mixture of experts' router logits."""
    return "mlp.hook_router" if anatomy.is_moe else "mlp.hook_post"


def _ids(seed: int, batch: int = 2, pos: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, pos), generator=gen)


def _same(a: torch.Tensor, b: torch.Tensor, what: str, exact: bool = False, tol: float = 1e-4) -> None:
    if exact:
        if not torch.equal(a, b):
            raise AssertionError(f"{what}: not bit-exact (max diff {(a - b).abs().max().item():.3g})")
    elif not torch.allclose(a, b, atol=tol, rtol=tol):
        raise AssertionError(f"{what}: max diff {(a - b).abs().max().item():.3g}")


def _differs(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if torch.equal(a, b):
        raise AssertionError(f"{what} changed nothing")


class Checks:
    """The checks on one loaded model; ``ref`` is the plain HF forward's logits before mechkit saw it."""

    def __init__(self, handle, ref: torch.Tensor) -> None:
        self.m, self.ref, self.ids, self.other = handle, ref, _ids(0), _ids(1, batch=3)
        a = handle.anatomy
        self.heads = f"0.1,{a.n_layers - 1}.0"

    def logits(self) -> None:
        _same(self.m(self.ids), self.ref, "logits vs HF", exact=True)

    def record(self) -> None:
        import mechkit as mk

        a, (b, p) = self.m.anatomy, self.ids.shape
        routed = ["blocks.*.mlp.hook_routing", "blocks.*.mlp.hook_expert_out"] if a.expert_routing else []
        names = [*NAMES, f"blocks.*.{_mlp_point(a)}", *routed]
        with mk.record(self.m, names) as cache:
            logits = self.m(self.ids)
        _same(logits, self.ref, "logits while recording")
        for layer in range(a.n_layers):
            z = cache[f"blocks.{layer}.attn.hook_z"]
            if tuple(z.shape) != (b, p, a.n_heads, a.head_size(layer)):
                raise AssertionError(f"hook_z shape {tuple(z.shape)} != {(b, p, a.n_heads, a.head_size(layer))}")
            pat = cache[f"blocks.{layer}.attn.hook_pattern"]
            if tuple(pat.shape) != (b, a.n_heads, p, p):
                raise AssertionError(f"hook_pattern shape {tuple(pat.shape)} != {(b, a.n_heads, p, p)}")
            rows = pat.sum(-1)
            if hasattr(a.attn(layer), "sinks"):  # attention sinks (GPT-OSS) take part of each row's mass
                if rows.max() > 1 + 1e-4:
                    raise AssertionError(f"pattern rows sum to {rows.max().item():.4g} > 1")
            else:
                _same(rows, torch.ones_like(rows), "pattern rows sum to 1")
            if pat.triu(1).abs().max() > 0:
                raise AssertionError("pattern attends to future positions")
            for name in NAMES[2:]:
                if f"blocks.{layer}.{name.split('.', 2)[2]}" not in cache:
                    raise AssertionError(f"{name} not recorded")
            if f"blocks.{layer}.{_mlp_point(a)}" not in cache:  # a leading dense layer of an MoE model
                continue
            units = cache[f"blocks.{layer}.{_mlp_point(a)}"]
            want = (b, p, a.n_experts if a.is_moe else a.d_mlp)
            if tuple(units.shape) != want:
                raise AssertionError(f"{_mlp_point(a)} shape {tuple(units.shape)} != {want}")
            if a.expert_routing and tuple(cache[f"blocks.{layer}.mlp.hook_routing"].shape) != want:
                raise AssertionError(f"mlp.hook_routing shape {tuple(cache[f'blocks.{layer}.mlp.hook_routing'].shape)}")
            if a.expert_routing and tuple(cache[f"blocks.{layer}.mlp.hook_expert_out"].shape) != (*want, a.d_model):
                raise AssertionError(f"mlp.hook_expert_out shape {tuple(cache[f'blocks.{layer}.mlp.hook_expert_out'].shape)}")
        if a.expert_routing:  # each expert's output, summed back, is the bank's output
            with mk.hooks(self.m, {"blocks.*.mlp.hook_expert_out": lambda out, _p: out.clone()}):
                _same(self.m(self.ids), self.ref, "logits with each expert's output summed back")

        def same(pattern, _point):
            return pattern.clone()  # replacing the pattern with itself recomputes the output from it

        with mk.hooks(self.m, {"blocks.*.attn.hook_pattern": same}):
            _same(self.m(self.ids), self.ref, "logits with each pattern replaced by itself")

    def ablate(self) -> None:
        import mechkit as mk

        for mode in ("zero", "mean"):
            with mk.ablate(self.m, self.heads, mode=mode, reference=self.other):
                _differs(self.m(self.ids), self.ref, f"{mode} ablation")
            _same(self.m(self.ids), self.ref, f"logits after {mode} ablation", exact=True)
        if self.m.anatomy.expert_routing:
            expert = self._busy_expert()
            for mode in ("zero", "mean"):
                with mk.ablate(self.m, experts=expert, mode=mode, reference=self.other):
                    _differs(self.m(self.ids), self.ref, f"{mode} ablation of expert {expert}")
                _same(self.m(self.ids), self.ref, f"logits after {mode} ablation of expert {expert}", exact=True)

    def _busy_expert(self) -> str:
        """The expert the most tokens chose in the last routed layer (a tiny model's router may leave some
        experts unchosen: ablating one of those rightly changes nothing)."""
        import mechkit as mk

        with mk.record(self.m, "blocks.*.mlp.hook_routing") as cache:
            self.m(self.ids)
        name = list(cache)[-1]
        return f"{name.split('.')[1]}.e{int((cache[name] != 0).sum(dim=(0, 1)).argmax())}"

    def weights(self) -> None:
        import mechkit as mk
        from mechkit.model.headspec import Head

        layer = self.m.anatomy.n_layers - 1
        with mk.ablate(self.m, f"{layer}.0"):
            hooked = self.m(self.ids)
        with mk.edit_weights(self.m) as w:
            w.zero_head_output(Head(layer, 0))
            edited = self.m(self.ids)
        _differs(edited, self.ref, "zeroing a head's output weights")
        _same(edited, hooked, "zeroed output weights vs zeroed hook_z")
        _same(self.m(self.ids), self.ref, "logits after the weight edit", exact=True)

    def detect(self) -> None:
        import numpy as np

        from mechkit.heads.scores import head_scores, ov_copying_scores, repeated_tokens

        tokens = repeated_tokens(self.m, n_seqs=2, seg_len=6)
        scores = head_scores(self.m, tokens, 6)
        grids = [*scores.scores.values(), ov_copying_scores(self.m)]
        a = self.m.anatomy
        for grid in grids:
            if grid.shape != (a.n_layers, a.n_heads) or not np.isfinite(grid).all():
                raise AssertionError(f"scores of shape {grid.shape}, finite: {np.isfinite(grid).all()}")

    def nnsight(self) -> None:
        import mechkit as mk

        traced = mk.load_model(self.m.model, tokenizer=self.m.tokenizer, backend="nnsight")
        names = ["blocks.*.attn.hook_z", "blocks.*.hook_resid_post"]
        if self.m.anatomy.family.pattern != "softmax":  # an inline softmax is out of a trace's reach (NOTES)
            names.append("blocks.0.attn.hook_pattern")
        runs = []
        for handle in (self.m, traced):
            with mk.record(handle, names) as cache:
                logits = handle(self.ids)
            with mk.ablate(handle, self.heads):
                ablated = handle(self.ids)
            runs.append((logits, ablated, cache))
        (l0, a0, c0), (l1, a1, c1) = runs
        _same(l1, l0, "nnsight logits vs native")
        _same(a1, a0, "nnsight ablation vs native")
        for name in c0:
            _same(c1[name], c0[name], f"nnsight {name} vs native")


def _run(check: Callable[[], None]) -> str:
    try:
        with torch.no_grad():
            check()
        return "ok"
    except Exception as err:  # noqa: BLE001 - each check's failure is recorded, not raised
        return _error_line(err)


def _error_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def reference_logits(model) -> torch.Tensor:
    """The plain HF forward's logits on the checks' inputs, before mechkit sees the model."""
    with torch.no_grad():
        return model(_ids(0)).logits.clone()


def run_checks(model, ref: torch.Tensor, costly: bool = True) -> tuple[dict[str, str], str | None]:
    """``({check: "ok" | error line}, a note on the type or None where it did not load)``."""
    import mechkit as mk
    from mechkit.model.sources.tiny import byte_tokenizer

    try:
        handle = mk.load_model(model, tokenizer=byte_tokenizer())
    except Exception as err:  # noqa: BLE001 - a model mechkit cannot load is the finding
        return {"load": _error_line(err)}, None
    checks = Checks(handle, ref)
    names = ["logits", "record", "ablate", "weights"] + (["detect", "nnsight"] if costly else [])
    return {"load": "ok", **{name: _run(getattr(checks, name)) for name in names}}, _note(handle.anatomy)


def _note(anatomy) -> str:
    """What a user of a working type should know (shown in the matrix's reason column)."""
    notes = [f"family row {anatomy.family_name!r}"]
    if anatomy.is_moe:
        points = "mlp.hook_router, mlp.hook_routing and mlp.hook_expert_out" if anatomy.expert_routing else "mlp.hook_router"
        notes.append(f"mixture of {anatomy.n_experts} experts: {points}, no dense mlp.hook_post")
    if anatomy.family.pattern == "softmax":
        notes.append("patterns on the native backend only (inline softmax)")
    elif anatomy.family.pattern is not None:
        notes.append(f"inline attention: patterns at attn.{anatomy.family.pattern}")
    if anatomy.n_kv_heads != anatomy.n_heads:
        notes.append(f"{anatomy.n_kv_heads} KV heads")
    return "; ".join(notes)
