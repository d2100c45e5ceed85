"""The target and its candidate pool, checked before any model loads.

The default pool is every task with text prompts except the target and the composites built from it
(``past-tense+plus-one`` for ``past-tense``): a composite holds the target's own examples, so it
would be selected for the wrong reason. ``repeat-tokens`` has no text prompts and is never a candidate.

>>> default_pool("past-tense")[:4]
['capitalize', 'swap', 'two-sum', 'opposite']
>>> "swap+past-tense" in default_pool("past-tense")
False
"""

from __future__ import annotations

from collections.abc import Sequence

from mechkit.errors import MechkitError

NO_TEXT = ("repeat-tokens",)  # token-level: no input/output prompts to embed or train on


def parts(task: str) -> tuple[str, ...]:
    """A task's components (a simple task is its own)."""
    from mechkit.tasks import get_task

    return tuple(getattr(get_task(task), "components", None) or (get_task(task).id,))


def default_pool(target: str) -> list[str]:
    """Every text task but the target and the composites that contain it."""
    from mechkit.tasks import get_task, list_tasks

    target = get_task(target).id
    return [t for t in list_tasks() if t != target and t not in NO_TEXT
            and not (len(parts(t)) > 1 and target in parts(t))]


def resolve_pool(target: str, pool: Sequence[str] | None) -> list[str]:
    """The candidates for ``target``: ``pool`` as given (checked), or :func:`default_pool`.

    One line for the target among the candidates, a token-level task, or an empty pool.
    """
    from mechkit.tasks import get_task

    target = get_task(target).id
    if target in NO_TEXT:
        raise MechkitError(f"--target {target} has no text prompts to embed", "choose a task with input/output prompts")
    if not pool:
        if pool is not None:
            raise MechkitError("the candidate pool is empty", "pass candidate task ids with --pool, or leave it out")
        return default_pool(target)
    ids = [get_task(t).id for t in pool]
    if target in ids:
        raise MechkitError(f"the target {target} is among the candidates", f"drop {target} from --pool")
    token = [t for t in ids if t in NO_TEXT]
    if token:
        raise MechkitError(f"{token[0]} has no text prompts to embed or train on", f"drop {token[0]} from --pool")
    return list(dict.fromkeys(ids))


__all__ = ["NO_TEXT", "default_pool", "parts", "resolve_pool"]
