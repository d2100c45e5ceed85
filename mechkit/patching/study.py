"""A patching study over several prompt pairs: scans, DLA and the logit lens, averaged.

Averaging follows the usual convention (TransformerLens' and Wang et al.'s): the *metric* is averaged over
the pairs — patched, clean and corrupted alike — and the normalized recovery is taken of the averages, so a
pair with a large logit difference weighs more than one the model barely gets right. A residual-stream
map has one column per position, so it averages only the pairs with the first pair's length in tokens
(its labels are the first pair's tokens); the head map, DLA and the lens have no position axis and average
every pair.

``method="attribution"`` estimates the scans by attribution patching (one forward and one backward per
pair and point); ``"both"`` runs exact and attribution and reports their rank agreement per map.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.patching.answers import logit_diff
from mechkit.patching.attribution import agreement, attribute_patching
from mechkit.patching.lens import direct_logit_attribution, dla_names, lens_names, logit_lens
from mechkit.patching.patch import source_cache
from mechkit.patching.scan import PatchScan, denoise

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

METHODS = ("exact", "attribution", "both")
Pair = tuple  # (clean ids, corrupted ids, correct id, wrong id), as mechkit.patching.pairs.tokens gives


@dataclass
class Study:
    """``resid``/``heads``: the residual-stream (layer × position) and head (layer × head) denoising maps,
    by the method asked (exact where ``both``); ``attribution``: the attribution maps where ``both``;
    ``dla_*``, ``lens``: the clean runs' DLA and logit lens, averaged; ``agreement``: per map, exact vs
    attribution."""

    resid: PatchScan
    heads: PatchScan
    dla_heads: torch.Tensor
    dla_attn: torch.Tensor
    dla_mlp: torch.Tensor
    dla_embed: float
    dla_unexplained: float
    lens: torch.Tensor
    n_pairs: int
    n_resid_pairs: int
    attribution: dict[str, PatchScan] = field(default_factory=dict)
    agreement: dict[str, dict] = field(default_factory=dict)


def mean_scan(scans: Sequence[PatchScan]) -> PatchScan:
    """The scans' metric values, clean and corrupted averaged (same point, shape and direction)."""
    first = scans[0]
    if any(s.values.shape != first.values.shape for s in scans):
        raise MechkitError("scans of different shapes cannot be averaged", "average pairs of one length in tokens")
    return PatchScan(first.point, first.over, torch.stack([s.values for s in scans]).mean(0),
                     sum(s.clean for s in scans) / len(scans), sum(s.corrupted for s in scans) / len(scans),
                     first.direction, first.labels)


def run_study(handle: ModelHandle, pairs: Sequence[Pair], method: str = "exact", batch_size: int = 32,
              step: Callable[[str, Callable[[], dict]], dict] | None = None,
              on_pair: Callable[[], None] | None = None) -> Study:
    """Denoise the residual stream (per layer × position) and each head's output (per layer × head) on every
    pair, with the clean runs' DLA and logit lens, averaged as the module docstring says.

    ``step(key, compute)`` (a plugin's ``ctx.step``) keeps each pair's result, so an interrupted run resumes
    at the first unfinished pair; ``on_pair`` is called after each (a progress bar).

    >>> import mechkit as mk
    >>> from mechkit.patching.pairs import PromptPair, tokens
    >>> m = mk.load_model("tiny:llama")
    >>> study = run_study(m, [tokens(m, PromptPair("abcab", "abdab", "c", "d"))])
    >>> round(float(study.resid.recovery[0, 2]), 4)   # the clean token restored at layer 0: all of it
    1.0
    """
    if method not in METHODS:
        raise MechkitError(f"method {method!r} is not one of {', '.join(METHODS)}", "use exact, attribution or both")
    if not pairs:
        raise MechkitError("no prompt pair to patch", "give pairs of equal length whose answers differ")
    step = step or (lambda _key, compute: compute())
    parts = []
    for i, pair in enumerate(pairs):
        parts.append(step(f"pair{i}|{method}", lambda pair=pair: pair_result(handle, pair, method, batch_size)))
        if on_pair:
            on_pair()
    return combine(parts, method, pairs[0][0].shape[-1])


def pair_result(handle: ModelHandle, pair: Pair, method: str, batch_size: int = 32) -> dict:
    """One pair's scans (per method), DLA and lens, as JSON-able lists (a resumable step's value)."""
    clean, corrupted, c, w = pair
    metric = lambda logits: logit_diff(logits, c, w)  # noqa: E731
    out: dict = {"length": clean.shape[-1]}
    for kind in (("exact", "attribution") if method == "both" else (method,)):
        out[kind] = {name: _as_dict(_scan(handle, kind, clean, corrupted, point, metric, over, batch_size))
                     for name, point, over in (("resid", "hook_resid_pre", "position"), ("heads", "attn.hook_z", "head"))}
    cache = source_cache(handle, clean, dla_names(handle) + lens_names(handle))
    d = direct_logit_attribution(handle, cache, c, w)
    out["dla"] = {"heads": d.heads[0].tolist(), "attn": d.attn[0].tolist(), "mlp": d.mlp[0].tolist(),
                  "embed": float(d.embed[0]), "unexplained": float(d.unexplained[0])}
    out["lens"] = logit_diff(logit_lens(handle, cache)[:, 0], c, w).tolist()
    return out


def combine(parts: Sequence[dict], method: str, length: int) -> Study:
    """The pairs' results averaged (residual maps: only the pairs ``length`` tokens long)."""
    main = "attribution" if method == "attribution" else "exact"

    def scans(kind: str, name: str) -> list[PatchScan]:
        return [_from_dict(p[kind][name]) for p in parts if name == "heads" or p["length"] == length]

    def mean(key: str) -> torch.Tensor:
        return torch.tensor([p["dla"][key] for p in parts]).mean(0)

    study = Study(resid=mean_scan(scans(main, "resid")), heads=mean_scan(scans(main, "heads")),
                  dla_heads=mean("heads"), dla_attn=mean("attn"), dla_mlp=mean("mlp"), dla_embed=float(mean("embed")),
                  dla_unexplained=float(mean("unexplained")), lens=torch.tensor([p["lens"] for p in parts]).mean(0),
                  n_pairs=len(parts), n_resid_pairs=len(scans(main, "resid")))
    if method == "both":
        for name in ("resid", "heads"):
            study.attribution[name] = mean_scan(scans("attribution", name))
            study.agreement[name] = agreement(getattr(study, name).recovery, study.attribution[name].recovery)
    return study


def _as_dict(scan: PatchScan) -> dict:
    return {"point": scan.point, "over": scan.over, "values": scan.values.tolist(), "clean": scan.clean,
            "corrupted": scan.corrupted, "direction": scan.direction, "labels": scan.labels}


def _from_dict(d: dict) -> PatchScan:
    return PatchScan(d["point"], d["over"], torch.tensor(d["values"]), d["clean"], d["corrupted"], d["direction"],
                     d["labels"])


def _scan(handle: ModelHandle, kind: str, clean, corrupted, point: str, metric, over: str, batch_size: int) -> PatchScan:
    if kind == "exact":
        return denoise(handle, clean, corrupted, point, metric, over=over, batch_size=batch_size)
    return attribute_patching(handle, clean, corrupted, point, metric, over=over)
