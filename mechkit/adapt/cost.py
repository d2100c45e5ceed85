"""What a plan costs on this machine: measured latencies and a calibrated cost table that predicts them.

A plan's latency is measured, never assumed: :func:`measure` times the forward that answers a
prompt (its prefill, logits of the last position only) under each plan, interleaved
with the dense model on the same input — each plan's forward between two dense ones
(:func:`time_paired`), so the drift of a shared machine's speed cancels — and reports the median
ratio to dense. The clock is elapsed time, or on a one-thread CPU run the timing thread's CPU time
(:func:`resolve_clock`): on a shared machine elapsed time also counts other jobs.

The scheduler must know a plan's cost *before* running it, so :class:`CostTable` fits, on measured
plans, a small model of the ratio to dense. Each block's attention and MLP cost a fixed part and a
part proportional to the tokens they run on (the share ``ρ``); so for each part ``p``

    saved_p = (1 − ρ)·(share of blocks whose p is bypassed) + ρ·(share of token-blocks it does not run)
    ratio  ≈ 1 − βa·saved_attn − βm·saved_mlp + γ·ranks + η·masked

A bypassed block runs neither part, a bypassed sub-block one of them, a block above a token
selection runs only the kept tokens. ``ranks`` is 1 when the plan ranks tokens (one layer of eager
attention and the selection itself), ``masked`` the share of layers with masked heads or MLP
channels (hooks cost a little and masking saves nothing: the masked units are still computed).
βa and βm are the attention's and the MLPs' shares of the forward; ρ is fitted on a grid, the rest
by non-negative least squares. :meth:`CostTable.validate` compares predictions with measurements of plans it
was not fitted on. The dense latency itself grows with the prompt: ``dense_s ≈ a + b·tokens``,
for budgets in seconds.

>>> table = CostTable(beta_attn=0.3, beta_mlp=0.6, gamma=0.02, eta=0.01, dense_a=0.01, dense_b=0.001, n_layers=30,
...                   rho=0.8)
>>> from mechkit.adapt.plan import ExecutionPlan
>>> round(table.predict(ExecutionPlan(layers=tuple(range(1, 7))), 100), 3)   # 6 of 30 blocks bypassed
0.82
>>> round(table.predict(ExecutionPlan(mlp_layers=tuple(range(1, 7))), 100), 3)   # 6 MLPs
0.88
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.adapt.plan import ExecutionPlan, run_plan

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def kept_tokens(plan: ExecutionPlan, n_tokens: int) -> float:
    """The tokens a plan's selection keeps of a prompt of ``n_tokens`` (all without selection)."""
    t = plan.tokens
    if t is None or not t.needs_ranking:
        return float(n_tokens)
    protected = min(n_tokens, t.first + t.tail)
    return protected + math.ceil(t.keep * (n_tokens - protected))


def work(plan: ExecutionPlan, n_layers: int, n_tokens: int, part: str = "block") -> float:
    """Share of the dense model's token-layers (tokens × blocks) whose ``part`` (``"attn"``, ``"mlp"``,
    or ``"block"``: both, averaged) ``plan`` runs on a prompt of ``n_tokens``.

    >>> from mechkit.adapt.tokens import TokenSelection
    >>> round(work(ExecutionPlan(tokens=TokenSelection(layer=4, keep=0.5, first=0, tail=1)), 10, 100), 3)
    0.755
    """
    if part == "block":
        return (work(plan, n_layers, n_tokens, "attn") + work(plan, n_layers, n_tokens, "mlp")) / 2
    kept = kept_tokens(plan, n_tokens) / n_tokens
    cut = plan.tokens.layer if plan.tokens is not None else n_layers
    gone = set(plan.layers) | set(plan.attn_layers if part == "attn" else plan.mlp_layers)
    return sum(1.0 if layer <= cut else kept for layer in range(n_layers) if layer not in gone) / n_layers


def features(plan: ExecutionPlan, n_layers: int, n_tokens: int) -> tuple[float, ...]:
    """``(blocks_attn, blocks_mlp, tokens_attn, tokens_mlp, ranks, masked)``: the shares of blocks whose
    attention / MLP the plan bypasses, the shares of token-blocks they do not run, and the overheads."""
    masked = len(set(plan.heads) | set(plan.mlp)) / n_layers
    ranks = float(plan.tokens is not None and plan.tokens.needs_ranking)
    blocks = [len(set(plan.layers) | set(getattr(plan, f"{part}_layers"))) / n_layers for part in ("attn", "mlp")]
    tokens = [1.0 - work(plan, n_layers, n_tokens, part) for part in ("attn", "mlp")]
    return (*blocks, *tokens, ranks, masked)


def _saved(x: np.ndarray, rho: float) -> np.ndarray:
    """``[rows, 2]``: the effective share of attention and MLP cost saved, from :func:`features` rows."""
    return (1 - rho) * x[:, 0:2] + rho * x[:, 2:4]


def prompt_ids(handle: ModelHandle, text: str) -> torch.Tensor:
    return torch.tensor([handle.tokenizer(text)["input_ids"]], device=handle.device)


CLOCKS = ("auto", "wall", "cpu")


def resolve_clock(handle: ModelHandle, clock: str = "auto") -> str:
    """``"wall"`` (elapsed seconds, synchronised on CUDA) or ``"cpu"`` (the timing thread's CPU seconds).

    ``auto`` takes ``cpu`` on a CPU model computed by one thread: the forward runs on the calling
    thread, so that thread's CPU time is its latency on an idle core, and unlike elapsed time it does
    not count the time other jobs on a shared machine held the core (nor a progress bar's thread).
    Everywhere else (a GPU, several threads) it takes ``wall``."""
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; use one of {CLOCKS}")
    if clock != "auto":
        return clock
    return "cpu" if handle.device.type == "cpu" and torch.get_num_threads() == 1 else "wall"


def time_forward(handle: ModelHandle, ids: torch.Tensor, clock: str = "wall") -> float:
    """Seconds of one forward of ``ids`` (no cache, last-position logits): what answering costs, by
    ``clock`` (see :func:`resolve_clock`)."""
    from mechkit.eval.scoring import check_context, last_logits_only

    check_context(handle, ids.shape[-1])  # a direct forward skips the handle's checks: past a learned table, IndexError
    extra = last_logits_only(handle)
    now = time.thread_time if clock == "cpu" else time.perf_counter
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    start = now()
    with torch.no_grad():
        handle.model(input_ids=ids, use_cache=False, **extra)
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    return now() - start


Timer = Callable[[], "tuple[float, dict | None]"]
"""One timed forward: its seconds and the runner's last log entry (``None`` without one)."""


def forward_timer(handle: ModelHandle, ids: torch.Tensor, make: Callable[[], contextlib.AbstractContextManager],
                  clock: str = "wall") -> Timer:
    """A :data:`Timer` for one forward of ``ids`` on ``handle`` inside ``make()`` (a plan, the adaptive
    scheduler, or ``contextlib.nullcontext`` for the model as it is)."""
    def run() -> tuple[float, dict | None]:
        with make() as runner:
            seconds = time_forward(handle, ids, clock)
        log = getattr(runner, "log", None)
        return seconds, (log[-1] if log else None)
    return run


def time_paired(timers: Sequence[tuple[str, Timer]], repeats: int = 3,
                warmup: bool = False) -> tuple[dict[str, float], dict[str, dict]]:
    """How every measured ratio is timed (held-out inputs, the budget margin's calibration, the cost
    table's fit, static pruning): the first timer is the reference (dense), and each round runs it
    before and after every other timer — ``D t1 D t2 D … tk D`` — so each forward is compared with the
    reference forwards just beside it. On a shared machine the speed of a core drifts over seconds (one
    forward's time correlates 0.6–0.8 with the next one's, 0.3–0.4 ten forwards later on a
    shared 2-core machine: ``bench/timing_noise.py``), so a ratio of two
    medians taken a round apart carries the drift, and a ratio to the reference beside it cancels it.

    Returns per name the median seconds — the reference's own median, and for every other timer the
    reference's median × the median over rounds of (its seconds / the mean of its two neighbours), so
    ``seconds[t] / seconds[ref]`` is the paired ratio — and each timer's last log entry. The garbage
    collector is off while timing, as :mod:`timeit` does; ``warmup`` first runs every timer once untimed."""
    (ref_name, ref), *others = timers
    logs: dict[str, dict] = {}
    ref_times: list[float] = []
    ratios: dict[str, list[float]] = {name: [] for name, _ in others}

    def run(name: str, timer: Timer) -> float:
        seconds, log = timer()
        if log:
            logs[name] = log
        return seconds

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if warmup:
            for name, timer in timers:
                run(name, timer)
        for _ in range(repeats):
            before = run(ref_name, ref)
            ref_times.append(before)
            for name, timer in others:
                seconds = run(name, timer)
                after = run(ref_name, ref)
                ref_times.append(after)
                ratios[name].append(seconds / ((before + after) / 2))
                before = after
    finally:
        if was_enabled:
            gc.enable()
    ref_s = statistics.median(ref_times)
    out = {ref_name: ref_s} | {name: ref_s * statistics.median(r) for name, r in ratios.items()}
    return out, logs


def time_interleaved(handle: ModelHandle, ids: torch.Tensor,
                     makers: Sequence[tuple[str, Callable[[], contextlib.AbstractContextManager]]], repeats: int = 3,
                     clock: str = "wall") -> tuple[dict[str, float], dict[str, dict]]:
    """One input timed under each ``(name, make)`` context (a plan, the adaptive scheduler), the first
    being the reference (dense): :func:`time_paired` of their forwards of ``ids``."""
    return time_paired([(name, forward_timer(handle, ids, make, clock)) for name, make in makers], repeats)


def time_plans(handle: ModelHandle, plans: Sequence[ExecutionPlan], text: str, repeats: int = 3,
               clock: str = "wall") -> list[float]:
    """Seconds of the prefill of ``text`` under each plan, paired with the first (dense =
    ``ExecutionPlan()``) as :func:`time_paired` does, after one warm-up each."""
    ids = prompt_ids(handle, text)
    timers = [(str(i), forward_timer(handle, ids, lambda p=p: run_plan(handle, p), clock)) for i, p in enumerate(plans)]
    seconds, _ = time_paired(timers, repeats, warmup=True)
    return [seconds[str(i)] for i in range(len(plans))]


@dataclass
class Measured:
    """One plan timed on one prompt: its seconds, the dense seconds beside it, and their ratio."""

    plan: ExecutionPlan
    n_tokens: int
    seconds: float
    dense_s: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.dense_s


def measure(handle: ModelHandle, plans: Sequence[ExecutionPlan], texts: Sequence[str],
            repeats: int = 3, clock: str = "wall") -> list[Measured]:
    """Every plan timed on every text, each paired with the dense model (see :func:`time_paired`)."""
    out = []
    for text in texts:
        n = prompt_ids(handle, text).shape[1]
        dense, *rest = time_plans(handle, [ExecutionPlan(), *plans], text, repeats, clock)
        out += [Measured(p, n, s, dense) for p, s in zip(plans, rest, strict=True)]
    return out


@dataclass
class CostTable:
    """The calibrated cost model (see the module doc): ratio to dense from a plan and a prompt length."""

    beta_attn: float
    beta_mlp: float
    gamma: float
    eta: float
    dense_a: float
    dense_b: float
    n_layers: int
    rho: float = 1.0  # the token-proportional share of a block's cost
    noise: float = 0.0  # spread of repeated dense/dense ratios: what one measurement cannot resolve
    fit_error: float = 0.0  # largest |predicted − measured| ratio on the fitting plans
    under: float = 0.0  # largest measured − predicted on the fitting plans (reported; the margin: conformal)

    def predict(self, plan: ExecutionPlan, n_tokens: int) -> float:
        """Predicted latency of ``plan`` as a fraction of the dense model's on a prompt of ``n_tokens``."""
        x = np.array([features(plan, self.n_layers, n_tokens)])
        attn, mlp = _saved(x, self.rho)[0]
        ranks, masked = x[0, 4], x[0, 5]
        return float(1.0 - self.beta_attn * attn - self.beta_mlp * mlp + self.gamma * ranks + self.eta * masked)

    def dense_seconds(self, n_tokens: int) -> float:
        return self.dense_a + self.dense_b * n_tokens

    def per_layer_ms(self, n_tokens: int) -> float:
        """What bypassing one block saves on a prompt of ``n_tokens``, in milliseconds."""
        return 1000 * (self.beta_attn + self.beta_mlp) * self.dense_seconds(n_tokens) / self.n_layers

    @classmethod
    def fit(cls, measured: Sequence[Measured], n_layers: int, noise: float = 0.0) -> CostTable:
        """Least squares on measured ratios for each ρ on a grid, the best kept; and the dense seconds.
        Where the plans never bypass a sub-block alone, attention and MLP share one β, split 1:2."""
        X = np.array([features(m.plan, n_layers, m.n_tokens) for m in measured], dtype=float).reshape(-1, 6)
        y = np.array([1.0 - m.ratio for m in measured], dtype=float)  # = βa·a + βm·m − γ·ranks − η·masked
        best: tuple[float, float, np.ndarray] | None = None
        for rho in np.linspace(1.0, 0.0, 21):  # from 1: without token plans every ρ fits alike
            coef, sse = _least_squares(np.column_stack([_saved(X, rho), X[:, 4:6]]), y)
            if best is None or sse < best[0] - 1e-12:
                best = (sse, float(rho), coef)
        _, rho, coef = best
        lengths = np.array([m.n_tokens for m in measured], dtype=float)
        dense = np.array([m.dense_s for m in measured], dtype=float)
        if len(set(lengths.tolist())) > 1:
            b, a = np.polyfit(lengths, dense, 1)
        else:
            a, b = 0.0, float(dense.mean() / lengths.mean()) if len(lengths) else 0.0
        table = cls(*(float(c) for c in coef), float(a), float(b), n_layers, rho, noise)
        errors = [m.ratio - table.predict(m.plan, m.n_tokens) for m in measured]
        table.fit_error = max((abs(e) for e in errors), default=0.0)
        table.under = max([0.0, *errors])
        return table

    def validate(self, measured: Sequence[Measured]) -> dict:
        """Predicted vs measured ratios of plans timed apart from the fit: per row and the errors."""
        rows = [{"plan": m.plan.label(), "tokens": m.n_tokens, "measured": m.ratio,
                 "predicted": self.predict(m.plan, m.n_tokens)} for m in measured]
        errors = [abs(r["measured"] - r["predicted"]) for r in rows]
        return {"rows": rows, "mean_abs_error": float(np.mean(errors)) if errors else None,
                "max_abs_error": float(np.max(errors)) if errors else None}

    def as_dict(self) -> dict:
        return {"beta_attn": self.beta_attn, "beta_mlp": self.beta_mlp, "rho": self.rho, "gamma": self.gamma,
                "eta": self.eta, "dense_a": self.dense_a, "dense_b": self.dense_b, "n_layers": self.n_layers,
                "noise": self.noise, "fit_error": self.fit_error, "under": self.under}

    @classmethod
    def from_dict(cls, d: dict) -> CostTable:
        return cls(**{k: d[k] for k in ("beta_attn", "beta_mlp", "gamma", "eta", "dense_a", "dense_b", "n_layers")},
                   rho=d.get("rho", 1.0), noise=d.get("noise", 0.0), fit_error=d.get("fit_error", 0.0),
                   under=d.get("under", 0.0))


def _least_squares(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """``[βa, βm, γ, η]`` (non-negative least squares) and the squared error for ``X`` =
    ``[saved_attn, saved_mlp, ranks, masked]`` and ``y`` = 1 − ratio; regressors the plans never vary
    are 0, and attention and MLP that never vary apart share one β (split 1:2, their parameter shares
    in a Llama block)."""
    sign = np.array([1.0, 1.0, -1.0, -1.0])
    tied = len(X) > 0 and np.allclose(X[:, 0], X[:, 1])
    A = np.column_stack([X[:, 0], X[:, 2], X[:, 3]]) if tied else X
    s = np.array([1.0, -1.0, -1.0]) if tied else sign
    cols = [j for j in range(A.shape[1]) if len(A) and np.any(A[:, j] != 0)]
    full = np.zeros(A.shape[1])
    if cols:  # every coefficient ≥ 0: a share of the forward, or an overhead
        from sklearn.linear_model import LinearRegression

        full[cols] = LinearRegression(positive=True, fit_intercept=False).fit(A[:, cols] * s[cols], y).coef_
    coef = np.array([full[0] / 3, 2 * full[0] / 3, full[1], full[2]]) if tied else full
    residual = y - (X * sign) @ coef
    return coef, float(residual @ residual)


def dense_noise(handle: ModelHandle, texts: Sequence[str], repeats: int = 3, clock: str = "wall") -> float:
    """How far apart two identical dense runs measure: the largest |1 − ratio| of the dense model
    timed against itself, paired, over ``texts`` — the resolution of any measured ratio."""
    worst = 0.0
    for text in texts:
        a, b = time_plans(handle, [ExecutionPlan(), ExecutionPlan()], text, repeats, clock)
        worst = max(worst, abs(1 - b / a))
    return worst
