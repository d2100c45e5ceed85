"""Choosing λ from a sweep of Ψ = Ψ0 + ΔΨ_1 + λ·ΔΨ_2: the best λ for multi-task learning and for unlearning.

The λ grid itself (``-1:1.5:0.1`` or ``-1,0,1``) is parsed by :data:`mechkit.options.parse_lambdas`.

>>> rows = [{"lambda": -1.0, "a": 0.9, "b": 0.1}, {"lambda": 1.0, "a": 0.7, "b": 0.8}]
>>> {k: r["lambda"] for k, r in best_lambdas(rows, "a", "b").items()}
{'multi_task': 1.0, 'unlearning': -1.0}
"""

from __future__ import annotations


def best_lambdas(rows: list[dict], t1: str, t2: str, own: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Best λ for multi-task learning and for unlearning; ties go to the smaller |λ|.

    ``rows`` are ``{"lambda": λ, t1: accuracy, t2: accuracy}``. Multi-task (λ > 0): the largest
    worse-of-two retention, min(acc1 / own1, acc2 / own2), where ``own`` holds each task's accuracy
    under its own vector alone (so "keeps both" is what counts, not one task's gain bought with the
    other), then the larger mean. Unlearning (λ < 0): the largest acc1 − acc2. ``None`` where no
    row has a λ of that sign.
    """
    def pick(cands, score):
        return max(cands, key=lambda r: (*(round(x, 9) for x in score(r)), -abs(r["lambda"])), default=None)

    o1, o2 = (max(o, 1e-9) for o in own)
    multi = pick([r for r in rows if r["lambda"] > 0],
                 lambda r: (min(r[t1] / o1, r[t2] / o2), (r[t1] + r[t2]) / 2))
    unlearn = pick([r for r in rows if r["lambda"] < 0], lambda r: (r[t1] - r[t2],))
    return {"multi_task": multi, "unlearning": unlearn}


__all__ = ["best_lambdas"]
