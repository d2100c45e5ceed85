"""Shuffled-label ICL prompts: the demonstrations' outputs permuted among the demonstrations.

Todd et al. (2024) measure a head's causal indirect effect on such prompts: the context still
*looks* like the task (same inputs, same kind of outputs) but its input→output mapping is broken,
so a head that carries the task restores the right answer when its clean activation is patched in.
The query and its answer are those of the clean prompt built with the same arguments, so clean and
shuffled prompts can be compared pair by pair.
"""

from __future__ import annotations

import random

from mechkit.errors import MechkitError
from mechkit.tasks.prompt import Prompt, stream_rng
from mechkit.tasks.registry import build_prompts

_INPUT, _OUTPUT = "input: ", "output: "


def split_demos(text: str) -> tuple[list[tuple[str, str]], str]:
    """Split ``input: X\\noutput: Y\\n``… ``input: Q\\noutput:`` into demo pairs and the query block."""
    lines = text.split("\n")
    query = "\n".join(lines[-2:])
    pairs = []
    for x, y in zip(lines[:-2:2], lines[1:-2:2], strict=True):
        if not (x.startswith(_INPUT) and y.startswith(_OUTPUT)):
            raise ValueError(f"not an input:/output: demonstration: {x!r} / {y!r}")
        pairs.append((x[len(_INPUT):], y[len(_OUTPUT):]))
    return pairs, query


def _derangement(n: int, rng: random.Random) -> list[int]:
    """A permutation moving every index (where n > 1), so no demonstration keeps its own output."""
    order = list(range(n))
    if n < 2:
        return order
    while True:
        rng.shuffle(order)
        if all(i != j for i, j in enumerate(order)):
            return order


def shuffle_labels(prompt: Prompt, rng: random.Random) -> Prompt:
    """The same prompt with its demonstrations' outputs permuted (a derangement); query unchanged.

    Raises :class:`MechkitError` when the prompt has fewer than 2 ``input:/output:`` demonstrations
    (there is nothing to permute, so a "shuffled" prompt would be the clean one).
    """
    try:
        pairs, query = split_demos(prompt.text)
    except ValueError:
        pairs, query = [], ""
    if len(pairs) < 2:
        raise MechkitError(f"task {prompt.task!r} prompts have {len(pairs)} input:/output: demonstrations, "
                           "too few to shuffle labels",
                           "use 2 or more shots (--shots 2) and a task with input:/output: demonstrations (not ioi)")
    order = _derangement(len(pairs), rng)
    demos = "".join(f"{_INPUT}{x}\n{_OUTPUT}{pairs[j][1]}\n" for (x, _), j in zip(pairs, order, strict=True))
    return Prompt(text=demos + query, answer=prompt.answer, task=prompt.task, setting="shuffled-labels",
                  query=prompt.query, target=prompt.target, accepted=prompt.accepted,
                  distractor=prompt.distractor, terminator=prompt.terminator)


def shuffled_label_prompts(task: str, n: int, shots: int, seed: int, setting: str | None = None) -> list[Prompt]:
    """``build_prompts(task, n, shots, seed, setting)`` with every prompt's demo labels shuffled.

    >>> p = shuffled_label_prompts("capitalize", n=1, shots=3, seed=0)[0]
    >>> p.text.endswith("output:"), p.setting
    (True, 'shuffled-labels')
    """
    rng = stream_rng(seed, task, "shuffled-labels")
    return [shuffle_labels(p, rng) for p in build_prompts(task, n=n, shots=shots, seed=seed, setting=setting)]
