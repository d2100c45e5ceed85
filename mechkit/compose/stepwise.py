"""Intermediate steps: composite demonstrations that spell out ``f(x) -> g(f(x))``.

The seeds find that models fail composites built *by steps* (one rule's output is the other's
input) and ask (§6.2) how prompting that exposes the steps interacts with the components. The
``composite-steps`` setting is ``composite-in-context`` with every output written as a chain: the
intermediate result, `` -> ``, the final answer::

    input: (* bell * ford)
    output: BELL FORD -> FORD BELL

Prompts are the composite-in-context prompts themselves — the same queries, the same
demonstrations in the same order — with the intermediate added to each output, so the setting
differs from the gold standard in exactly one thing. Which step comes first follows the input's
nesting (the inner mark first: ``*`` capitalizes before ``( )`` swaps); composites by parts apply
their first component's rule to its part first (``684 cat -> 684 CAT -> 685 CAT`` is written
``684 CAT -> 685 CAT``). Where the seeds accept two orders of operations (modular + two-sum-plus-one),
both chains are accepted.

**Scoring: the final part counts.** The composite asks for g(f(x)); the chain is a means. A prompt
is correct when the text greedy decoding writes on the answer line, after its last ``->`` (all of
it if the model writes no arrow), is an accepted final answer — so accuracy is comparable with the
other settings' exact match. :func:`score_steps` also reports ``chain`` (the whole line is an
accepted chain) and ``intermediate`` (the part before the arrow is a right intermediate), which
say where a failure happens. Every prompt is decoded greedily, one cached line each: what the
model writes after a wrong token cannot be teacher-forced, and a weak model gets most chains
wrong, so a teacher-forced first pass would mostly add cost.

>>> from mechkit.compose.stepwise import chains, steps_prompts
>>> chains("capitalize+swap", "(* bell * ford)")
[('BELL FORD', 'FORD BELL')]
>>> p = steps_prompts("capitalize+swap", n=1, shots=1, seed=0)[0]
>>> " -> " in p.text.splitlines()[1] and p.answer.count(" -> ") == 1
True
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mechkit.compose.settings import composite_task
from mechkit.errors import MechkitError
from mechkit.model.compat import cache_kwargs, cache_of
from mechkit.tasks import Example, Prompt
from mechkit.tasks.logic import LOGIC_STEPS
from mechkit.tasks.number_words import WORD_TO_NUMBER, number_to_words
from mechkit.tasks.words import ANTONYMS, VERB_PAST

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

__all__ = ["ARROW", "STEPS", "StepsScore", "answer_budget", "chains", "decoded_length", "greedy_line", "score_steps", "split_chain", "steps_prompts"]

ARROW = " -> "
SETTING = "composite-steps"
_PAST, _OPPOSITE = dict(VERB_PAST), dict(ANTONYMS)


def _capitalize_swap(text: str) -> list[tuple[str, str]]:
    """``(* a * b)``: capitalize each word, then swap."""
    a, b = text.strip("()").replace("*", "").split()
    return [(f"{a.upper()} {b.upper()}", f"{b.upper()} {a.upper()}")]


def _capitalize_two_sum(text: str) -> list[tuple[str, str]]:
    """``* (x @ y)``: add the number words, then capitalize."""
    x, y = text.removeprefix("* ").strip("()").split(" @ ")
    total = number_to_words(WORD_TO_NUMBER[x] + WORD_TO_NUMBER[y])
    return [(total, total.upper())]


def _by_parts(word_rule: Callable[[str], str]) -> Callable[[str], list[tuple[str, str]]]:
    """``n w``: the word's rule (the composite's first component), then plus one on the number."""
    def steps(text: str) -> list[tuple[str, str]]:
        n, w = text.split()
        return [(f"{n} {word_rule(w)}", f"{int(n) + 1} {word_rule(w)}")]

    return steps


def _rule_then_swap(rule: dict[str, str]) -> Callable[[str], list[tuple[str, str]]]:
    """``* a b #``: the word rule on both (``*``), then swap (``#``)."""
    def steps(text: str) -> list[tuple[str, str]]:
        a, b = text.removeprefix("* ").removesuffix(" #").split()
        return [(f"{rule[a]} {rule[b]}", f"{rule[b]} {rule[a]}")]

    return steps


def _modular_two_sum_plus_one(text: str) -> list[tuple[str, str]]:
    """``a # b @ c`` / ``a @ b # c``: left to right (the canonical answer), then right to left."""
    a, op1, b, op2, c = text.split()
    a, b, c = int(a), int(b), int(c)

    def apply(op: str, x: int, y: int) -> int:
        return x + y + 1 if op == "#" else x % y

    left = apply(op1, a, b)
    right = apply(op2, b, c)
    out = [(str(left), str(apply(op2, left, c))), (str(right), str(apply(op1, a, right)))]
    return list(dict.fromkeys(out))


STEPS: dict[str, Callable[[str], list[tuple[str, str]]]] = {
    "capitalize+swap": _capitalize_swap,
    "capitalize+two-sum": _capitalize_two_sum,
    "capitalize+plus-one": _by_parts(str.upper),
    "past-tense+plus-one": _by_parts(_PAST.__getitem__),
    "swap+past-tense": _rule_then_swap(_PAST),
    "swap+opposite": _rule_then_swap(_OPPOSITE),
    "modular+two-sum-plus-one": _modular_two_sum_plus_one,
    **LOGIC_STEPS,
}
"""Composite id -> ``input -> [(intermediate, final), …]``, the canonical order first."""


def chains(task_id: str, query: str) -> list[tuple[str, str]]:
    """Every accepted (intermediate, final) pair of a composite query, canonical first."""
    task = composite_task(task_id)
    if task.id not in STEPS:
        raise MechkitError(f"no intermediate steps are defined for {task.id}",
                           f"use one of: {', '.join(STEPS)}")
    return STEPS[task.id](query)


def split_chain(text: str) -> tuple[str | None, str]:
    """``"BELL FORD -> FORD BELL"`` -> ``("BELL FORD", "FORD BELL")``; no arrow: ``(None, text)``.

    >>> split_chain(" 18 -> 4")
    ('18', '4')
    """
    mid, arrow, final = text.strip().rpartition("->")
    return (mid.strip(), final.strip()) if arrow else (None, final.strip())


def steps_prompts(task_id: str, n: int, shots: int, seed: int) -> list[Prompt]:
    """The composite-in-context prompts of ``task_id`` with every output written ``mid -> final``.

    The answer is the canonical chain; ``accepted`` holds every accepted chain.
    """
    task = composite_task(task_id)
    chains(task.id, task.sample(random.Random(0)).input)  # refuse composites without steps now

    def with_steps(rng: random.Random) -> Example:
        example = task.composite(rng)
        options = chains(task.id, example.input)
        if {final for _, final in options} != {example.output, *example.alternatives}:
            raise MechkitError(f"the steps of {task.id} do not reach its answer for {example.input!r}",
                               "report this as a bug in mechkit.compose.stepwise")
        written = [f"{mid}{ARROW}{final}" for mid, final in options]
        return Example(example.input, written[0], tuple(written[1:]))

    # Same builder, same random streams as composite-in-context (the wrapper draws nothing extra).
    prompts = dataclasses.replace(task, composite=with_steps).prompts(
        n=n, shots=shots, seed=seed, setting="composite-in-context")
    return [dataclasses.replace(p, setting=SETTING) for p in prompts]


@dataclass
class StepsScore:
    """Accuracy of the final part (the setting's accuracy), of the whole chain, and of the
    intermediate, with what greedy decoding wrote on each answer line."""

    accuracy: float
    chain: float
    intermediate: float
    correct: list[bool] = field(repr=False)
    written: list[str] = field(repr=False)

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "chain": self.chain, "intermediate": self.intermediate,
                "n": len(self.correct)}


def greedy_line(handle: ModelHandle, text: str, max_new_tokens: int) -> str:
    """What greedy decoding writes after ``text`` up to the end of the line (cached, one token a step)."""
    tok = handle.tokenizer
    ids = torch.tensor([tok(text)["input_ids"]], device=handle.device)
    written: list[int] = []
    with torch.no_grad():
        out = handle.model(input_ids=ids, use_cache=True)
        for _ in range(max_new_tokens):
            nxt = int(out.logits[0, -1].argmax())
            written.append(nxt)
            if "\n" in tok.decode(written) or nxt == tok.eos_token_id or len(written) == max_new_tokens:
                break  # the last token is not fed back: prompt + max_new_tokens - 1 positions (decoded_length)
            out = handle.model(input_ids=torch.tensor([[nxt]], device=handle.device),
                               **cache_kwargs(cache_of(out)), use_cache=True)
    return tok.decode(written).split("\n")[0]


def answer_budget(handle: ModelHandle, prompt: Prompt) -> int:
    """Tokens enough for greedy decoding to write any accepted answer and its newline, with room to spare."""
    return max(len(handle.tokenizer(a + "\n", add_special_tokens=False)["input_ids"]) for a in prompt.accepted) + 8


def decoded_length(handle: ModelHandle, prompt: Prompt) -> int:
    """The most positions :func:`greedy_line` can reach on ``prompt`` with its :func:`answer_budget`: the prompt's
    tokens and every written token but the last fed back. A context check counting the prompt alone let a
    learned position table (gpt2's) be indexed past its end mid-decoding (an IndexError)."""
    return len(handle.tokenizer(prompt.text)["input_ids"]) + answer_budget(handle, prompt) - 1


def score_steps(handle: ModelHandle, prompts: Sequence[Prompt]) -> StepsScore:
    """Score ``composite-steps`` prompts: accuracy counts the final part (see the module docstring)."""
    final_ok, chain_ok, mid_ok, written = [], [], [], []
    for p in prompts:
        line = greedy_line(handle, p.text, answer_budget(handle, p))
        options = [split_chain(a) for a in p.accepted]
        mid, final = split_chain(line)
        written.append(line)
        chain_ok.append(line.strip() in {a.strip() for a in p.accepted})
        final_ok.append(final in {f for _, f in options})
        mid_ok.append(mid is not None and mid in {m for m, _ in options})
    n = max(len(prompts), 1)
    return StepsScore(sum(final_ok) / n, sum(chain_ok) / n, sum(mid_ok) / n, final_ok, written)
