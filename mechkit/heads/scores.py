"""Score every head on repeated random tokens: induction, previous-token, duplicate-token, copying.

Sequences are ``[BOS] + seg + seg`` (random tokens, a segment repeated twice). For a query at
position ``t`` in the second copy whose earlier occurrence is at ``s``:

- induction score: attention from ``t`` to ``s + 1`` (the token that followed it last time);
- duplicate-token score: attention from ``t`` to ``s`` (the earlier occurrence itself);
- previous-token score: attention from every ``t ≥ 1`` to ``t − 1``.

Each is averaged over positions and sequences. Patterns are reduced inside the attention hook
as they are computed, so no pattern is ever stored: scoring costs one forward pass.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mechkit.errors import MechkitError
from mechkit.hooking.core import hooks
from mechkit.model.checks.identity import config_sha256
from mechkit.model.modules.linear import weight_out_in

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

KINDS = ("induction", "previous-token", "duplicate-token")


def repeated_tokens(handle: ModelHandle, n_seqs: int = 50, seg_len: int = 25, seed: int = 0) -> torch.Tensor:
    """``[n_seqs, (BOS) + 2·seg_len]`` random tokens repeated twice, avoiding special tokens."""
    from mechkit.tasks import repeated_random_tokens

    tok = handle.tokenizer
    special = tuple(getattr(tok, "all_special_ids", ()) or ()) if tok is not None else ()
    config = handle.model.config
    vocab = (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size  # multimodal
    from mechkit.model.checks.token_ids import position_rows

    arr = repeated_random_tokens(vocab, n_seqs=n_seqs, seg_len=seg_len, seed=seed,
                                 bos_id=handle.bos_id, exclude_ids=special, n_positions=position_rows(handle.model))
    return torch.as_tensor(arr, dtype=torch.long)


@dataclass
class HeadScores:
    """Scores per kind as ``[n_layers, n_heads]`` arrays, plus the per-position loss."""

    scores: dict[str, np.ndarray]
    loss_per_position: np.ndarray
    seg_len: int
    offset: int

    @property
    def loss_first_copy(self) -> float:
        return copy_loss(self.loss_per_position, self.seg_len)[0]

    @property
    def loss_second_copy(self) -> float:
        return copy_loss(self.loss_per_position, self.seg_len)[1]


def _stripe_indices(total: int, seg_len: int) -> tuple[torch.Tensor, ...]:
    offset = total - 2 * seg_len
    i = torch.arange(seg_len)
    second = offset + seg_len + i
    return second, offset + i + 1, offset + i


def token_loss(handle: ModelHandle, tokens: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """Mean next-token cross-entropy at each position (``[seq_len - 1]``) over ``tokens``."""
    return (_token_loss_sum(handle, tokens, batch_size) / len(tokens)).numpy()


def _token_loss_sum(handle: ModelHandle, tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Summed next-token cross-entropy at each position over ``tokens`` (float64, on the CPU)."""
    loss = torch.zeros(tokens.shape[1] - 1, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(tokens), batch_size):
            batch = tokens[start:start + batch_size].to(handle.device)
            logits = handle(batch)
            # One sequence at a time: a whole batch's log-softmax over the vocabulary would double
            # the peak memory of the forward pass itself.
            for row, ids in zip(logits, batch, strict=True):
                ce = torch.nn.functional.cross_entropy(row[:-1].float(), ids[1:], reduction="none")
                loss += ce.double().cpu()
            del logits, row  # free this batch's logits before the next forward allocates its own
    return loss


def copy_loss(loss_per_position: np.ndarray, seg_len: int) -> tuple[float, float]:
    """Mean loss on the first and on the second (repeated) copy of the segment."""
    offset = len(loss_per_position) + 1 - 2 * seg_len
    return (float(loss_per_position[offset:offset + seg_len - 1].mean()),
            float(loss_per_position[offset + seg_len:].mean()))


def head_scores(handle: ModelHandle, tokens: torch.Tensor, seg_len: int, batch_size: int = 16,
                step: Callable[[str, Callable], object] | None = None) -> HeadScores:
    """Induction, previous-token and duplicate-token scores of every head, in one pass over ``tokens``.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each batch's sums, so an interrupted run
    resumes at the first unfinished batch with identical scores.
    """
    if isinstance(seg_len, bool) or not isinstance(seg_len, numbers.Integral) or seg_len < 2:
        # a token after its earlier copy needs a segment of 2: with 1 the "induction" stripe is the diagonal
        # (self-attention) and the copy loss a mean of nothing (NaN), blamed on the weights after all the work
        raise MechkitError(f"seg_len must be a whole number of at least 2, not {seg_len!r}: induction is read "
                           "from the token after an earlier copy", "pass --seg-len 2 or more (seg_len= in Python)")
    a = handle.anatomy
    step = step or (lambda _key, compute: compute())
    total = tokens.shape[1]
    sums = {k: np.zeros((a.n_layers, a.n_heads)) for k in KINDS}
    loss = np.zeros(total - 1)
    for b, start in enumerate(range(0, len(tokens), batch_size)):
        batch = tokens[start:start + batch_size]
        part = step(f"head-scores|batch{b}", lambda batch=batch: _batch_sums(handle, batch, seg_len))
        for k in KINDS:
            sums[k] += np.asarray(part[k], dtype=np.float64)
        loss += np.asarray(part["loss"], dtype=np.float64)
    n = len(tokens)
    absent = ~a.head_mask()  # a layer that kept fewer heads (pruned): its missing cells hold NaN, never ranked
    return HeadScores(
        scores={k: np.where(absent, np.nan, v / n) for k, v in sums.items()},
        loss_per_position=loss / n,
        seg_len=seg_len,
        offset=total - 2 * seg_len,
    )


def _batch_sums(handle: ModelHandle, batch: torch.Tensor, seg_len: int) -> dict[str, list]:
    """One batch's summed scores per kind (``[n_layers][n_heads]``) and summed loss per position."""
    a = handle.anatomy
    total = batch.shape[1]
    queries, after, dup = _stripe_indices(total, seg_len)
    rows = torch.arange(1, total)
    sums = {k: torch.zeros(a.n_layers, a.n_heads, dtype=torch.float64) for k in KINDS}

    def reducer(pattern: torch.Tensor, point) -> None:
        p = pattern.detach().float()
        n = p.shape[1]  # this layer's heads (fewer than n_heads where heads were pruned)
        sums["induction"][point.layer, :n] += p[:, :, queries, after].sum(dim=(0, 2)).double().cpu() / seg_len
        sums["duplicate-token"][point.layer, :n] += p[:, :, queries, dup].sum(dim=(0, 2)).double().cpu() / seg_len
        sums["previous-token"][point.layer, :n] += p[:, :, rows, rows - 1].sum(dim=(0, 2)).double().cpu() / len(rows)

    with hooks(handle, {"blocks.*.attn.hook_pattern": reducer}):
        loss = _token_loss_sum(handle, batch, len(batch))
    return {**{k: v.tolist() for k, v in sums.items()}, "loss": loss.tolist()}


def ov_copying_scores(handle: ModelHandle) -> np.ndarray:
    """How much each head's OV circuit copies tokens: Σλ / Σ|λ| over the eigenvalues λ of
    W_E·W_V·W_O·W_U (the full vocab×vocab OV circuit, layer norms ignored but the final norm's
    scale folded in). By the cyclic property the non-zero eigenvalues are those of a
    d_head×d_head matrix, so this is cheap. +1 means a pure copying head.
    """
    a = handle.anatomy
    with torch.no_grad():
        # weight_out_in reads weights accelerate offloaded; on a dispatched model they meet on the embedding's device
        embed = weight_out_in(a.embed).float()  # an embedding's weight is [vocab, d_model] as stored
        dev = embed.device
        unembed = weight_out_in(handle.model.get_submodule(a.family.unembed)).float().to(dev)
        scale = a.final_norm_scale()
        if scale is not None:
            unembed = unembed * scale.float().to(dev)
        vocab = min(len(unembed), len(embed))  # tokens only one side has (Mllama's image tokens) copy nothing
        bridge = unembed[:vocab].T @ embed[:vocab]  # [d_model, d_model]: from output direction back to input direction
        out = np.full((a.n_layers, a.n_heads), np.nan)  # NaN: no such head (a layer that kept fewer)
        for layer in range(a.n_layers):
            w_o = weight_out_in(a.attn_out(layer)).float().to(dev)
            for h in range(a.heads_in(layer)):
                module, rows = a.head_rows(layer, "v", a.kv_head(h, layer))
                w_v = weight_out_in(module)[rows].float().to(dev)  # [d_head, d_model]
                d = a.head_size(layer)
                w_oh = w_o[:, h * d:(h + 1) * d]  # [d_model, d_head]
                eig = torch.linalg.eigvals(w_oh.T @ bridge @ w_v.T)
                out[layer, h] = float(eig.real.sum() / eig.abs().sum().clamp_min(1e-12))
    return out


def scores_from_report(report: dict, anatomy, source: str = "the report") -> dict:
    """The head-score grids of a ``detect`` report (already read), checked against ``anatomy``."""
    from mechkit.errors import MechkitError

    scores = report.get("results", {}).get("scores") if isinstance(report, dict) else None
    if not scores or not isinstance(scores, dict):
        raise MechkitError(f"{source} holds no head scores", "pass a report written by `mechkit detect`")
    for kind, grid in scores.items():
        try:
            values = np.asarray(grid, dtype=float)
        except (TypeError, ValueError):
            raise MechkitError(f"{kind} scores in {source} are not a grid of numbers",
                               "pass a report written by `mechkit detect`") from None
        if values.shape != (anatomy.n_layers, anatomy.n_heads):
            raise MechkitError(f"{kind} scores in {source} are for a {'×'.join(map(str, values.shape))} model, "
                               f"not {anatomy.n_layers}×{anatomy.n_heads}", "run `mechkit detect` on this model")
        if not np.isfinite(values[anatomy.head_mask()]).all():  # NaN would rank heads arbitrarily
            raise MechkitError(f"{kind} scores in {source} hold NaN or infinite values",
                               "run `mechkit detect` again on this model")
    return scores


def grid_list(grid, anatomy) -> list[list[float | None]]:
    """A ``[layers, heads]`` grid as lists: ``None`` in the cells with no head (a layer that kept fewer
    heads), which a report stores as ``null`` and a heatmap leaves blank. A NaN where a head exists stays
    NaN, so the report still refuses it as a broken run."""
    mask = anatomy.head_mask()
    return [[float(v) if there else None for v, there in zip(row, present, strict=True)]
            for row, present in zip(np.asarray(grid, dtype=float), mask, strict=True)]


def compute_scores(handle: ModelHandle, n_seqs: int, seg_len: int, seed: int) -> dict[str, list]:
    """Every score kind as a ``[layer][head]`` list on fresh repeated random tokens."""
    tokens = repeated_tokens(handle, n_seqs=n_seqs, seg_len=seg_len, seed=seed)
    return {k: grid_list(v, handle.anatomy) for k, v in head_scores(handle, tokens, seg_len).scores.items()}


def refuse_foreign_scores(report: Any, source: str) -> None:
    """Refuse a report that is not a ``detect`` run's (another plugin named in ``plugin``) or that does not
    record the weights it scored (``model.weights_sha256``). Such scores fit any model with the same layers
    × heads grid, so another model's heads would be ranked by them silently, as a vector or a scheduler that
    records no model is refused for the same reason."""
    from mechkit.errors import MechkitError

    fix = "run `mechkit detect` on this model and pass its run directory, or drop --from to score its heads now"
    if not isinstance(report, dict):
        raise MechkitError(f"{source} is not a detect report", fix)
    plugin = report.get("plugin")
    if plugin is not None and plugin != "detect":
        raise MechkitError(f"{source} is a report of {str(plugin)[:60]!r}, not of detect", fix)
    model = report.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("weights_sha256"), str) or not model["weights_sha256"]:
        raise MechkitError(f"{source} does not record the weights it scored (no model.weights_sha256), so it "
                           "could be any model's", fix)


def load_scores(handle: ModelHandle, report: dict | None, n_seqs: int, seg_len: int, seed: int,
                step=None, source: str = "the report") -> dict:
    """Head scores from a ``detect`` report already read (``--from``), else computed now.

    ``step(key, compute)`` (a plugin's ``ctx.step``) makes the computation resumable.
    """
    if report is not None:
        refuse_foreign_scores(report, source)
        theirs = (report.get("model") or {}).get("weights_sha256") if isinstance(report, dict) else None
        if theirs and theirs != handle.weights_sha256():
            from mechkit.errors import MechkitError

            name = (report.get("model") or {}).get("spec") or (report.get("model") or {}).get("name") or "another model"
            dtype, mine = (report.get("model") or {}).get("dtype"), str(handle.dtype).removeprefix("torch.")
            if isinstance(dtype, str) and dtype != mine:  # the same weights in another dtype hash differently
                raise MechkitError(f"{source} scored the heads with the model in {dtype}, and this run has it in {mine} "
                                   "(head scores are the weights' own, and the weights differ by dtype)",
                                   f"pass --dtype {dtype} (dtype={dtype!r}), or drop --from to score its heads now")
            raise MechkitError(f"{source} scored the heads of {name} (weights {theirs[:12]}…), not of this model "
                               f"(weights {handle.weights_sha256()[:12]}…)",
                               "run `mechkit detect` on this model, or drop --from to score its heads now")
        their_config = (report.get("model") or {}).get("config_sha256") if isinstance(report, dict) else None
        if their_config and their_config != config_sha256(handle.model):
            from mechkit.errors import MechkitError

            raise MechkitError(f"{source} scored these weights under another config.json (another architecture, "
                               "norm epsilon or rope setting: other attention patterns)",
                               "run `mechkit detect` on this model, or drop --from to score its heads now")
        return scores_from_report(report, handle.anatomy, source)

    def compute():
        return compute_scores(handle, n_seqs, seg_len, seed)

    return step("head-scores", compute) if step is not None else compute()
