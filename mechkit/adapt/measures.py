"""What the adapt study measures with: a plan's score and features, adherence shares, plans from units.

Shared by the stages (:mod:`mechkit.adapt.study`), each a module of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.adapt.conformal import share_lower_bound
from mechkit.adapt.cost import Measured
from mechkit.adapt.plan import ExecutionPlan, run_plan
from mechkit.adapt.tokens import TokenSelection
from mechkit.eval.scoring import aggregate, encode_rows, score_rows

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

from mechkit.adapt.config import KINDS


class _Stop(Exception):
    """Raised after the signal block: the rest of the forward is not needed."""


def score_plan(handle: ModelHandle, plan: ExecutionPlan, prompts: Sequence, batch_size: int = 8) -> dict:
    """Exact-match accuracy (equal to greedy decoding's under the plan) and answer log-prob of
    ``prompts`` under ``plan``, with each prompt's correctness and the share of tokens kept."""
    rows = encode_rows(handle.tokenizer, prompts, None)
    with run_plan(handle, plan) as runner:
        def prepare(indices: list[int]) -> None:  # the query is the prompt's last token, not the answer's
            runner.set_queries([rows[i].answer_start - 1 for i in indices])

        scored, decoded = score_rows(handle, rows, batch_size, prepare=prepare)
    score = aggregate(len(prompts), rows, scored, decoded)
    kept = [s for entry in runner.log for s in entry["kept"]]
    return {"accuracy": score.accuracy, "logprob": score.logprob, "correct": list(score.correct),
            "kept": float(np.mean(kept)) if kept else 1.0}


def signal_features(handle: ModelHandle, texts: Sequence[str], layer: int, batch_size: int = 8) -> np.ndarray:
    """``[n, d_model]``: each prompt's residual stream after block ``layer``, averaged over its tokens —
    what the adaptive scheduler reads (the forward stops there)."""
    out: list[torch.Tensor] = []

    def grab(features: torch.Tensor, _lengths: torch.Tensor) -> ExecutionPlan:
        out.append(features.detach().float().cpu())
        raise _Stop

    with run_plan(handle, choose=grab, choose_after=layer), torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = handle.tokenizer(list(texts[i:i + batch_size]), return_tensors="pt", padding=True)
            with contextlib.suppress(_Stop):
                handle.model(input_ids=enc["input_ids"].to(handle.device),
                             attention_mask=enc["attention_mask"].to(handle.device), use_cache=False)
    return torch.cat(out).numpy()


def adherence(budget: float, ratios: Sequence[float], decisions: Sequence, noise: float, margin: float) -> dict:
    """The shares of inputs within ``budget`` from their measured latency ratios and the scheduler's
    decisions: ``adherence`` strictly by measurement; ``adherence_dense_met`` counting an input that ran
    the dense plan under a budget ≥ 1 as within it (the plan *is* the reference; its measured ratio is
    the noise of timing one model twice), the others strictly; ``adherence_with_noise`` within
    ``budget + noise``; ``coverage`` the share measured within ``predicted + margin`` (what the
    conformal margin promises); ``dense_inputs`` how many ran dense under a budget ≥ 1;
    ``infeasible_inputs`` how many had no plan that fits (the cheapest ran); ``within`` of ``inputs``
    the count behind ``adherence_dense_met``, and ``adherence_lower95`` the share that count supports
    (:func:`~mechkit.adapt.conformal.share_lower_bound`).

    >>> from mechkit.adapt.scheduler import Decision
    >>> from mechkit.adapt.plan import ExecutionPlan
    >>> dense = Decision(ExecutionPlan(), None, "static scheduler", 1.0, True)
    >>> a = adherence(1.0, [1.04, 0.98], [dense, dense], noise=0.05, margin=0.0)
    >>> a["adherence"], a["adherence_dense_met"], a["adherence_with_noise"], a["dense_inputs"]
    (0.5, 1.0, 1.0, 2)
    """
    dense = [d.plan.is_dense and budget >= 1.0 for d in decisions]
    met = int(sum(r <= budget or x for r, x in zip(ratios, dense, strict=True)))
    return {"adherence": float(np.mean([r <= budget for r in ratios])),
            "adherence_dense_met": met / len(ratios), "within": met, "inputs": len(ratios),
            "adherence_lower95": share_lower_bound(met, len(ratios)),
            "adherence_with_noise": float(np.mean([r <= budget + noise for r in ratios])),
            "coverage": float(np.mean([r <= d.predicted + margin for r, d in zip(ratios, decisions, strict=True)])),
            "dense_inputs": int(sum(dense)), "infeasible_inputs": int(sum(not d.fits for d in decisions))}


def pooled_adherence(rows: Sequence[dict]) -> dict:
    """Per scheduler (adaptive, static): inputs within their budget (dense = met) over every budget's
    inputs, pooled, and the share that supports (:func:`~mechkit.adapt.conformal.share_lower_bound`):
    one budget's few inputs cannot show 99 %, all budgets' together come closer."""
    out = {}
    for kind in ("adaptive", "static"):
        within = sum(r[kind]["within"] for r in rows)
        n = sum(r[kind]["inputs"] for r in rows)
        out[kind] = {"within": within, "inputs": n, "share": within / n if n else None,
                     "lower95": share_lower_bound(within, n)}
    return out


def unit_plan(units: Sequence[tuple[str, int]], tokens: TokenSelection | None, source: str) -> ExecutionPlan:
    """The plan bypassing ``units`` (``(kind, layer)``; attention and MLP of one layer make the block)."""
    by = {kind: {i for k, i in units if k == kind} for kind in KINDS}
    blocks = by["block"] | (by["attn"] & by["mlp"])
    plan = ExecutionPlan(layers=tuple(blocks), attn_layers=tuple(by["attn"] - blocks),
                         mlp_layers=tuple(by["mlp"] - blocks), tokens=tokens)
    c = plan.counts()
    parts = [f"{c[k]} {w}" for k, w in (("layers", "blocks"), ("attn_layers", "attn"), ("mlp_layers", "MLP")) if c[k]]
    if tokens is not None:
        parts.append(f"tokens {tokens.keep:g}@L{tokens.layer}")
    plan.name = f"{source}: " + (" + ".join(parts) or "dense")
    return plan


def measured_row(row: dict) -> Measured:
    """A stored timing row as the cost table's :class:`~mechkit.adapt.cost.Measured`."""
    return Measured(ExecutionPlan.from_dict(row["plan"]), int(row["n_tokens"]), float(row["seconds"]),
                    float(row["dense_s"]))


def scores_only(s: dict) -> dict:
    """Accuracy and log-prob of a plan's stored score (without per-prompt correctness)."""
    return {"accuracy": s["accuracy"], "logprob": s["logprob"]}
