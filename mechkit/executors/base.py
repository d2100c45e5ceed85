"""The executor interface: map units of work to their results, in submission order.

A *unit function* ``fn(handle, shared, units)`` is a module-level function (a Ray worker imports it
by name) that yields one JSON-able result per unit, in order. ``shared`` holds what every unit needs
(prompts, vectors); it travels once per map, not once per unit. A unit's result must depend only on
the model, ``shared`` and the unit itself, never on which other units share its call: that is what
makes a report identical whatever the executor, the number of workers or the chunk size. A unit
function may do per-call setup (one clean forward for all the layers of a batch, one weight-edit
context for a λ grid) as long as that holds.

>>> import mechkit as mk
>>> def lengths(handle, shared, units):
...     for text in units:
...         yield len(handle.tokenizer(shared + text)["input_ids"])
>>> SerialExecutor(mk.load_model("tiny:gpt2")).map(lengths, "ab", ["c", "cd"])
[3, 4]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

UnitFn = Callable[["ModelHandle", Any, list], Iterable[Any]]
"""``fn(handle, shared, units)``: one result per unit, in order (a generator streams them)."""

OnResult = Callable[[int, Any], None]
"""``on_result(i, result)``: called as the result of unit ``i`` arrives (any order across chunks)."""


class Executor(Protocol):
    """Where units run. ``map`` returns the results in the order of ``units``, calling ``on_result`` as
    each arrives so the caller can keep it (the run's step cache) before the rest are done."""

    name: str
    workers: int

    def map(self, fn: UnitFn, shared: Any, units: Sequence[Any], on_result: OnResult | None = None) -> list:
        ...

    def close(self) -> None:
        ...


class SerialExecutor:
    """Every unit in this process, on the run's own model, one call for all of them (results stream)."""

    name = "serial"
    workers = 1

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle

    def map(self, fn: UnitFn, shared: Any, units: Sequence[Any], on_result: OnResult | None = None) -> list:
        results = []
        stream = iter(fn(self.handle, shared, list(units)))
        try:
            for i, result in enumerate(stream):
                results.append(result)
                if on_result is not None:
                    on_result(i, result)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # a unit function's contexts (weight edits, hooks) exit now, also when the caller failed
        check_count(fn, units, results)
        return results

    def close(self) -> None:
        pass


def check_count(fn: UnitFn, units: Sequence[Any], results: Sequence[Any]) -> None:
    """A unit function must give one result per unit: anything else is a bug in it, said plainly."""
    if len(results) != len(units):
        raise MechkitError(f"unit function {getattr(fn, '__qualname__', fn)!r} gave {len(results)} results for "
                           f"{len(units)} units", "yield exactly one result per unit; report this as a bug")


def chunks(n: int, workers: int, size: int | None = None) -> list[range]:
    """``range(n)`` cut into consecutive chunks: ``size`` each, else about four per worker (small enough
    that a fast worker takes more and a lost chunk costs little, large enough that per-chunk setup and
    the round trip stay small beside the work).

    >>> [list(c) for c in chunks(7, workers=2)]
    [[0], [1], [2], [3], [4], [5], [6]]
    >>> [len(c) for c in chunks(100, workers=2)]
    [13, 13, 13, 13, 13, 13, 13, 9]
    """
    size = size or max(1, -(-n // (4 * max(workers, 1))))
    return [range(i, min(i + size, n)) for i in range(0, n, size)]
