"""The pruning workflow in four calls: calibrate, score, plan, prune.

>>> import mechkit as mk
>>> from mechkit import pruning
>>> m = mk.load_model("tiny:llama")
>>> calib = pruning.calibrate(m, ["capitalize"], n=4, shots=2)
>>> scores = pruning.guide_scores(m, "wanda", calib)
>>> plan = pruning.make_plan(scores, m.anatomy, {"neurons": 0.25})
>>> small = pruning.prune_copy(m, plan, calib.stats)
>>> small.model.model.layers[0].mlp.down_proj.in_features
96
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mechkit.pruning.calibration import Calibration
from mechkit.pruning.guides import (
    Scores,
    check_guide,
    combined,
    gradient_scores,
    mix_scores,
    protect_heads,
    static_scores,
    text_gradient_scores,
)

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

def ablation_scores(handle: ModelHandle, calib: Calibration, attribution: Scores) -> Scores:
    """Exact ablation effects where they are affordable: every head zero-ablated for real on the
    calibration prompts (the heads issue's sweep, |Δ answer log-prob|) and every block removed for
    real; MLP channels (tens of thousands) keep their attribution estimate."""
    import numpy as np

    from mechkit.heads.effects import exact_effects
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.pruning.sensitivity import plan_drops

    heads = np.abs(exact_effects(handle, calib.prompts).logprob)
    plans = [UnitsToRemove(layers=[layer]) for layer in range(handle.anatomy.n_layers)]
    layers = np.abs(plan_drops(handle, plans, calib))
    return Scores(attribution.mlp, heads, layers, "ablation")


def task_gradient_scores(handle: ModelHandle, calib: Calibration, baseline: str = "mean",
                         text_weight: float = 0.0) -> Scores:
    """:func:`~mechkit.pruning.guides.gradient_scores` on the calibration prompts, mixed at ``text_weight``
    with the same scores on the calibration's generic text (language-modelling loss), so the guide
    also keeps what general text needs."""
    scores = gradient_scores(handle, calib.prompts, calib.stats, baseline=baseline)
    if calib.generic and text_weight > 0:
        text = text_gradient_scores(handle, calib.generic, calib.stats, baseline=baseline)
        scores = mix_scores(scores, text, text_weight)
    return scores


def circuit_scores(handle: ModelHandle, n_seqs: int = 20, seg_len: int = 25, seed: int = 0) -> dict:
    """Induction and previous-token scores of every head on repeated random tokens."""
    from mechkit.heads.scores import head_scores, repeated_tokens

    tokens = repeated_tokens(handle, n_seqs=n_seqs, seg_len=seg_len, seed=seed)
    return head_scores(handle, tokens, seg_len).scores


def guide_scores(handle: ModelHandle, guide: str, calib: Calibration, seed: int = 0, protect_top_k: int = 10,
                 circuit: dict | None = None, attribution: Scores | None = None, text_weight: float = 0.0) -> Scores:
    """Scores of ``guide`` (see :mod:`mechkit.pruning.guides`); pass ``attribution`` to reuse one.
    ``text_weight`` mixes the gradient guides' scores with their generic-text ones
    (:func:`task_gradient_scores`)."""
    check_guide(guide)
    if guide in ("random", "magnitude", "wanda", "flap"):
        return static_scores(guide, handle, calib.stats, seed)
    if guide == "gradient":
        return task_gradient_scores(handle, calib, baseline="zero", text_weight=text_weight)
    attribution = attribution or task_gradient_scores(handle, calib, baseline="mean", text_weight=text_weight)
    if guide == "attribution":
        return attribution
    if guide == "ablation":
        return ablation_scores(handle, calib, attribution)
    if guide == "combined":
        attribution = combined(static_scores("wanda", handle, calib.stats), attribution)
    circuit = circuit or circuit_scores(handle, seed=seed)
    out = protect_heads(attribution, circuit, protect_top_k)
    out.guide = guide
    return out
