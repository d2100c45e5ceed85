"""What a pruned model costs and how well it still models text: parameters, FLOPs per token,
measured forward latency (median, interleaved with the dense model), and held-out perplexity."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from mechkit.model.modules.linear import is_transposed

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def n_params(handle: ModelHandle) -> int:
    """Distinct parameters (a tied embedding counts once, also where accelerate's offload hooks gave
    each tied module its own ``meta`` parameter)."""
    from mechkit.model.placement.ties import distinct_parameters

    return sum(p.numel() for p in distinct_parameters(handle.model).values())


def fewest_saved_bytes(handle: ModelHandle, targets) -> int:
    """A lower bound on the bytes a model pruned at ``targets`` saves (for ``ulimit -f`` before the work):
    every weight but those the targets may remove (whole blocks under layers, MLPs under neurons,
    attention under heads), tied tensors once. The dense size refused a pruned model that would have fit."""
    from mechkit.model.placement.ties import weight_bytes

    a = handle.anatomy
    removable: set[int] = set()
    for layer in range(a.n_layers):
        parts = [a.block(layer)] if "layers" in targets else \
            [*([a.mlp(layer)] if "neurons" in targets else []), *([a.attn(layer)] if "heads" in targets else [])]
        removable |= {id(t) for part in parts for t in part.state_dict(keep_vars=True).values()}
    return weight_bytes(t for t in handle.model.state_dict(keep_vars=True).values() if id(t) not in removable)


def flops_per_token(handle: ModelHandle, context: int = 128) -> float:
    """Forward FLOPs per token at ``context`` tokens: 2·in·out per projection (unembedding included)
    plus the attention products, 2·2·heads·d_head·(context/2) per layer on a causal average."""
    total = 0.0
    for module in handle.model.modules():
        w = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) or is_transposed(module):
            total += 2.0 * w.shape[0] * w.shape[1]
    a = handle.anatomy
    for layer in range(len(a.layers)):
        out = a.attn_out(layer)
        width = out.weight.shape[0] if is_transposed(out) else out.weight.shape[1]
        total += 2 * 2 * width * context / 2
    return total


def timing_reference(handle: ModelHandle) -> tuple[ModelHandle, str]:
    """The dense model that pruned copies of ``handle`` are timed against, and a note of how it runs.

    The pruned copy of a dispatched model is an ordinary model on its main device
    (:func:`~mechkit.pruning.slicing.prune_copy`); timed against the dispatched dense model, whose
    offloaded weights stream in at every forward, it would be credited with the offload's cost as
    well as the pruning's. So a dispatched dense model is timed as a plain copy on the same device
    where that fits, else as dispatched, and the note says which.

    >>> import mechkit as mk
    >>> timing_reference(mk.load_model("tiny:llama"))[1]
    'as loaded'
    """
    from mechkit.errors import MechkitError
    from mechkit.model.anatomy import discover_anatomy
    from mechkit.model.handle import ModelHandle
    from mechkit.model.placement.copies import plain_copy
    from mechkit.model.placement.stored import is_dispatched

    if not is_dispatched(handle.model):
        return handle, "as loaded"
    try:
        model = plain_copy(handle.model, purpose="timing the dense model", fix="")
    except MechkitError:
        return handle, "dispatched: its offloaded weights stream in at every forward, so speedups include the offload"
    return (ModelHandle(model=model, tokenizer=handle.tokenizer, anatomy=discover_anatomy(model), spec=handle.spec,
                        name=handle.name),
            "a plain copy on the main device, where the pruned copies run")


def _time(handle: ModelHandle, ids: torch.Tensor, mask: torch.Tensor, last: bool) -> float:
    from mechkit.eval.scoring import supports_logits_to_keep

    extra = {"logits_to_keep": 1} if last and supports_logits_to_keep(handle.model) else {}
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        handle.model(input_ids=ids, attention_mask=mask, use_cache=False, **extra)
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def latency(handles: Sequence[ModelHandle], texts: Sequence[str], repeats: int = 7, last: bool = False) -> list[float]:
    """Median forward seconds of each handle on the same padded batch, runs interleaved round-robin
    (after one warm-up each) so machine noise hits every model alike.

    ``last=True`` unembeds only the last position (``logits_to_keep=1``), the forward that answering a
    prompt or a generation's prefill needs (HF ``generate`` does the same); ``False`` computes logits
    at every position, as a plain ``model(ids)`` call does.
    """
    tok = handles[0].tokenizer
    enc = tok(list(texts), return_tensors="pt", padding=True)
    times: list[list[float]] = [[] for _ in handles]
    device = handles[0].device
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    for h in handles:
        _time(h, ids, mask, last)
    for _ in range(repeats):
        for i, h in enumerate(handles):
            times[i].append(_time(h, ids, mask, last))
    return [statistics.median(t) for t in times]


def _topic_keys(n_chars: int) -> list[str]:
    """The (sorted) ``pydoc_data.topics`` entries that held-out text of ``n_chars`` characters uses."""
    from pydoc_data.topics import topics

    keys, size = [], 0
    for key in sorted(topics):
        keys.append(key)
        size += len(topics[key])
        if size >= n_chars:
            break
    return keys


def heldout_text(n_chars: int = 6000) -> tuple[str, str]:
    """English prose available offline on every machine: the Python language reference topics
    shipped with CPython (``pydoc_data.topics``), from the first entry on. Returns (text, description)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in _topic_keys(n_chars))
    return text[:n_chars], f"pydoc_data.topics (CPython reference), first {n_chars} characters"


def calibration_text(n_chunks: int, chunk_chars: int = 600, heldout_chars: int = 6000) -> list[str]:
    """``n_chunks`` pieces of generic text for calibration, about ``chunk_chars`` characters each, cut
    at line ends: ``pydoc_data.topics`` entries from the *last* one backwards, never one that
    :func:`heldout_text` (of ``heldout_chars``) reads, so perplexity stays measured on unseen text.

    >>> chunks = calibration_text(3)
    >>> len(chunks), not any(c in heldout_text()[0] for c in chunks)
    (3, True)
    """
    from pydoc_data.topics import topics

    held = set(_topic_keys(heldout_chars))
    chunks: list[str] = []
    for key in sorted(topics, reverse=True):
        if key in held:
            break
        piece = ""
        for line in topics[key].splitlines(keepends=True):
            piece += line
            if len(piece) >= chunk_chars:
                if piece.strip():
                    chunks.append(piece.strip())
                piece = ""
                if len(chunks) == n_chunks:
                    return chunks
        if len(piece.strip()) >= chunk_chars // 4:
            chunks.append(piece.strip())
            if len(chunks) == n_chunks:
                return chunks
    return chunks


def perplexity(handle: ModelHandle, text: str, window: int = 256) -> float | None:
    """exp(mean next-token NLL) over non-overlapping windows of ``text``; ``None`` where it overflows or
    the model's logits are not finite (a report holds no infinity, and "too large to say" is not a number). The
    window never passes a learned position table (a 40-position model could never be pruned: its first window was
    refused, naming no option)."""
    from mechkit.model.checks.token_ids import position_rows

    model = getattr(handle, "model", None)
    rows = position_rows(model) if model is not None else None
    window = min(window, rows) if rows is not None else window
    ids = handle.tokenizer(text, return_tensors="pt")["input_ids"][0]
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start:start + window + 1].to(handle.device)
            if len(chunk) < 2:
                break
            logits = handle(chunk[None, :-1])[0].float()
            nll += float(torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum"))
            count += len(chunk) - 1
    value = math.exp(nll / max(count, 1)) if math.isfinite(nll) and nll / max(count, 1) < 700 else math.inf
    return value if math.isfinite(value) else None
