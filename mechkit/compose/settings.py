"""The prompt sets of the seeds' compositional study, one query stream shared by all of them.

The seeds (000, Ch. 4) evaluate a composite task T = k + g in four settings — each simple task,
``composite`` (demonstrations of the simple tasks, a composite query) and
``composite-in-context`` (composite demonstrations and query, the gold standard) — and define
compositional ability (Definition 4.4.1) as

    max{Acc(S_k), Acc(S_g)} ≤ Acc(S_k ∪ S_g)

where S_k is a set of N labelled examples of task k, S_g of task g, and the accuracy is that of a
*composite* query x_q given those examples in context. So the Definition compares three prompts
that ask the same composite query: demonstrations from k only, from g only, and from both.

**The mapping used here.** S_k ∪ S_g is mechkit's ``composite`` setting itself, prompt for prompt
(:func:`mechkit.build_prompts` with ``setting="composite"``: K demonstrations drawn evenly from the
two marked simple tasks, the odd one to a random task, shuffled). S_k is *that same prompt with
g's demonstrations removed* and S_g the same prompt with k's removed, each keeping the order of
what remains. Then

- the three sets share the query, the demonstrations and the order, and differ only in which
  task's examples are shown: the comparison the Definition makes, with nothing else changed;
- |S_k| + |S_g| = K, so N = K/2 for even K (K//2 and K − K//2 for odd K, as the composite setting
  splits them); Acc(S_k ∪ S_g) is the seeds' "Compose" row of Table 4.4 at K shots;
- at K = 0 all three are the zero-shot composite prompt and the test holds with equality.

Each demonstration's task is known exactly: the prompts are built by the composite's own builder
with samplers that record which of them produced each example, so the recorded prompts are
identical to ``build_prompts(..., setting="composite")`` (a test checks it).

Setting names used in reports: ``simple:<id>`` (a component alone, its marked form, as Table 4.4's
simple rows), ``composite``, ``composite-in-context``, ``only:<id>`` (S_k) and ``composite-steps``
(:mod:`mechkit.compose.stepwise`).

>>> from mechkit.compose.settings import definition_prompts
>>> sets = definition_prompts("capitalize+swap", n=2, shots=4, seed=0)
>>> sorted(sets)
['capitalize', 'swap', 'union']
>>> u, k = sets["union"][0], sets["capitalize"][0]
>>> k.query == u.query and k.text.count("input:") + sets["swap"][0].text.count("input:") == 4 + 2
True
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable

from mechkit.errors import MechkitError
from mechkit.tasks import CompositeTask, Example, Prompt, get_task, list_tasks
from mechkit.tasks.prompt import format_demo, format_query

__all__ = [
    "PARTS",
    "composite_task",
    "definition_prompts",
    "demonstrations",
    "only",
    "parse_pairs",
    "parse_parts",
    "simple",
    "study_prompts",
]

PARTS = ("study", "steps", "components", "strengthen")
"""The parts of the analysis, in the order they run (:class:`mechkit.compose.ComposeStudy`)."""
_DEMO = re.compile(r"input: ([^\n]*)\noutput: ([^\n]*)\n")


def simple(component: str) -> str:
    """Report name of a component's simple setting: ``simple:capitalize``."""
    return f"simple:{component}"


def only(component: str) -> str:
    """Report name of the Definition's S_k (demonstrations of one component only): ``only:swap``."""
    return f"only:{component}"


def composite_task(task_id: str) -> CompositeTask:
    """The composite task for an id (suite or logic), or a one-line error naming the problem."""
    task = get_task(task_id)
    if not isinstance(task, CompositeTask):
        raise MechkitError(f"'{task_id}' is not a composite task",
                           "pass composites such as capitalize+swap (`mechkit tasks` lists them)")
    return task


def parse_pairs(spec: str) -> list[str]:
    """``"capitalize+swap, suite"`` -> canonical composite ids, without duplicates, in order.

    ``suite`` stands for the seeds' seven composites, ``logic`` for the three logical ones
    (:mod:`mechkit.tasks.logic`), ``all`` for both.

    >>> parse_pairs("swap+capitalize,logic")
    ['capitalize+swap', 'negation+conjunction', 'negation+disjunction', 'conjunction+disjunction']
    """
    ids: list[str] = []
    for item in (x.strip() for x in str(spec).split(",")):
        if item in ("suite", "all"):
            ids += list_tasks("composite")
        if item in ("logic", "all"):
            ids += list_tasks("logic-composite")
        if item and item not in ("suite", "logic", "all"):
            ids.append(composite_task(item).id)
    if not ids:
        raise MechkitError("no composite tasks given", "pass ids such as capitalize+swap, or suite, logic, all")
    return list(dict.fromkeys(ids))


def parse_parts(text: str) -> tuple[str, ...]:
    """``"strengthen, study"`` -> the named parts in :data:`PARTS` order; an unknown or no part is an error.

    >>> parse_parts("strengthen, study")
    ('study', 'strengthen')
    """
    items = {x.strip() for x in str(text).split(",") if x.strip()}
    unknown = sorted(items - set(PARTS))
    if unknown or not items:
        what = f"unknown part {', '.join(map(repr, unknown))}" if unknown else "no part given"
        raise MechkitError(what, f"use some of {','.join(PARTS)}, comma-separated, like study,steps")
    return tuple(p for p in PARTS if p in items)


def demonstrations(prompt: Prompt) -> list[Example]:
    """The demonstrations of an ``input:/output:`` prompt, in order (the query is left out).

    >>> from mechkit import build_prompts
    >>> p = build_prompts("plus-one", n=1, shots=2)[0]
    >>> len(demonstrations(p))
    2
    """
    head = prompt.text[:len(prompt.text) - len(format_query(prompt.query))]
    demos = [Example(x, y) for x, y in _DEMO.findall(head)]
    if "".join(format_demo(d) for d in demos) != head or not prompt.text.endswith(format_query(prompt.query)):
        raise MechkitError(f"prompt for {prompt.task!r} is not in the input:/output: format",
                           "build it with mechkit.build_prompts")
    return demos


def _recording(sampler: Callable, index: int, seen: dict) -> Callable:
    """The sampler, also noting which component produced each example (it draws no extra randomness)."""
    def sample(rng: random.Random) -> Example:
        example = sampler(rng)
        seen.setdefault((example.input, example.output), set()).add(index)
        return example

    return sample


def definition_prompts(task_id: str, n: int, shots: int, seed: int) -> dict[str, list[Prompt]]:
    """Definition 4.4.1's three prompt sets for ``n`` composite queries.

    ``"union"``: S_k ∪ S_g, the composite setting's own prompts; ``k`` and ``g`` (component ids):
    the same prompts with the other component's demonstrations removed (settings ``only:<id>``).
    """
    task = composite_task(task_id)
    seen: dict[tuple[str, str], set[int]] = {}
    recording = tuple(_recording(s, i, seen) for i, s in enumerate(task.marked))
    union = dataclasses.replace(task, marked=recording).prompts(n=n, shots=shots, seed=seed, setting="composite")
    out: dict[str, list[Prompt]] = {"union": union, **{c: [] for c in task.components}}
    for p in union:
        owned: list[list[Example]] = [[] for _ in task.components]
        for demo in demonstrations(p):
            owners = seen.get((demo.input, demo.output), set())
            if len(owners) != 1:
                raise MechkitError(f"cannot tell which task of {task.id} wrote the demonstration {demo.input!r}",
                                   "its two marked forms must differ")
            owned[next(iter(owners))].append(demo)
        for component, demos in zip(task.components, owned, strict=True):
            text = "".join(format_demo(d) for d in demos) + format_query(p.query)
            out[component].append(dataclasses.replace(p, text=text, setting=only(component)))
    return out


def study_prompts(task_id: str, n: int, shots: int, seed: int) -> dict[str, list[Prompt]]:
    """Every setting of one (composite, K, seed) cell, by report name, all asking the same queries
    (the simple settings ask their own components' queries).

    >>> from mechkit.compose.settings import study_prompts
    >>> sorted(study_prompts("capitalize+plus-one", n=1, shots=2, seed=0))      # doctest: +NORMALIZE_WHITESPACE
    ['composite', 'composite-in-context', 'only:capitalize', 'only:plus-one',
     'simple:capitalize', 'simple:plus-one']
    """
    task = composite_task(task_id)
    sets = definition_prompts(task.id, n, shots, seed)
    out = {"composite": sets["union"],
           "composite-in-context": task.prompts(n=n, shots=shots, seed=seed, setting="composite-in-context")}
    per = task.prompts(n=n, shots=shots, seed=seed, setting="simple")  # n per component, component order
    for i, component in enumerate(task.components):
        out[simple(component)] = per[i * n:(i + 1) * n]
        out[only(component)] = sets[component]
    return out
