"""The validation conditions of seed 000 Table 3.1, each a set of fine-tuning tasks with the same budget.

- *Selected*: Algorithm 1's set L (size k);
- *All*: every candidate;
- *Random*: k candidates drawn at random (``draws`` draws; "ignore both consistency and diversity");
- *No Con.*: a random order of the candidates with the same stopping rule ("ignore consistency");
- *No Div.*: the similarity order cut at a fixed larger size (``no_div_size``, default 2k;
  "ignore diversity": the stopping rule is not used);
- *None*: no fine-tuning.

The seeds hold sample complexity fixed (§8.5.4, "Altering Finetuning Task Data with Invariant Sample
Complexity"), so every condition trains on the same number of examples, ``budget``, split as evenly as
it divides among its tasks (:func:`split_budget`), for the same steps and batch size.

>>> split_budget(10, ["a", "b", "c"])
{'a': 4, 'b': 3, 'c': 3}
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mechkit.taskselect.select import Selection

METHODS = ("None", "Random", "No Con.", "No Div.", "All", "Selected")


@dataclass(frozen=True)
class Condition:
    """One fine-tuning set: ``method`` (a :data:`METHODS` name), ``draw`` (which random draw), the tasks
    and how many training examples each gets (``counts``; empty for *None*)."""

    method: str
    draw: int
    tasks: tuple[str, ...]
    counts: tuple[int, ...]

    @property
    def label(self) -> str:
        return self.method if self.method not in ("Random", "No Con.") else f"{self.method} #{self.draw + 1}"

    @property
    def total(self) -> int:
        return sum(self.counts)


def split_budget(budget: int, tasks: Sequence[str]) -> dict[str, int]:
    """``budget`` examples over ``tasks``: equal shares, the remainder one each to the first tasks."""
    if not tasks:
        return {}
    base, extra = divmod(budget, len(tasks))
    return {t: base + (1 if i < extra else 0) for i, t in enumerate(tasks)}


def conditions(selection: Selection, reselect: Callable[[list[str]], list[str]], budget: int, draws: int = 3,
               seed: int = 0, no_div_size: int | None = None) -> list[Condition]:
    """Every condition for one target. ``reselect(order)`` runs the stopping rule on another order
    (the *No Con.* ablation); ``seed`` fixes the random draws and orders."""
    pool, k = list(selection.order), len(selection.selected)
    rng = random.Random(f"taskselect:{seed}")
    sets: list[tuple[str, int, list[str]]] = [("None", 0, []), ("Selected", 0, selection.selected), ("All", 0, pool)]
    sets += [("Random", i, rng.sample(pool, k)) for i in range(draws)]
    sets += [("No Con.", i, reselect(rng.sample(pool, len(pool)))) for i in range(draws)]
    size = min(len(pool), no_div_size if no_div_size else 2 * k)
    sets.append(("No Div.", 0, [t for t, _ in sorted(selection.similarity.items(), key=lambda x: -x[1])][:size]))
    out = []
    for method, draw, tasks in sets:
        share = split_budget(budget, tasks)
        out.append(Condition(method, draw, tuple(tasks), tuple(share[t] for t in tasks)))
    return out


__all__ = ["METHODS", "Condition", "conditions", "split_budget"]
