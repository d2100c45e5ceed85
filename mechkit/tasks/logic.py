"""Logical operations as ICL tasks (the seeds' proposed work, §6.2): negation, conjunction, disjunction.

The seeds propose to "analyze how different architectural components contribute to basic logical
operations (negation, conjunction, disjunction)". These tasks put each operation in the suite's
``input: X\\noutput: Y`` format, over the truth values ``true`` and ``false``, so the same
analyses (ablation sweeps, the ``compose`` plugin) can map which components carry which operation:

- ``negation`` (NOT): ``not (true false false)`` -> ``false true true`` — every value of the
  parenthesised list (1 to 4 values) is negated;
- ``conjunction`` (AND): ``true and false and true`` -> ``false`` (2 to 4 operands);
- ``disjunction`` (OR): ``false or true`` -> ``true`` (2 to 4 operands).

Their composites, built like the seeds' Table 4.3 pairs (:class:`~mechkit.tasks.CompositeTask`,
with the ``simple`` / ``composite`` / ``composite-in-context`` settings):

- ``negation+conjunction`` (NOT+AND, *by steps*): ``not (true and false)`` -> ``true`` (NAND);
- ``negation+disjunction`` (NOT+OR, *by steps*): ``not (true or false)`` -> ``false`` (NOR);
- ``conjunction+disjunction`` (AND+OR, *by parts*): ``true and false , false or true`` ->
  ``false true`` — each operator acts on its own part of the input, like the seeds' (A)+(F).

Every input is a Python boolean expression once ``true``/``false`` are capitalised (the negation
list element-wise, the by-parts composite part by part), which is how the tests check answers
independently. Single-value answers are balanced by construction — the value is drawn first, then
operands that give it — so answering a constant scores 0.5 on conjunction, disjunction, NAND and
NOR, and 0.25 on the two-value by-parts answers. The input spaces are small (30 negation lists, 28
expressions per operator); as everywhere in the suite, demonstrations avoid the query's own input.

:data:`LOGIC_TASKS` holds the six tasks (kinds ``logic`` and ``logic-composite``) for the task
registry; :data:`LOGIC_STEPS` gives, for each composite, its intermediate result and final answer
(the chain ``f(x) -> g(f(x))`` that the ``compose`` plugin's intermediate-step setting shows).

>>> import random
>>> nand = LOGIC_TASKS["negation+conjunction"].sample(random.Random(0))
>>> nand.input.startswith("not (") and nand.output in ("true", "false")
True
>>> LOGIC_STEPS["negation+conjunction"]("not (true and false)")
[('false', 'true')]
"""

from __future__ import annotations

import random
from collections.abc import Callable

from mechkit.tasks.composite import CompositeTask
from mechkit.tasks.prompt import Example
from mechkit.tasks.simple import SimpleTask

TRUTH = ("true", "false")
NEGATION_LENGTH = (1, 4)
OPERANDS = (2, 4)


def word(value: bool) -> str:
    """``True -> "true"``."""
    return "true" if value else "false"


def truth(text: str) -> bool:
    """``"true" -> True``; anything but the two truth words is an error."""
    if text not in TRUTH:
        raise ValueError(f"{text!r} is not a truth value")
    return text == "true"


def _operands(rng: random.Random, op: str, value: bool) -> list[bool]:
    """2-4 operands whose conjunction (``and``) or disjunction (``or``) is ``value``.

    The value is chosen first so answers are balanced; the operands are uniform among those that
    give it (rejection sampling over uniform assignments of a uniform length).
    """
    k = rng.randint(*OPERANDS)
    while True:
        ops = [rng.random() < 0.5 for _ in range(k)]
        if (all(ops) if op == "and" else any(ops)) == value:
            return ops


def _expression(rng: random.Random, op: str, value: bool | None = None) -> tuple[str, bool]:
    value = rng.random() < 0.5 if value is None else value
    return f" {op} ".join(word(v) for v in _operands(rng, op, value)), value


# ---- the three operations --------------------------------------------------------------------------
def negation(rng: random.Random) -> Example:
    values = [rng.random() < 0.5 for _ in range(rng.randint(*NEGATION_LENGTH))]
    return Example(f"not ({' '.join(word(v) for v in values)})", " ".join(word(not v) for v in values))


def conjunction(rng: random.Random) -> Example:
    text, value = _expression(rng, "and")
    return Example(text, word(value))


def disjunction(rng: random.Random) -> Example:
    text, value = _expression(rng, "or")
    return Example(text, word(value))


# ---- composites -------------------------------------------------------------------------------------
def _negated(op: str) -> Callable[[random.Random], Example]:
    """NAND / NOR: ``not (a and b)``; the final answer is drawn first, so it is balanced."""
    def sample(rng: random.Random) -> Example:
        final = rng.random() < 0.5
        text, _ = _expression(rng, op, not final)
        return Example(f"not ({text})", word(final))

    return sample


def conjunction_and_disjunction(rng: random.Random) -> Example:
    """``a and b , c or d`` -> both values: each operator on its own part (compose by parts)."""
    left, lv = _expression(rng, "and")
    right, rv = _expression(rng, "or")
    return Example(f"{left} , {right}", f"{word(lv)} {word(rv)}")


def _evaluate(expr: str) -> bool:
    """Value of ``a and b …`` / ``a or b …`` (one operator, as the tasks write them)."""
    words = expr.split()
    values, ops = [truth(w) for w in words[::2]], set(words[1::2])
    if len(ops) != 1 or not ops <= {"and", "or"}:
        raise ValueError(f"{expr!r} is not a one-operator expression")
    return all(values) if ops == {"and"} else any(values)


def _negated_steps(text: str) -> list[tuple[str, str]]:
    """``not (X)`` -> [(value of X, its negation)]."""
    if not (text.startswith("not (") and text.endswith(")")):
        raise ValueError(f"{text!r} is not 'not (...)'")
    inner = _evaluate(text[len("not ("):-1])
    return [(word(inner), word(not inner))]


def _parts_steps(text: str) -> list[tuple[str, str]]:
    """``a and b , c or d`` -> [("<and value> , c or d", "<and value> <or value>")]: the
    conjunction's part first, then the disjunction's."""
    left, right = text.split(" , ")
    lv = word(_evaluate(left))
    return [(f"{lv} , {right}", f"{lv} {word(_evaluate(right))}")]


LOGIC_SIMPLE: dict[str, SimpleTask] = {
    t.id: t
    for t in (
        SimpleTask("negation", "NOT", "Negation", "negate every truth value in the list",
                   "not (true false) -> false true", negation, kind="logic"),
        SimpleTask("conjunction", "AND", "Conjunction", "value of 2-4 truth values joined by 'and'",
                   "true and false -> false", conjunction, kind="logic"),
        SimpleTask("disjunction", "OR", "Disjunction", "value of 2-4 truth values joined by 'or'",
                   "false or true -> true", disjunction, kind="logic"),
    )
}

LOGIC_COMPOSITES: dict[str, CompositeTask] = {
    t.id: t
    for t in (
        CompositeTask(
            "negation+conjunction", ("negation", "conjunction"), "NOT+AND", "Negation & Conjunction",
            "steps", "'not (…)' negates, 'a and b' conjoins; 'not (a and b)' does both (NAND)",
            "not (true and false) -> true", (negation, conjunction), _negated("and"),
            kind="logic-composite"),
        CompositeTask(
            "negation+disjunction", ("negation", "disjunction"), "NOT+OR", "Negation & Disjunction",
            "steps", "'not (…)' negates, 'a or b' disjoins; 'not (a or b)' does both (NOR)",
            "not (true or false) -> false", (negation, disjunction), _negated("or"),
            kind="logic-composite"),
        CompositeTask(
            "conjunction+disjunction", ("conjunction", "disjunction"), "AND+OR",
            "Conjunction & Disjunction", "parts",
            "'a and b' and 'c or d' are evaluated; 'a and b , c or d' evaluates both parts",
            "true and false , false or true -> false true", (conjunction, disjunction),
            conjunction_and_disjunction, kind="logic-composite"),
    )
}

LOGIC_TASKS: dict[str, SimpleTask | CompositeTask] = {**LOGIC_SIMPLE, **LOGIC_COMPOSITES}

LOGIC_STEPS: dict[str, Callable[[str], list[tuple[str, str]]]] = {
    "negation+conjunction": _negated_steps,
    "negation+disjunction": _negated_steps,
    "conjunction+disjunction": _parts_steps,
}
