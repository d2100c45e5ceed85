"""Reusable parsers for ``Option(parse=...)``: text in, a checked value out, ``OptionError`` otherwise.

Each parser is a small frozen dataclass called with the option's text. Its errors name what is
wrong with the text and how to fix it; :meth:`Option.check <mechkit.options.Option.check>` adds
the flag and the value. ``metavar`` and ``describe()`` feed ``--help``.

>>> NumberList(int, min=1, sort=True)("20,5,10,5")
(5, 10, 20)
>>> parse_lambdas("-1:1:0.5")
[-1.0, -0.5, 0.0, 0.5, 1.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mechkit.model.headspec import non_utf8_at
from mechkit.options.option import MAX_COUNT, TYPE_WORDS, Bounds, OptionError, show, to_number

MAX_INDEX = 100_000
"""The largest layer or head index :class:`IntRanges` takes: no model has that many, and a range is expanded
to its indices before the model is known (``--layers 0-99999999999`` filled 24 GB before any check)."""


def _items(text: str) -> list[str]:
    """The comma-separated items of ``text``, stripped, empty ones dropped."""
    return [x.strip() for x in str(text).split(",") if x.strip()]


def _number(item: str, kind: type, fix: str, bounds: Bounds | None = None, finite: bool = True) -> int | float:
    try:
        value = to_number(item, kind)
    except (TypeError, ValueError, OverflowError):
        raise OptionError(f"{item!r} is not {TYPE_WORDS[kind]}", fix) from None
    try:
        infinite = finite and not math.isfinite(value)
    except OverflowError:  # an int of 400 digits: no float holds it, so no bound can be checked against it
        raise OptionError(f"{str(item)[:20]}… ({len(str(item))} digits) is too large for any bound", fix) from None
    if infinite:
        raise OptionError(f"{item} is not a finite number", fix)
    problem = bounds.problem(value) if bounds else None
    if problem:
        raise OptionError(f"{show(value)} {problem}", fix)
    return value


@dataclass(frozen=True)
class NumberList:
    """Comma-separated numbers, each of ``kind`` (``int`` or ``float``) and inside the bounds.

    Returns a tuple in the order given (duplicates kept), or sorted without duplicates with
    ``sort=True``. ``allow_empty`` accepts blank text as ``()`` (e.g. "no sweep"). Whole numbers with a
    ``min`` and no ``max`` (counts: shots, k values, seeds) are at most ``MAX_COUNT``, as a whole-number
    :class:`~mechkit.options.Option` is: ``--shots 0,99999999999`` built prompts until memory ran out.

    >>> NumberList(int, min=0)("0, 3")
    (0, 3)
    >>> try:
    ...     NumberList(float, min=0, min_exclusive=True)("1,0")
    ... except OptionError as err:
    ...     print(err)
    0.0 is not above 0 — use comma-separated numbers, each above 0
    """

    kind: type = int
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    sort: bool = False
    allow_empty: bool = False
    example: str | None = None

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.min, self.max, self.min_exclusive, self.max_exclusive)

    @property
    def metavar(self) -> str:
        word = "K" if self.kind is int else "X"
        return f"{word}[,{word}...]"

    @property
    def fix(self) -> str:
        noun = "whole numbers" if self.kind is int else "numbers"
        each = f", each {self.bounds.requirement()}" if self.bounds else ""
        like = f", like {self.example}" if self.example else ""
        return f"use comma-separated {noun}{each}{like}"

    def describe(self) -> str:
        return f"each {self.bounds.describe()}" if self.bounds else ""

    def __call__(self, text: str) -> tuple:
        items = _items(text)
        if not items:
            if self.allow_empty and not str(text).strip():
                return ()
            raise OptionError("no numbers given", self.fix)
        values = [_number(x, self.kind, self.fix, self.bounds) for x in items]
        if self.kind is int and self.min is not None and self.max is None:
            huge = next((v for v in values if v > MAX_COUNT), None)
            if huge is not None:
                raise OptionError(f"{show(huge)} is more than {MAX_COUNT:,}",
                                  "a count that large is a typo that would run for days or exhaust memory; "
                                  "pass a smaller one")
        return tuple(sorted(set(values))) if self.sort else tuple(values)


@dataclass(frozen=True)
class OrAuto:
    """``auto`` -> ``None`` (the plugin picks the value for the model it runs on), else ``inner``'s result:
    for a default that depends on the model's depth, which a fixed default would get wrong on a small model.

    >>> OrAuto(NumberList(int))("auto") is None, OrAuto(NumberList(int))("3,1")
    (True, (3, 1))
    """

    inner: Any

    @property
    def metavar(self) -> str:
        return f"auto|{self.inner.metavar}"

    def describe(self) -> str:
        return self.inner.describe()

    def __call__(self, text: str) -> Any:
        return None if str(text).strip().lower() == "auto" else self.inner(text)


@dataclass(frozen=True)
class Grid:
    """A grid of finite numbers: ``start:stop:step`` (stop included) or a comma list; sorted, unique.

    The grammar of ``mechkit taskvec sweep --lambdas``. At most ``max_points`` values.

    >>> Grid()("0:1:0.25")
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> Grid()("1,0,1")
    [0.0, 1.0]
    """

    max_points: int = 10_000
    metavar: str = "START:STOP:STEP|X,X..."
    fix: str = "use start:stop:step like -1:1.5:0.1 or a list like -1,0,1"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> list[float]:
        text = str(text)
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise OptionError(f"start:stop:step has 3 parts, got {len(parts)}", self.fix)
            start, stop, step = (_number(x.strip(), float, self.fix) for x in parts)
            if step <= 0:
                raise OptionError(f"step {show(step)} is not above 0", self.fix)
            if stop < start:
                raise OptionError(f"stop {show(stop)} is below start {show(start)}", self.fix)
            span = (stop - start) / step
            if not span + 1 <= self.max_points:  # also refuses an overflowing span (inf)
                raise OptionError(f"the grid has more than {self.max_points} points", "use a larger step")
            n = int(round(span)) + 1
            values = [round(start + i * step, 10) for i in range(n) if start + i * step <= stop + 1e-9]
        else:
            values = [_number(x, float, self.fix) for x in _items(text)]
            if len(values) > self.max_points:
                raise OptionError(f"{len(values)} points is more than {self.max_points}", "give fewer values")
        if not values:
            raise OptionError("no values given", self.fix)
        return sorted(dict.fromkeys(values))


parse_lambdas = Grid()
"""The λ grid of ``taskvec sweep``: ``"-1:1.5:0.1"`` (start:stop:step, stop included) or ``"-1,0,0.5,1"``."""


@dataclass(frozen=True)
class Ranges:
    """Parsed ``all``, ``12-24`` or ``10,20,25``: indices checked against the model by :meth:`resolve`."""

    text: str
    values: tuple[int, ...] | None  # None: all

    def resolve(self, n: int, flag: str = "--layers", what: str = "layers") -> list[int]:
        """The sorted indices, refusing any at or above ``n`` (the model's count of ``what``).

        >>> IntRanges()("1-2,0").resolve(4)
        [0, 1, 2]
        """
        if self.values is None:
            return list(range(n))
        if self.values[-1] >= n:
            raise OptionError(f"{flag} {self.text!r} is out of range: the model has {n} {what} (0–{n - 1})",
                              f"use all, a range like 0-{n - 1} or a list of indices below {n}")
        return list(self.values)


@dataclass(frozen=True)
class IntRanges:
    """``all``, ranges ``12-24`` and indices ``10,20`` (combinable: ``0-3,8``) -> :class:`Ranges`.

    Indices are 0-based and never negative; the upper limit depends on the model, so it is
    checked by ``Ranges.resolve(n)`` once the model is loaded (before any work). Each index is at most
    :data:`MAX_INDEX`, checked before a range is expanded: ``0-99999999999`` is refused, not listed.

    >>> IntRanges()("12-14,3").values
    (3, 12, 13, 14)
    >>> IntRanges()("all").resolve(3)
    [0, 1, 2]
    """

    metavar: str = "all|A-B|I,J..."
    fix: str = "use all, a range like 12-24 or a list like 10,20"
    kind: ClassVar[type] = int  # its items are whole numbers: mk.run(..., layers=[10.0]) is "10", as n=5.0 is 5

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> Ranges:
        text = str(text)
        if text.strip() == "all":
            return Ranges(text, None)
        found: set[int] = set()
        for item in _items(text):
            lo, dash, hi = item.partition("-")
            if not lo.strip() or (dash and not hi.strip()):
                raise OptionError(f"{item!r} is not an index or a range A-B", self.fix)
            a = _number(lo, int, self.fix, Bounds(min=0))
            b = _number(hi, int, self.fix, Bounds(min=0)) if dash else a
            if max(a, b) > MAX_INDEX:  # before range() fills memory with indices resolve() would refuse
                raise OptionError(f"index {show(max(a, b))} is above {MAX_INDEX:,}: no model has that many",
                                  "use all, a range like 12-24 or indices below the model's count")
            if b < a:
                raise OptionError(f"range {item!r} ends before it starts", self.fix)
            found.update(range(a, b + 1))
        if not found:
            raise OptionError("no indices given", self.fix)
        return Ranges(text, tuple(sorted(found)))


DEFAULT_TASKS = "capitalize,past-tense,country-capital"
"""The ``--tasks`` default of the plugins that score ICL tasks: three of the seeds' tasks a small model solves."""


@dataclass(frozen=True)
class TaskList:
    """Comma-separated task ids (``mechkit tasks`` lists them), validated without loading a model.

    ``unique`` (the default) drops repeats as :func:`mechkit.tasks.parse_tasks` does; ``count``
    demands exactly that many ids; ``allow_empty`` accepts blank text as ``[]``.

    >>> TaskList()("swap+capitalize, swap")
    ['capitalize+swap', 'swap']
    """

    count: int | None = None
    unique: bool = True
    allow_empty: bool = False
    metavar: str = "TASK[,TASK...]"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> list[str]:
        from mechkit.tasks import get_task, parse_tasks

        if self.allow_empty and not str(text).strip():
            return []
        ids = parse_tasks(text) if self.unique else [get_task(x).id for x in _items(text)]
        if not ids:
            raise OptionError("no task ids given", "pass ids separated by commas; `mechkit tasks` lists them")
        if self.count is not None and len(ids) != self.count:
            word = {1: "one task id", 2: "two task ids"}.get(self.count, f"{self.count} task ids")
            raise OptionError(f"takes {word}, got {len(ids)} ({', '.join(ids)})",
                              f"pass {word}, e.g. {','.join(['capitalize', 'past-tense'][:self.count])}"
                              if self.count <= 2 else f"pass {word}")
        return ids


@dataclass(frozen=True)
class Choices:
    """A comma-separated subset of ``choices`` -> those choices, in their declared order, each once.

    >>> Choices(("study", "steps", "components"))("components, study")
    ('study', 'components')
    """

    choices: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return ",".join(self.choices)

    @property
    def fix(self) -> str:
        return f"use some of {','.join(self.choices)}, comma-separated"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> tuple[str, ...]:
        items = set(_items(text))
        unknown = sorted(items - set(self.choices))
        if unknown:
            raise OptionError(f"unknown choice {', '.join(map(repr, unknown))}", self.fix)
        if not items:
            raise OptionError("nothing chosen", self.fix)
        return tuple(c for c in self.choices if c in items)


@dataclass(frozen=True)
class HeadSpec:
    """A ``--heads`` spec whose items are well formed (``induction``, ``random``, ``layer:L``, ``17.3``)
    -> its :class:`~mechkit.model.headspec.HeadSelection`, the one parse of the run; which heads exist is
    checked once the model is loaded.

    >>> HeadSpec()("induction,17.3").items
    (('score', 'induction'), ('pair', 17, 3))
    """

    metavar: str = "SPEC"
    numbers_as_text: bool = False  # 2.10 given as a number is the float 2.1: a head spec is text (Option._typed)

    def describe(self) -> str:
        return ""

    def __call__(self, text: str):
        from mechkit.errors import HeadSpecError
        from mechkit.model.headspec import parse_spec

        try:
            return parse_spec(text)
        except HeadSpecError as err:
            raise OptionError(err.problem, err.fix) from None


@dataclass(frozen=True)
class Text:
    """Free text that must hold something besides spaces (a prompt) -> the text as given.

    >>> Text("the prompt")("The cat sat.")
    'The cat sat.'
    """

    what: str = "text"
    example: str = "The cat sat. The cat sat."
    max_chars: int = 100_000
    metavar: str = "TEXT"
    # Only a str is text here (Option._typed refuses anything else): ``prompt=float("nan")`` ran on "nan", and
    # a number or list is a mistaken argument, never a prompt; the command line always gives a str.
    text_only: ClassVar[bool] = True

    @property
    def fix(self) -> str:
        return f'pass {self.what}, e.g. "{self.example}"'

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise OptionError(f"{self.what} is not text ({type(text).__name__})", self.fix)
        if not text.strip():
            raise OptionError(f"{self.what} is empty", self.fix)
        if len(text) > self.max_chars:
            raise OptionError(f"{self.what} is {len(text):,} characters long, more than {self.max_chars:,}",
                              f"pass at most {self.max_chars:,} characters")
        at = non_utf8_at(text)
        if at is not None:  # bytes that were not UTF-8: the tokenizer raised TypeError after the load
            raise OptionError(f"{self.what} holds bytes that are not UTF-8 text ({at})",
                              f"pass {self.what} as UTF-8 text")
        return text


@dataclass(frozen=True)
class Paths:
    """Comma-separated paths that must exist, ``count`` of them when given -> their list.

    >>> Paths(count=2)(".,..")
    ['.', '..']
    """

    count: int | None = None
    what: str = "files"
    example: str | None = None
    metavar: str = "PATH[,PATH...]"
    reads_files: ClassVar[bool] = True  # the resume key covers the files' content (mechkit.options.inputs)

    @property
    def fix(self) -> str:
        like = f", e.g. {self.example}" if self.example else ""
        return f"pass {self.count or 'one or more'} existing {self.what} separated by commas{like}"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> list[str]:
        paths = _items(text)
        if not paths or (self.count is not None and len(paths) != self.count):
            raise OptionError(f"needs {self.count or 'one or more'} paths, got {len(paths)}", self.fix)
        return [check_exists(p, self.fix) for p in paths]


def check_exists(path: str, fix: str) -> str:
    """``path`` with ``~`` expanded (as ``--model`` expands it: ``--from ~/runs/d`` was "does not exist"),
    refused where it does not exist or the system cannot look it up (a name too long, a component that is
    a file: ``Path.exists`` raised OSError, which the command line reported as an --out it could not write)."""
    try:
        expanded = str(Path(path).expanduser())
    except RuntimeError:  # ~user of a user without a home: the name as given
        expanded = path
    try:
        found = Path(expanded).exists()
    except OSError as err:
        raise OptionError(f"{show_path(path)} cannot be looked up: {err.strerror or err}", fix) from None
    if not found:
        raise OptionError(f"{path} does not exist", fix)
    return expanded


def show_path(path: str, limit: int = 120) -> str:
    """A path as an error line quotes it: a name of thousands of characters is cut, not printed whole."""
    return path if len(path) <= limit else f"{path[:limit]}… ({len(path)} characters)"


@dataclass(frozen=True)
class ExistingPath:
    """One path that must exist (a file or a directory) -> the path as given.

    >>> ExistingPath("detect report")(".")
    '.'
    """

    what: str = "file"
    metavar: str = "PATH"
    reads_files: ClassVar[bool] = True  # the resume key covers the file's content (mechkit.options.inputs)

    @property
    def fix(self) -> str:
        return f"pass an existing {self.what}"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> str:
        text = str(text)
        if not text.strip():
            raise OptionError("no path given", self.fix)
        return check_exists(text, self.fix)
