"""What an adapt study is asked to do: one :class:`AdaptConfig` crosses from the plugin (or a script) to
the study, instead of twenty keywords passed through one for one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mechkit.errors import MechkitError

Step = Callable[[str, Callable[[], Any]], Any]
GUIDES = ("attribution", "ablation", "induction")
KINDS = ("block", "attn", "mlp")  # the units a candidate plan bypasses
CALIB_SEED_OFFSET = 1000  # as mechkit.pruning's calibration: never the held-out prompts' seed


def compute_now(_key: str, compute: Callable[[], Any]) -> Any:
    """A ``step`` that keeps nothing: compute at once (a study outside a plugin run)."""
    return compute()


@dataclass(frozen=True)
class AdaptConfig:
    """The settings of :class:`~mechkit.adapt.AdaptStudy`; the defaults are the study's own.

    ``token_options`` are ``(K, keep)`` pairs: keep that share of the context after block ``K``;
    ``signal_layer`` is the block whose output the scheduler reads (blocks up to it always run);
    ``repeats`` timed runs per plan and input (medians), ``timing_prompts`` calibration prompts per
    task for the cost table; ``adherence`` the share of inputs the budget margin is calibrated to
    keep within budget, from ``margin_prompts`` calibration prompts per task each timed under
    ``margin_plans`` plans; ``margin`` given skips that calibration and is the scheduler's safety
    margin; ``select`` is its ranking metric (:data:`mechkit.adapt.scheduler.SELECT`); ``clock`` the
    timing clock (:func:`mechkit.adapt.cost.resolve_clock`); ``debias`` corrects the predictions of the
    plans the scheduler chooses and recalibrates the margin on them (off: the first margin and the
    table's predictions, as before).

    >>> AdaptConfig(signal_layer=0, token_options=((0, 0.5),)).check(n_layers=2).token_options
    ((0, 0.5),)
    """

    guide: str = "attribution"
    n_calib: int = 8
    n: int = 10
    shots: int | None = 10
    seed: int = 0
    token_options: Sequence[tuple[int, float]] = ((6, 0.5), (6, 0.3), (12, 0.5), (12, 0.3), (18, 0.5), (18, 0.3))
    signal_layer: int = 1
    protect_top_k: int = 10
    repeats: int = 2
    timing_prompts: int = 1
    margin: float | None = None
    min_cv: float = 0.9
    batch_size: int = 8
    clock: str = "auto"
    select: str = "logprob"
    adherence: float = 0.99
    margin_prompts: int = 4
    margin_plans: int = 10
    debias: bool = True

    def check(self, n_layers: int) -> AdaptConfig:
        """Itself, once every setting can work on a model of ``n_layers`` blocks; else one
        :class:`~mechkit.errors.MechkitError` line, before any work."""
        from mechkit.adapt.conformal import check_adherence

        if self.guide not in GUIDES:
            raise MechkitError(f"unknown adapt guide {self.guide!r}", f"use one of: {', '.join(GUIDES)}")
        check_adherence(self.adherence)
        if self.margin is not None and not self.margin >= 0:
            raise MechkitError(f"margin {self.margin} is negative or not a number", "pass a margin of 0 or more")
        if self.margin_prompts < 1 or self.margin_plans < 1:
            raise MechkitError("the budget margin needs at least one prompt and one plan timed",
                               "pass margin_prompts ≥ 1 and margin_plans ≥ 1")
        if not 0 <= self.signal_layer < n_layers - 1:
            raise MechkitError(f"signal layer {self.signal_layer} is outside 0..{n_layers - 2}",
                               "use an early layer such as 1")
        for k, keep in self.token_options:
            if not self.signal_layer <= k < n_layers - 1 or not 0 < keep <= 1:
                raise MechkitError(f"token option keep {keep} after layer {k} is out of range",
                                   f"select after a layer in {self.signal_layer}..{n_layers - 2} (at or above the "
                                   "signal layer), keeping a share in (0, 1]")
        return self
