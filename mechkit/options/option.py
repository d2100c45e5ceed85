"""``Option``: one plugin option declared with its type, bounds, choices and parser.

Everything a value can be checked against without a model is declared here, so the runner and
the CLI refuse bad input before the model loads, each time with one line that names the flag,
the bad value and the fix:

>>> try:
...     Option("batch_size", int, 16, min=1).check("0")
... except OptionError as err:
...     print(err)
--batch-size 0 is below 1 — pass --batch-size 1 or more
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from mechkit.errors import MechkitError, PluginError

TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}
BOOL_WORDS = {"true": True, "1": True, "yes": True, "y": True, "on": True, "t": True,
              "false": False, "0": False, "no": False, "n": False, "off": False, "f": False}


class OptionError(PluginError, ValueError):
    """A value an option refuses; ``str(err)`` is the one line the CLI prints (exit code 2)."""


@dataclass(frozen=True)
class Bounds:
    """Inclusive (by default) or exclusive limits on a number.

    >>> Bounds(min=0, min_exclusive=True).problem(0)
    'is not above 0'
    >>> Bounds(min=1, max=10).requirement(), Bounds(min=1, max=10).describe()
    ('from 1 to 10', '1<=x<=10')
    """

    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False

    def __bool__(self) -> bool:
        return self.min is not None or self.max is not None

    def problem(self, value: float) -> str | None:
        """What is wrong with ``value`` (``"is below 1"``), or ``None`` when it is inside the bounds."""
        if self.min is not None:
            if self.min_exclusive and not value > self.min:
                return f"is not above {self.min}"
            if not self.min_exclusive and value < self.min:
                return f"is below {self.min}"
        if self.max is not None:
            if self.max_exclusive and not value < self.max:
                return f"is not below {self.max}"
            if not self.max_exclusive and value > self.max:
                return f"is above {self.max}"
        return None

    def requirement(self) -> str:
        """The allowed values in words: ``1 or more``, ``above 0``, ``from 0 to 1``."""
        low = None if self.min is None else (f"above {self.min}" if self.min_exclusive else f"{self.min} or more")
        high = None if self.max is None else (f"below {self.max}" if self.max_exclusive else f"{self.max} or less")
        if low and high and not (self.min_exclusive or self.max_exclusive):
            return f"from {self.min} to {self.max}"
        return " and ".join(x for x in (low, high) if x)

    def describe(self) -> str:
        """The bounds as ``--help`` shows them (click's notation): ``x>=1``, ``0<x<=1``."""
        if not self:
            return ""
        low = "" if self.min is None else f"{self.min}{'<' if self.min_exclusive else '<='}"
        high = "" if self.max is None else f"{'<' if self.max_exclusive else '<='}{self.max}"
        if self.min is not None and self.max is None:
            return f"x{'>' if self.min_exclusive else '>='}{self.min}"
        return f"{low}x{high}"


def show(value: Any) -> str:
    """A value as an error message quotes it: numbers plainly, text in quotes (so ``''`` shows)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return repr(value)
    return repr(value) if isinstance(value, float) else str(value)


def to_number(value: Any, kind: type) -> int | float:
    """``value`` (text or a number) as an ``int`` or ``float``; ``ValueError`` when it is not one.

    Whole floats count as ints (``5.0`` -> ``5``); ``True``/``False`` are never numbers.

    >>> to_number(" 12 ", int), to_number(5.0, int), to_number("1e-4", float)
    (12, 5, 0.0001)
    """
    if not isinstance(value, str):
        value = plain_number(value)
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return int(value.strip())
        raise ValueError(value)
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(value)


def plain_number(value: Any) -> Any:
    """A NumPy (or other ``numbers``) integer or real as Python's ``int`` or ``float``, else ``value`` as given;
    ``ValueError`` for a boolean of any kind. ``mk.run("detect", top_k=np.int64(3))`` was refused as "not a
    whole number" while ``mk.parse_heads`` and the lens took NumPy integers.

    >>> import numpy as np
    >>> plain_number(np.int64(3)), plain_number(np.float32(0.5)), plain_number("7")
    (3, 0.5, '7')
    """
    if is_bool(value):
        raise ValueError(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, float):
        return float(str(value)) if hasattr(value, "dtype") else float(value)  # np.float32(1e-3): 0.001, as typed
    return value


def number_text(value: Any) -> str:
    """A number as the command line would give it: NumPy's own shortest text for its floats (``np.float32(0.2)``
    is ``'0.2'``, not the ``'0.20000000298023224'`` of its ``float``), integers of any kind as ``int``."""
    value_ = plain_number(value)
    if isinstance(value, float | numbers.Integral) or hasattr(value, "dtype"):
        return str(value_) if isinstance(value_, int) else str(value)
    return str(value_)


def _holds_number(value: Any) -> bool:
    """A number, or a list, tuple or array holding one (booleans of any kind aside); a 0-d array is its item."""
    value = scalar(value)
    items = list(value) if isinstance(value, list | tuple) or type(value).__name__ == "ndarray" else [value]
    return any(isinstance(x, numbers.Real) and not is_bool(x) for x in items)


def scalar(value: Any) -> Any:
    """A 0-d NumPy array as the NumPy scalar it holds (``np.array(3)`` -> ``np.int64(3)``), else ``value`` as given:
    ``heads=np.array(3)`` raised "iteration over a 0-d array", and ``np.array(True)`` for a bool option was refused.

    >>> import numpy as np
    >>> scalar(np.array(3)), scalar(np.array("x")), scalar([1])
    (np.int64(3), np.str_('x'), [1])
    """
    if type(value).__name__ == "ndarray" and getattr(value, "ndim", None) == 0:
        return value[()]
    return value


def is_bool(value: Any) -> bool:
    """Python's or NumPy's boolean (``np.bool_`` is not a ``bool``, nor an ``int``)."""
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool") and hasattr(value, "dtype")


MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class Option:
    """One plugin option; ``top_k`` becomes ``--top-k`` on the command line.

    The first seven fields keep their positions (``Option("n", int, 30, "Prompts per task.")``);
    the checks are keyword-only:

    - ``min``/``max``: bounds of an ``int``/``float`` value, inclusive unless ``min_exclusive``/
      ``max_exclusive``; a whole-number option with a ``min`` and no ``max`` gets ``max=MAX_COUNT``
      (1,000,000): a count past it is a typo that would run for days or exhaust memory;
    - ``finite``: a ``float`` must be finite (``nan`` is always refused; set ``False`` where
      ``inf`` means something);
    - ``parse``: a callable ``str -> value`` (see :mod:`mechkit.options.parsers`) raising
      ``ValueError`` or :class:`~mechkit.errors.MechkitError`; the plugin reads its result from
      ``ctx.options[name]`` while the report (``ctx.params[name]``) keeps the text as given;
    - ``required``: ``None`` is refused (for options with no sensible default);
    - ``metavar``: what ``--help`` shows for the value (default: the parser's, else the type's);
    - ``execution``: the option says how the run executes, never what it computes (``--executor``,
      ``--workers``): the report records it, but it is left out of the run's resume key, so a run
      stopped under one executor resumes under another;
    - ``files``: the value names input files (``--vectors A,B``, ``--load-vector``, ``--from``): the
      run's resume key covers their content, not just their names, so a file replaced at the same path
      between a killed run and its rerun starts the run fresh.

    >>> Option("lr", float, 1e-4, min=0, min_exclusive=True).check("0.001")
    (0.001, 0.001)
    >>> from mechkit.options.parsers import NumberList
    >>> Option("sweep", str, None, parse=NumberList(int, min=1, sort=True)).check("10,5")
    ('10,5', (5, 10))
    """

    name: str
    type: type = str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None
    is_flag: bool = False
    cli_name: str | None = None  # e.g. "from" for an option named from_report
    _: KW_ONLY
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    finite: bool = True
    parse: Callable[[str], Any] | None = None
    required: bool = False
    metavar: str | None = None
    execution: bool = False
    files: bool = False

    @property
    def flag(self) -> str:
        return "--" + (self.cli_name or self.name.replace("_", "-"))

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.min, self.max, self.min_exclusive, self.max_exclusive)

    def coerce(self, value: Any) -> Any:
        """The value as the report records it: of the declared type, inside the bounds, one of the choices.

        Text from the command line and numbers from Python are both accepted (``"5"`` -> ``5`` for an
        ``int`` option, ``0`` -> ``"0"`` for a ``str`` one). Raises :class:`OptionError`.
        """
        if value is None:
            if self.required:
                raise OptionError(f"{self.flag} is required", f"pass {self.flag} {self.value_hint()}")
            return None
        value = self._typed(value)
        if self.type in (int, float):
            self._check_number(value)
        if self.choices and value not in self.choices:
            raise OptionError(f"{self.flag} must be one of {', '.join(self.choices)}, got {show(value)}",
                              f"pass {self.flag} {self.choices[0]}")
        return value

    def check(self, value: Any) -> tuple[Any, Any]:
        """``(coerced, parsed)``: :meth:`coerce`, then the declared parser (parsed is coerced without one)."""
        value = self.coerce(value)
        if self.parse is None or value is None:
            return value, value
        try:
            return value, self.parse(value)
        except MechkitError as err:
            raise OptionError(f"{self.flag} {show(value)}: {err.problem}", err.fix) from None
        except ValueError as err:
            fix = getattr(self.parse, "fix", None) or f"pass {self.flag} {self.value_hint()}"
            raise OptionError(f"{self.flag} {show(value)}: {err}", fix) from None

    def value_hint(self) -> str:
        """What to type after the flag, for a fix: the metavar, then an example or the help text."""
        metavar = self.display_metavar()
        example = getattr(self.parse, "example", None)
        if example:
            return f"{metavar}, e.g. {self.flag} {example}"
        return f"{metavar}: {self.help.rstrip('.')}" if self.help else metavar

    def display_metavar(self) -> str:
        if self.metavar:
            return self.metavar
        if self.choices:
            return "[" + "|".join(self.choices) + "]"
        parser_metavar = getattr(self.parse, "metavar", None)
        if parser_metavar:
            return parser_metavar
        return {int: "INTEGER", float: "FLOAT", bool: "BOOLEAN"}.get(self.type, "TEXT")

    def help_extra(self) -> list[str]:
        """What ``--help`` adds in brackets: the default and the bounds (``default: 16``, ``x>=1``)."""
        extra = []
        if self.default is not None and not self.is_flag:
            extra.append(f"default: {self.default!s}" if self.default != "" else 'default: ""')
        if self.bounds:
            extra.append(self.bounds.describe())
        describe = getattr(self.parse, "describe", None)
        if callable(describe) and describe():
            extra.append(describe())
        if self.required:
            extra.append("required")
        return extra

    def _typed(self, value: Any) -> Any:
        """:meth:`_typed_value`, with whatever a hostile value raises on the way (an ``__int__``, ``__str__`` or
        ``__fspath__`` of its own) one line naming the option: they were raw tracebacks."""
        try:
            return self._typed_value(value)
        except MechkitError:
            raise
        except Exception as err:  # noqa: BLE001 - whatever a value's own methods raise
            raise OptionError(f"{self.flag} was given a {type(value).__name__} that could not be read as "
                              f"{TYPE_WORDS.get(self.type, self.type.__name__)} ({type(err).__name__})",
                              f"pass {self.flag} {self.value_hint()}") from None

    def _typed_value(self, value: Any) -> Any:
        kind = self.type
        value = scalar(value)  # np.array(3) as np.int64(3), np.array(True) as np.True_: what each option reads
        if kind in (int, float):
            try:
                return to_number(value, kind)
            except (TypeError, ValueError, OverflowError):
                raise OptionError(f"{self.flag} {show(value)} is not {TYPE_WORDS[kind]}",
                                  f"pass {TYPE_WORDS[kind]}, e.g. {self.flag} {self._example()}") from None
        if kind is bool:
            if is_bool(value):
                return bool(value)  # np.True_ as True
            if isinstance(value, numbers.Integral) and int(value) in (0, 1):
                return bool(value)  # 1 and np.int64(1) alike
            if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
                return BOOL_WORDS[value.strip().lower()]
            raise OptionError(f"{self.flag} {show(value)} is not true or false", f"pass {self.flag} true or false")
        if kind is str:
            if isinstance(value, str):
                self._check_utf8(value)
                return str.__str__(value)  # np.str_('x') as 'x'; a str Enum as its text, not its str() ('P.CAT')
            if not getattr(self.parse, "numbers_as_text", True) and _holds_number(value):
                raise OptionError(f"{self.flag} {show(value)}: a number cannot name a head (2.10 and 2.1 are the "
                                  "same float)", f"pass {self.flag} as text ('2.10') or as mk.Head(2, 10)")
            if getattr(self.parse, "text_only", False):  # a prompt: 1.5, nan or a list would run as that text
                raise OptionError(f"{self.flag} {show(value)} is not text ({type(value).__name__})",
                                  f"pass {self.flag} as a str: {self.value_hint()}")
            if isinstance(value, os.PathLike):
                return os.fspath(value)
            if isinstance(value, numbers.Real) and not is_bool(value):
                return self._number_item(value)
            from mechkit.model.headspec import (
                Head,  # mk.run(..., heads=[mk.Head(0, 1)]), as mk.ablate takes them
            )

            if isinstance(value, Head):
                return str(value)
            if type(value).__name__ == "ndarray" and getattr(value, "ndim", None) == 1:
                value = list(value)  # np.array([5, 10]) as [5, 10], each item with NumPy's own shortest text
            if isinstance(value, list | tuple) and all(isinstance(x, str | numbers.Real | os.PathLike | Head) and
                                                       not is_bool(x)
                                                       for x in value):
                return ",".join(os.fspath(x) if isinstance(x, os.PathLike) else str.__str__(x) if isinstance(x, str)
                                else str(x) if isinstance(x, Head) else self._number_item(x) for x in value)
            raise OptionError(f"{self.flag} {show(value)} is not text", f"pass {self.flag} {self.value_hint()}")
        try:
            return value if isinstance(value, kind) else kind(value)
        except (TypeError, ValueError) as err:
            raise OptionError(f"{self.flag} {show(value)} is not a valid {kind.__name__}: {err}",
                              f"pass {self.flag} {self.value_hint()}") from None

    def _number_item(self, value: Any) -> str:
        """A number given for a text option, as the command line would give it (``np.float32(0.2)`` -> ``'0.2'``);
        for a list of whole numbers an integral float is its integer, as a whole-number option takes ``n=5.0``:
        ``sweep=[5.0]`` was refused as "'5.0' is not a whole number" while ``n=5.0`` ran."""
        parse = getattr(self.parse, "inner", self.parse)  # OrAuto(NumberList(int))
        if getattr(parse, "kind", None) is int:
            plain = plain_number(value)
            if isinstance(plain, float) and plain.is_integer() and abs(plain) <= 2**63:  # 1e301 stays as typed
                return str(int(plain))
        return number_text(value)

    def _check_utf8(self, text: str) -> None:
        """Text options hold text UTF-8 can write: bytes that are not UTF-8 on the command line (``$'\\xff'``)
        reach Python as lone surrogates, which the tokenizer refused with a TypeError after the model had
        loaded (and a report could not write). Options that name files are left to the file system, where
        such a name is valid."""
        from mechkit.model.headspec import non_utf8_at
        from mechkit.options.inputs import names_files

        at = non_utf8_at(text)
        if at is not None and not names_files(self):
            raise OptionError(f"{self.flag} holds bytes that are not UTF-8 text ({at})", f"pass {self.flag} as UTF-8 text (check the terminal's or the "
                              "file's encoding, e.g. iconv -t utf-8)")

    def _check_number(self, value: int | float) -> None:
        if isinstance(value, float) and not math.isfinite(value) and (math.isnan(value) or self.finite):
            raise OptionError(f"{self.flag} {value} is not a finite number",
                              f"pass a finite number, e.g. {self.flag} {self._example()}")
        problem = self.bounds.problem(value)
        if problem:
            raise OptionError(f"{self.flag} {show(value)} {problem}", f"pass {self.flag} {self.bounds.requirement()}")
        if self.type is int and self.min is not None and self.max is None and value > MAX_COUNT:
            raise OptionError(f"{self.flag} {show(value)} is more than {MAX_COUNT:,}",
                              "a count that large is a typo that would run for days; pass a smaller one")

    def _example(self) -> str:
        finite = not (isinstance(self.default, float) and not math.isfinite(self.default))  # a NaN default: no example
        if self.default is not None and finite:
            return str(self.default)
        if self.min is not None and not self.min_exclusive:
            return str(self.min)
        if self.max is not None and not self.max_exclusive:
            return str(self.max)
        return "1"
