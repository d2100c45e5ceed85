"""The seeds' simple tasks (Table 4.2, letters A-H) plus ``country-capital`` and ``lowercase``.

Each task is a sampler ``rng -> Example`` wrapped with its id and a one-line description. Input forms
follow the seeds: ``apple -> APPLE``, ``bell ford -> ford bell``, ``twenty @ eleven -> thirty-one``,
``pay -> paid``, ``above -> below``, ``435 -> 436``, ``15 @ 6 -> 3``, ``12 # 5 -> 18``. ``lowercase``
(``APPLE -> apple``, ``Apple -> apple``) is capitalize's contradictory partner for task arithmetic. Operators are
written with spaces around them (``12 # 5``) as in the seeds' slides and code, so numbers tokenize the
same way in simple and composite prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mechkit.tasks.icl import icl_prompts
from mechkit.tasks.number_words import MAX_NUMBER_WORD, number_to_words
from mechkit.tasks.prompt import Example, Prompt, Sampler, check_counts, resolve_setting
from mechkit.tasks.words import ANTONYMS, COUNTRY_CAPITALS, OBJECT_NOUNS, VERB_PAST

# Ranges. Plus-one: 1..1000 as in the seeds (§9.1.1). Two-sum: operands and sum within one..one
# hundred, so every answer is in the number-word list. Modular: dividend 10..100, divisor 2..20, so
# the divisor is always smaller and remainders are not trivially the dividend (the seeds' example is
# 15 @ 6). Two-sum-plus-one: operands 1..100.
PLUS_ONE_RANGE = (1, 1000)
MODULAR_DIVIDEND = (10, 100)
MODULAR_DIVISOR = (2, 20)
TWO_SUM_PLUS_ONE_RANGE = (1, 100)


def two_sum_operands(rng: random.Random) -> tuple[int, int]:
    """Uniform over pairs ``a, b >= 1`` with ``a + b <= 100``."""
    while True:
        a, b = rng.randint(1, MAX_NUMBER_WORD - 1), rng.randint(1, MAX_NUMBER_WORD - 1)
        if a + b <= MAX_NUMBER_WORD:
            return a, b


def capitalize(rng: random.Random) -> Example:
    word = rng.choice(OBJECT_NOUNS)
    return Example(word, word.upper())


def lowercase(rng: random.Random) -> Example:
    """An upper-case or title-case noun back to lower case: the opposite direction of ``capitalize``."""
    word = rng.choice(OBJECT_NOUNS)
    return Example(word.upper() if rng.random() < 0.5 else word.capitalize(), word)


def swap(rng: random.Random) -> Example:
    a, b = rng.sample(OBJECT_NOUNS, 2)
    return Example(f"{a} {b}", f"{b} {a}")


def two_sum(rng: random.Random) -> Example:
    a, b = two_sum_operands(rng)
    return Example(f"{number_to_words(a)} @ {number_to_words(b)}", number_to_words(a + b))


def past_tense(rng: random.Random) -> Example:
    verb, past = rng.choice(VERB_PAST)
    return Example(verb, past)


def opposite(rng: random.Random) -> Example:
    word, opp = rng.choice(ANTONYMS)
    return Example(word, opp)


def plus_one(rng: random.Random) -> Example:
    n = rng.randint(*PLUS_ONE_RANGE)
    return Example(str(n), str(n + 1))


def modular_operands(rng: random.Random) -> tuple[int, int]:
    """Dividend 10..100 and a divisor 2..20 that is smaller than it."""
    a = rng.randint(*MODULAR_DIVIDEND)
    return a, rng.randint(MODULAR_DIVISOR[0], min(MODULAR_DIVISOR[1], a - 1))


def modular(rng: random.Random) -> Example:
    a, b = modular_operands(rng)
    return Example(f"{a} @ {b}", str(a % b))


def two_sum_plus_one(rng: random.Random) -> Example:
    a, b = rng.randint(*TWO_SUM_PLUS_ONE_RANGE), rng.randint(*TWO_SUM_PLUS_ONE_RANGE)
    return Example(f"{a} # {b}", str(a + b + 1))


def country_capital(rng: random.Random) -> Example:
    country, capital = rng.choice(COUNTRY_CAPITALS)
    return Example(country, capital)


@dataclass(frozen=True)
class SimpleTask:
    """One simple task: ``sample(rng)`` draws an example, ``prompts(...)`` builds ICL prompts."""

    id: str
    letter: str | None
    name: str
    description: str
    example: str
    sampler: Sampler = field(repr=False, compare=False)
    settings: tuple[str, ...] = ("simple",)
    kind: str = "simple"
    default_shots: int = 10

    def sample(self, rng: random.Random) -> Example:
        return self.sampler(rng)

    def prompts(self, n: int = 30, shots: int | None = None, seed: int = 0,
                setting: str | None = None) -> list[Prompt]:
        setting = resolve_setting(self.id, setting, self.settings)
        shots = self.default_shots if shots is None else shots
        check_counts(n, shots)
        return icl_prompts(task_id=self.id, setting=setting, n=n, shots=shots, seed=seed,
                           stream=self.id, query_sampler=self.sampler, demo_samplers=(self.sampler,))


SIMPLE_TASKS: dict[str, SimpleTask] = {
    t.id: t
    for t in (
        SimpleTask("capitalize", "A", "Capitalization", "upper-case an object noun",
                   "apple -> APPLE", capitalize),
        SimpleTask("swap", "B", "Swap", "swap two object nouns", "bell ford -> ford bell", swap),
        SimpleTask("two-sum", "C", "Two Sum", "add two number words (sum <= one-hundred)",
                   "twenty @ eleven -> thirty-one", two_sum),
        SimpleTask("past-tense", "D", "Past Tense", "simple past of a verb", "pay -> paid",
                   past_tense),
        SimpleTask("opposite", "E", "Opposite", "antonym of a word", "above -> below", opposite),
        SimpleTask("plus-one", "F", "Plus One", "add one to a number in 1..1000", "435 -> 436",
                   plus_one),
        SimpleTask("modular", "G", "Modular", "a @ b is a mod b", "15 @ 6 -> 3", modular),
        SimpleTask("two-sum-plus-one", "H", "Two Sum Plus One", "a # b is a + b + 1",
                   "12 # 5 -> 18", two_sum_plus_one),
        SimpleTask("country-capital", None, "Country Capital", "capital city of a country",
                   "France -> Paris", country_capital),
        SimpleTask("lowercase", None, "Lowercase", "lower-case an upper- or title-case object noun",
                   "APPLE -> apple", lowercase),
    )
}
