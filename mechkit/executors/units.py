"""Units through an executor and the run's step cache: finished units are read back, never redone.

Each unit has a step key (``ctx.step``'s). Units already kept are taken from the cache; the others go
to the executor, and each result is kept the moment it reaches this process (a chunk's results when
the chunk returns), so a run killed at any point — driver or worker — loses only the units still
running. Results come back in the order of ``units`` and in their JSON form (what the cache holds),
so a resumed run and an uninterrupted one give the same values.

>>> from mechkit.executors.base import SerialExecutor
>>> kept = {}
>>> def step(key, compute):
...     if key not in kept:
...         kept[key] = compute()
...     return kept[key]
>>> def square(handle, shared, units):
...     for x in units:
...         yield (x * x, shared)
>>> map_units(SerialExecutor(None), step, square, "s", [2, 3], ["two", "three"])
[[4, 's'], [9, 's']]
>>> kept["three"] = [0, "kept"]; del kept["two"]
>>> map_units(SerialExecutor(None), step, square, "s", [2, 3], ["two", "three"])  # only "two" is computed
[[4, 's'], [0, 'kept']]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from mechkit.errors import MechkitError
from mechkit.executors.base import Executor, OnResult, UnitFn
from mechkit.io.steps import Step, stored


def map_units(executor: Executor, step: Step | None, fn: UnitFn, shared: Any, units: Sequence[Any],
              keys: Sequence[str], on_result: OnResult | None = None) -> list:
    """The results of ``fn`` over ``units`` (in order), each kept under its key as it arrives.

    ``on_result(i, value)`` is called once per unit, for kept ones first (a progress bar counts them).
    """
    from mechkit.report import to_jsonable

    if len(keys) != len(units):
        raise MechkitError(f"{len(units)} units came with {len(keys)} step keys", "pass one key per unit")
    twice = next((k for k, n in Counter(keys).items() if n > 1), None)
    if twice is not None:  # the second unit would silently take the first one's kept result
        raise MechkitError(f"two units share the step key {twice!r}", "give every unit its own key")
    step = step or (lambda _key, compute: compute())
    results: list[Any] = [None] * len(units)
    todo = []
    for i, key in enumerate(keys):
        found, value = stored(step, key)
        if found:
            results[i] = value
            if on_result is not None:
                on_result(i, value)
        else:
            todo.append(i)

    def keep(j: int, result: Any) -> None:
        i = todo[j]
        value = to_jsonable(result, "keep")  # the cache's form, also where the run keeps no steps
        results[i] = step(keys[i], lambda: value)
        if on_result is not None:
            on_result(i, results[i])

    if todo:
        executor.map(fn, shared, [units[i] for i in todo], keep)
    return results
