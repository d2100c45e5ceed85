"""Task ids -> task objects, and the one-call prompt builder.

**contract — task ids.** Simple: ``capitalize`` (A), ``swap`` (B), ``two-sum`` (C), ``past-tense`` (D),
``opposite`` (E), ``plus-one`` (F), ``modular`` (G), ``two-sum-plus-one`` (H), ``country-capital``,
``lowercase`` (capitalize's contradictory partner for task arithmetic). Composites join two simple ids with ``+`` in either order (``swap+capitalize`` is
``capitalize+swap``). The logical tasks ``negation``, ``conjunction``, ``disjunction`` and their
composites (:mod:`mechkit.tasks.logic`), also in either order (``conjunction+negation`` is
``negation+conjunction``). Plus ``fuzzy-copy``, ``ioi`` and ``repeat-tokens``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from mechkit.errors import UnknownTaskError
from mechkit.tasks.composite import COMPOSITES, CompositeTask
from mechkit.tasks.fuzzy_copy import FuzzyCopyTask
from mechkit.tasks.ioi import IOITask
from mechkit.tasks.logic import LOGIC_COMPOSITES, LOGIC_SIMPLE, LOGIC_TASKS
from mechkit.tasks.prompt import Prompt, TaskOptionError
from mechkit.tasks.repeat_tokens import RepeatTokensTask
from mechkit.tasks.simple import SIMPLE_TASKS, SimpleTask

Task = SimpleTask | CompositeTask | FuzzyCopyTask | IOITask | RepeatTokensTask

_OTHER: dict[str, Task] = {
    t.id: t for t in (FuzzyCopyTask(), IOITask(), RepeatTokensTask())
}
_ALL: dict[str, Task] = {**SIMPLE_TASKS, **COMPOSITES, **LOGIC_TASKS, **_OTHER}
_LISTS_THEM = "`mechkit tasks` lists every task id"
# What a composite id may join, and every composite by its unordered pair of components.
_COMPONENTS: dict[str, SimpleTask] = {**SIMPLE_TASKS, **LOGIC_SIMPLE}
_BY_PARTS: dict[frozenset[str], CompositeTask] = {
    frozenset(t.components): t for t in (*COMPOSITES.values(), *LOGIC_COMPOSITES.values())}


def list_tasks(kind: str | None = None) -> list[str]:
    """Every task id (simple, composite, then fuzzy-copy, ioi, repeat-tokens), or those of one kind.

    Kinds: ``simple``, ``composite``, ``logic``, ``logic-composite``, ``copy``, ``ioi``, ``tokens``.
    """
    kinds = sorted({task.kind for task in _ALL.values()})
    if kind is not None and kind not in kinds:  # a typo would list nothing, as if there were no such tasks
        raise UnknownTaskError(f"unknown task kind {kind!r}", f"use one of: {', '.join(kinds)}, or no kind for all")
    return [tid for tid, task in _ALL.items() if kind is None or task.kind == kind]


def _normalize(task_id: str) -> str:
    return "+".join(part.strip() for part in str(task_id).strip().lower().split("+"))


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


def get_task(task_id: str) -> Task:
    """The task object for an id; composites (suite and logical) are found in either order of their parts.

    Raises :class:`UnknownTaskError` naming the id, with close matches and where to list them.

    >>> get_task("swap+capitalize").id, get_task("disjunction + conjunction").id
    ('capitalize+swap', 'conjunction+disjunction')
    """
    key = _normalize(task_id)
    if key in _ALL:
        return _ALL[key]
    if not key:
        raise UnknownTaskError("empty task id", f"name a task such as capitalize; {_LISTS_THEM}")
    if "+" in key:
        parts = key.split("+")
        for part in parts:
            if part not in _COMPONENTS:
                raise UnknownTaskError(
                    f"unknown task '{task_id}': '{part}' is not a simple task",
                    f"{_did_you_mean(part, _COMPONENTS)}composites join two of: "
                    f"{', '.join(t.id for t in SIMPLE_TASKS.values() if t.letter)}, or two of: "
                    f"{', '.join(LOGIC_SIMPLE)}; {_LISTS_THEM}",
                )
        found = _BY_PARTS.get(frozenset(parts)) if len(parts) == 2 else None
        if found is not None:
            return found
        raise UnknownTaskError(
            f"composite task '{task_id}' is not supported",
            f"supported composites: {', '.join(t.id for t in _BY_PARTS.values())}; {_LISTS_THEM}",
        )
    raise UnknownTaskError(f"unknown task '{task_id}'", f"{_did_you_mean(key, _ALL)}{_LISTS_THEM}")


def parse_tasks(spec: str | Iterable[str]) -> list[str]:
    """``"capitalize, swap+capitalize"`` -> ``["capitalize", "capitalize+swap"]``.

    Splits on commas, strips whitespace, validates each id (raising :class:`UnknownTaskError`),
    returns canonical ids without duplicates, in the order given.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    ids = [get_task(item).id for item in (str(i).strip() for i in items) if item]
    if not ids:
        raise UnknownTaskError("no task ids given", f"pass ids separated by commas; {_LISTS_THEM}")
    return list(dict.fromkeys(ids))


def build_prompts(task_id: str, n: int = 30, shots: int | None = None, seed: int = 0,
                  setting: str | None = None) -> list[Prompt]:
    """Deterministic prompts for one task.

    ``shots=None`` takes the task's default: 10 demonstrations for the ICL suite (the seeds' K=10),
    0 for ``fuzzy-copy`` (Song et al.'s setting); ``ioi`` ignores it. ``shots=0`` gives zero-shot
    prompts. ``setting=None`` is the task's default: ``simple`` for simple tasks, ``composite`` for
    composites (whose ``simple`` setting returns ``n`` prompts per component, component order).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TaskOptionError(f"seed must be a whole number of at least 0, got {seed!r}", "pass seed=0, say")
    return get_task(task_id).prompts(n=n, shots=shots, seed=seed, setting=setting)
