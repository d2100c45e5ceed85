"""What an adapt study is asked to do: one :class:`AdaptConfig` crosses from the plugin (or a script) to
the study, instead of twenty keywords passed through one for one.
"""

from __future__ import annotations

import dataclasses
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


def auto_token_layers(n_layers: int, signal_layer: int) -> tuple[int, ...]:
    """The blocks token selection follows by default: those at 20, 40 and 60% of the depth (6, 12 and 18 of
    30), each moved into the range it allows (the signal block to the last block but one), repeats dropped.

    >>> auto_token_layers(30, 1), auto_token_layers(2, 0), auto_token_layers(4, 1)
    ((6, 12, 18), (0,), (1, 2))
    """
    top = max(signal_layer, n_layers - 2)
    return tuple(sorted({min(top, max(signal_layer, round(share * n_layers))) for share in (0.2, 0.4, 0.6)}))


def margin_prompts_needed(adherence: float, n_tasks: int, n_plans: int = 1) -> int:
    """Margin prompts per task that give a finite conformal margin for ``adherence`` with ``n_plans`` distinct
    plans timed on each (one: enough on any model).

    >>> margin_prompts_needed(0.999, 2), margin_prompts_needed(0.999, 2, n_plans=2), margin_prompts_needed(0.99, 3, 3)
    (500, 250, 11)
    """
    import math

    from mechkit.adapt.conformal import residuals_needed

    return math.ceil(residuals_needed(adherence) / (max(1, n_plans) * max(1, n_tasks)))


MARGIN_PROMPTS = 4  # margin prompts per task by default (3 tasks × 4 × 10 plans: 120 residuals ≥ 99)


@dataclass(frozen=True)
class AdaptConfig:
    """The settings of :class:`~mechkit.adapt.AdaptStudy`; the defaults are the study's own.

    ``token_options`` are ``(K, keep)`` pairs: keep that share of the context after block ``K``;
    ``signal_layer`` is the block whose output the scheduler reads (blocks up to it always run);
    ``repeats`` timed runs per plan and input (medians), ``timing_prompts`` calibration prompts per
    task for the cost table; ``adherence`` the share of inputs the budget margin is calibrated to
    keep within budget, from ``margin_prompts`` calibration prompts per task each timed under
    ``margin_plans`` plans (None: :data:`MARGIN_PROMPTS` per task, or as many more as ``adherence`` needs
    where the model offers fewer distinct plans than ``margin_plans``, as a tiny model does); ``margin`` given skips that calibration and is the scheduler's safety
    margin; ``select`` is its ranking metric (:data:`mechkit.adapt.scheduler.SELECT`); ``clock`` the
    timing clock (:func:`mechkit.adapt.cost.resolve_clock`); ``debias`` corrects the predictions of the
    plans the scheduler chooses and recalibrates the margin on them (off: the first margin and the
    table's predictions, as before).

    ``signal_layer=None`` and ``token_options=None`` (the defaults) are picked for the model's depth by
    :meth:`check`: block 1 (0 on a 2-block model), and keeps of 0.5 and 0.3 after the blocks at 20, 40 and
    60% of the depth (:func:`auto_token_layers`: blocks 6, 12 and 18 of 30).

    >>> AdaptConfig(signal_layer=0, token_options=((0, 0.5),)).check(n_layers=2).token_options
    ((0, 0.5),)
    >>> c = AdaptConfig().check(n_layers=2)
    >>> c.signal_layer, c.token_options
    (0, ((0, 0.5), (0, 0.3)))
    """

    guide: str = "attribution"
    n_calib: int = 8
    n: int = 10
    shots: int | None = 10
    seed: int = 0
    token_options: Sequence[tuple[int, float]] | None = None
    signal_layer: int | None = None
    protect_top_k: int = 10
    repeats: int = 2
    timing_prompts: int = 1
    margin: float | None = None
    min_cv: float = 0.9
    batch_size: int = 8
    clock: str = "auto"
    select: str = "logprob"
    adherence: float = 0.99
    margin_prompts: int | None = None  # MARGIN_PROMPTS, or more where the model offers few plans
    margin_plans: int = 10
    debias: bool = True

    def check_margin_sample(self, n_tasks: int) -> None:
        """Refuse, from the settings alone (so ``mechkit adapt`` says it before the model loads), margin prompts
        given too few for ``adherence`` whatever the model: ``n_tasks × margin_prompts × margin_plans`` residuals
        at most, as a model offers at most ``margin_plans`` distinct plans. The count it names assumes the fewest
        plans a model can offer, one, so it runs on any model: the count that assumed all ``margin_plans`` was
        refused again after the load on a model offering 2 (``margin_prompts=None`` grows to what the model's
        plans need instead, :meth:`~mechkit.adapt.margin.MarginStage.check_margin_sample`).

        >>> AdaptConfig(margin_prompts=2, adherence=0.9).check_margin_sample(1)  # 1 x 2 x 10 = 20 >= 9
        >>> AdaptConfig(margin_prompts=2).check_margin_sample(2)
        Traceback (most recent call last):
        mechkit.errors.MechkitError: 2 tasks × 2 margin prompts × at most 10 plans give 40 residuals; a conformal margin for 0.99 adherence needs at least 99 — pass --margin-prompts 50 (margin_prompts=50: enough however few distinct plans the model offers) or more, or leave --margin-prompts out (the study times as many as the model's plans need), lower --adherence, or give --margin
        """
        from mechkit.adapt.conformal import require_residuals

        if self.margin is not None or self.margin_prompts is None:
            return
        n = margin_prompts_needed(self.adherence, n_tasks)
        require_residuals(n_tasks * self.margin_prompts * self.margin_plans, self.adherence,
                          f"{n_tasks} task{'s' if n_tasks != 1 else ''} × {self.margin_prompts} margin prompts × at "
                          f"most {self.margin_plans} plans",
                          f"pass --margin-prompts {n} (margin_prompts={n}: enough however few distinct plans the "
                          "model offers) or more, or leave --margin-prompts out (the study times as many as the "
                          "model's plans need), lower --adherence, or give --margin")

    def check(self, n_layers: int) -> AdaptConfig:
        """Itself, once every setting can work on a model of ``n_layers`` blocks; else one
        :class:`~mechkit.errors.MechkitError` line, before any work."""
        from mechkit.adapt.conformal import check_adherence

        if self.signal_layer is None:  # block 1, or the last block that leaves one after it
            return dataclasses.replace(self, signal_layer=max(0, min(1, n_layers - 2))).check(n_layers)
        if self.token_options is None:
            layers = auto_token_layers(n_layers, self.signal_layer)
            return dataclasses.replace(self, token_options=tuple((k, keep) for k in layers for keep in (0.5, 0.3)))\
                .check(n_layers)
        if self.guide not in GUIDES:
            raise MechkitError(f"unknown adapt guide {self.guide!r}", f"use one of: {', '.join(GUIDES)}")
        check_adherence(self.adherence)
        if self.margin is not None and not self.margin >= 0:
            raise MechkitError(f"margin {self.margin} is negative or not a number", "pass a margin of 0 or more")
        if (self.margin_prompts is not None and self.margin_prompts < 1) or self.margin_plans < 1:
            raise MechkitError("the budget margin needs at least one prompt and one plan timed",
                               "pass margin_prompts ≥ 1 and margin_plans ≥ 1")
        if n_layers < 2:
            raise MechkitError(f"adaptive inference needs at least 2 blocks (a signal block and one after it); "
                               f"this model has {n_layers}", "use a deeper model")
        if not 0 <= self.signal_layer < n_layers - 1:
            raise MechkitError(f"signal layer {self.signal_layer} is outside 0..{n_layers - 2} (this model has "
                               f"{n_layers} blocks)", f"pass --signal-layer (signal_layer=) from 0 to {n_layers - 2}, "
                               "or leave it out")
        for k, keep in self.token_options:
            if not self.signal_layer <= k < n_layers - 1:
                raise MechkitError(f"token selection after block {k} is outside {self.signal_layer}..{n_layers - 2} "
                                   "(from the signal block to the last block but one)",
                                   f"pass --token-layers with blocks in {self.signal_layer}..{n_layers - 2}, auto, "
                                   "or '' for none")
            if not 0 < keep <= 1:
                raise MechkitError(f"token selection keeps a share of {keep}, outside (0, 1]",
                                   "pass --token-keep shares above 0 and at most 1, e.g. 0.5,0.3")
        return self
