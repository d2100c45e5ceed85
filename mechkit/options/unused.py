"""Options a run would silently ignore, refused before the model loads.

An option whose value only matters in another mode (``--method`` beside ``--load-vector``, which takes the
vector's own method; ``--from`` beside heads named one by one; ``--n-contexts`` of the vector treatment under
``--treatment scale``) ran without a word: the user read a report made without the setting they asked for.
A value equal to the option's default cannot be told from one left out, so only a value that differs from
it is refused.

>>> from mechkit.options import Option, OptionError
>>> class Demo:
...     options = (Option("top_k", int, 10, min=1),)
>>> try:
...     refuse_ignored(Demo, {"top_k": 3}, ["top_k"], "ranks heads, and heads= names each head")
... except OptionError as err:
...     print(err)
--top-k ranks heads, and heads= names each head, so it would be ignored — drop --top-k
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mechkit.options.option import Option, OptionError

DROP_IT = re.compile(r"\bdrop it\b(?![\w-])")  # a fix's "drop it": the refused option, with the others given beside it


def default_value(option: Option) -> Any:
    """The option's default as its parser returns it (what ``ctx.options`` holds when it is left out)."""
    return option.check(option.default)[1]


def given(cls: Any, parsed: dict[str, Any], name: str) -> bool:
    """Whether option ``name`` holds a value other than its default (so the user asked for it)."""
    option = next(o for o in cls.options if o.name == name)
    return parsed.get(name) != default_value(option)


def given_flag(option: Option, value: Any) -> str:
    """The flag as the user typed it: ``--no-debias`` for an on-by-default flag turned off (the line said
    ``--debias`` and "drop --debias", a flag the user never passed)."""
    if option.is_flag and value is False and option.default:
        return f"--no-{option.flag[2:]}"
    return option.flag


def listed(flags: list[str]) -> str:
    """``--a``, ``--a and --b``, ``--a, --b and --c``."""
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + f" and {flags[-1]}"


def refuse_ignored(cls: Any, parsed: dict[str, Any], names: Iterable[str], why: str, fix: str | None = None) -> None:
    """Refuse the first of ``names`` given a value other than its default: ``why`` says in words why the run
    would not read it; ``fix`` defaults to dropping the option. The others of ``names`` given too are named
    beside it, and a fix that drops it drops them all (``--executor ray --workers 2`` under ``--method
    attribution`` was told "drop it" for --executor, and the rerun was then refused for --workers)."""
    flags = {o.name: given_flag(o, parsed.get(o.name)) for o in cls.options}
    named = [flags[name] for name in names if given(cls, parsed, name)]
    if not named:
        return
    first, others = named[0], named[1:]
    fix = fix or f"drop {first}"
    if others:
        every = f"drop {listed(named)}"
        fix = DROP_IT.sub(every, fix, count=1) if DROP_IT.search(fix) else fix.replace(f"drop {first}", every, 1)
    also = f" (and so would {listed(others)})" if others else ""
    raise OptionError(f"{first} {why}, so it would be ignored{also}", fix)


def refuse_head_options(cls: Any, parsed: dict[str, Any], ranked_only: Iterable[str], scoring: Iterable[str]) -> None:
    """The head options ``parsed["heads"]`` (a parsed ``--heads``) does not read, refused: ``ranked_only``
    (--top-k, --sweep) where every head is named, --from and ``scoring`` (the options that score heads here)
    where no head is ranked by a score, and ``scoring`` where --from's report gives the scores."""
    selection = parsed["heads"]
    spec = f"--heads {selection}"
    if not selection.ranked:
        refuse_ignored(cls, parsed, ranked_only, f"picks among ranked or random heads, and {spec} names each head",
                       "drop it, or ask for ranked heads (--heads induction, --heads random)")
    if not selection.needs_scores:
        refuse_ignored(cls, parsed, ("from_report", *scoring), f"scores heads to rank them, and {spec} ranks none "
                       "by a score", "drop it, or ask for score-ranked heads (--heads induction)")
    elif parsed["from_report"] is not None:
        refuse_ignored(cls, parsed, scoring, "sets how heads are scored here, and --from reads the scores of the "
                       "detect report", "drop it, or drop --from to score the heads now")

