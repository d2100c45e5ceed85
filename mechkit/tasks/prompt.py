"""The data types every task produces, the prompt format, and the seeded random streams.

**contract — prompt format.** A demonstration is ``input: X\\noutput: Y\\n``; the query is
``input: Q\\noutput:``. The model must continue with ``" " + Y`` (the answer keeps its leading space,
because that is how the tokenizer sees the word after ``output:``); a scorer appends
:attr:`Prompt.terminator` (``"\\n"``) itself, so ``answer`` never contains it.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mechkit.errors import MechkitError


class TaskOptionError(MechkitError, ValueError):
    """A task was asked for something it cannot give (bad ``n``/``shots``/setting, token-level task)."""


@dataclass(frozen=True)
class Example:
    """One input/output pair of a task.

    ``alternatives`` holds other outputs that are also correct (only the modular + two-sum-plus-one
    composite has any: the seeds count both orders of operations as right).
    """

    input: str
    output: str
    alternatives: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """A ready-to-score prompt.

    ``text``        what the model reads (demonstrations then the query).
    ``answer``      what it must produce next, with the leading space (``" APPLE"``).
    ``task``        the task id this prompt tests (for a composite's ``simple`` setting: the component).
    ``setting``     ``simple``, ``composite``, ``composite-in-context``, or a task's own setting.
    ``query``       the query input ``Q``; ``target`` is ``answer`` without the leading space.
    ``accepted``    every answer that counts as correct, each with its leading space.
    ``distractor``  a competing answer for logit-difference metrics (IOI's subject name), else None.
    ``terminator``  what a scorer appends after the answer: ``"\\n"`` for ``input:/output:`` prompts,
                    ``""`` where the answer is a word inside a sentence (IOI).
    """

    text: str
    answer: str
    task: str
    setting: str
    query: str
    target: str
    accepted: tuple[str, ...] = ()
    distractor: str | None = None
    terminator: str = "\n"

    def __post_init__(self) -> None:
        if not self.accepted:
            object.__setattr__(self, "accepted", (self.answer,))


Sampler = Callable[[random.Random], Example]


def format_demo(example: Example) -> str:
    """``input: X\\noutput: Y\\n`` — one demonstration."""
    return f"input: {example.input}\noutput: {example.output}\n"


def format_query(query_input: str) -> str:
    """``input: Q\\noutput:`` — the query, left open for the model."""
    return f"input: {query_input}\noutput:"


def stream_rng(seed: int, *keys: str) -> random.Random:
    """A ``random.Random`` for one named stream of one seed.

    The offset is a CRC32 of the keys (task id, purpose…): stable across processes and Python
    versions, unlike ``hash()``, so the same seed always gives the same prompts, and different tasks
    or purposes never share a stream.
    """
    offset = zlib.crc32("\x1f".join(keys).encode("utf-8"))
    return random.Random(int(seed) * 1_000_003 + offset)


def content_words(text: str) -> set[str]:
    """The words of an input with the composite markers stripped (``(* bell * ford)`` -> bell, ford)."""
    return {w for w in (tok.strip("*()#@") for tok in text.split()) if w}


def draw(sampler: Sampler, rng: random.Random, avoid_inputs: Iterable[str] = (),
         avoid_words: Iterable[str] = (), tries: int = 200) -> Example:
    """Sample until the input is new and shares no content word with ``avoid_words``.

    Falls back to "input is new" and then to anything if the task's input space is too small, so a
    tiny word list degrades to repeats instead of looping forever.
    """
    avoid_inputs = set(avoid_inputs)
    avoid_words = set(avoid_words)
    fallback: Example | None = None
    for _ in range(tries):
        ex = sampler(rng)
        if ex.input in avoid_inputs:
            continue
        if not (content_words(ex.input) & avoid_words):
            return ex
        fallback = fallback or ex
    return fallback if fallback is not None else sampler(rng)


MAX_PROMPTS = 100_000  # per task and setting: past this a typo, not a study
MAX_SHOTS = 2048  # many-shot ICL studies go to ~2k demonstrations; beyond that a typo, not a study


def check_counts(n: int, shots: int) -> None:
    """Reject counts a prompt builder cannot honour, with a one-line fix — before any prompt is built
    (a runaway ``shots`` would take minutes to build and then overflow any context)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TaskOptionError(f"n must be a positive integer, got {n!r}", "pass n=1 or more")
    if n > MAX_PROMPTS:
        raise TaskOptionError(f"n={n} prompts per task is more than any analysis here needs",
                              f"pass at most {MAX_PROMPTS}")
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise TaskOptionError(f"shots must be a non-negative integer, got {shots!r}",
                              "pass shots=0 for zero-shot prompts, or more")
    if shots > MAX_SHOTS:
        raise TaskOptionError(f"shots={shots} is more demonstrations than any model's context holds",
                              f"pass at most {MAX_SHOTS}")


def resolve_setting(task_id: str, setting: str | None, settings: Sequence[str]) -> str:
    """``None`` -> the task's default (its first setting); an unknown setting -> a clear error."""
    if setting is None:
        return settings[0]
    if setting not in settings:
        hint = ""
        if setting in ("composite", "composite-in-context"):
            hint = "; composite settings need a composite task id such as capitalize+swap"
        raise TaskOptionError(
            f"setting '{setting}' is not valid for task '{task_id}'",
            f"use one of: {', '.join(settings)}{hint}",
        )
    return setting
