"""A plugin's options and a run's seed resolved and checked together, before any model loads.

The runner calls these first, so a bad value is one line and nothing has been loaded or written.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from mechkit.errors import PluginError
from mechkit.model.headspec import checked_seed, whole_number_text
from mechkit.options.option import BOOL_WORDS, Option, OptionError, is_bool, scalar, show

if TYPE_CHECKING:
    from mechkit.plugin import Plugin


def resolve_options(cls: type[Plugin], options: dict[str, Any],
                    seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, parsed)`` for every option of the plugin, checked before any model loads.

    Each value (given, else the default) is coerced to the option's declared type (text from the
    command line and numbers from Python alike), checked against its bounds and choices, and run
    through its parser, then the plugin's :meth:`~mechkit.plugin.Plugin.check_options` sees them
    together. ``params`` keeps the values as given (typed): what the report records and
    what reruns it; ``parsed`` holds the parsers' results (``ctx.options``). Unknown options and bad
    values raise :class:`~mechkit.options.OptionError` (a ``PluginError``) with one line.

    Given the run's ``seed`` (checked: :func:`check_seed`), a plugin's ``check_seeded(parsed, seed)``, where it
    has one, runs too: a check of what the options and the seed draw on text alone (``adapt``'s held-out
    prompts, which ``--n 1 --shots 0`` can leave empty at one seed and not at another) is then said before the
    model loads rather than after.
    """
    known = {o.name: o for o in cls.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise PluginError(f"plugin {cls.name!r} has no option {', '.join(unknown)}",
                          f"its options are: {', '.join(known) or 'none'}")
    params, parsed = {}, {}
    for name, opt in known.items():
        refuse_none(opt, options)
        params[name], parsed[name] = opt.check(options.get(name, opt.default))
        refuse_unstorable(opt, params[name])
    cls.check_options(parsed)
    seeded = getattr(cls, "check_seeded", None)
    if seed is not None and callable(seeded):
        seeded(parsed, seed)
    return params, parsed


def refuse_unstorable(opt: Option, value: Any) -> None:
    """Refuse (one line, before the model loads) an option value the report cannot record (``n=10**400``): it was
    refused only when the report was built, after the work, with a fix meant for plugin authors."""
    from mechkit.report.schema import UnstorableError, to_jsonable

    try:
        to_jsonable(value, "keep")
    except UnstorableError as err:
        why = err.problem.removeprefix("the report value ")
        raise OptionError(f"{opt.flag} cannot be recorded in the report: its value {why}",
                          f"pass {opt.flag} {opt.value_hint()}") from None


def refuse_none(opt: Option, options: dict[str, Any]) -> None:
    """``None`` given for an option that has a value by default and no "none" value: it raised TypeError or
    AttributeError in the option checks (``heads=None``, ``target=None``), or passed them and failed mid-run.
    (``Option.check(None)`` itself stays the "not given" of an option, as before.)"""
    if opt.name in options and options[opt.name] is None and opt.default is not None and not opt.required:
        raise OptionError(f"{opt.flag} None: it takes {opt.display_metavar()}, not None",
                          f"pass {opt.flag} {opt.value_hint()}, or leave it out (default: {show(opt.default)})")


def resolve_params(cls: type[Plugin], options: dict[str, Any]) -> dict[str, Any]:
    """Every option of the plugin with its checked value: given, else the default; unknown ones rejected."""
    return resolve_options(cls, options)[0]


def check_switches(**switches: Any) -> dict[str, bool]:
    """``mk.run``'s on/off arguments (``force``, ``write``) as plain bools: True or False (NumPy's
    ``np.True_`` and a 0-d bool array too), else one line. ``write="no"`` is a true string, and wrote the
    report it meant to skip; the fix names the value the text or number seems to mean (``"no"`` ->
    ``write=False``, ``"yes"`` -> ``write=True``), or both where it means neither.

    >>> import numpy as np
    >>> check_switches(force=False, write=np.True_)
    {'force': False, 'write': True}
    >>> try:
    ...     check_switches(force=False, write="no")
    ... except PluginError as err:
    ...     print(err)
    write must be True or False, not 'no' — pass write=False
    """
    checked = {}
    for name, value in switches.items():
        item = scalar(value)
        if is_bool(item):
            checked[name] = bool(item)
            continue
        meant = BOOL_WORDS.get(item.strip().lower()) if isinstance(item, str) else \
            bool(item) if isinstance(item, numbers.Integral) and int(item) in (0, 1) else None
        fix = f"pass {name}={meant}" if meant is not None else f"pass {name}=True or {name}=False"
        raise PluginError(f"{name} must be True or False, not {value!r}", fix)
    return checked


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``0..2**63-1``, else one :class:`PluginError` line — before any model loads.

    >>> check_seed(7)
    7
    >>> try:
    ...     check_seed(10**30)
    ... except PluginError as err:
    ...     print(err)
    seed 1000000000000000000000000000000 is out of range — pass a whole number from 0 to 9223372036854775807
    """
    if whole_number_text(seed.strip() if isinstance(seed, str) else None):
        seed = int(seed)  # ASCII digits only: '²'.isdigit() is true, and int('²') raised ValueError
    return checked_seed(seed, error=PluginError)


def check_backend_for(cls: type[Plugin], backend: str | None, remote: str | None, model: Any) -> tuple[str, str | None]:
    """``(backend, remote)`` checked (names, the model spec, an API key) and the plugin's needs served."""
    from mechkit.model.backends.base import BackendError, check_backend, handle_backend, refusal
    from mechkit.model.backends.remotes import check_remote
    from mechkit.model.handle import ModelHandle

    if isinstance(model, ModelHandle):  # it runs where it was loaded: backend= may only repeat that
        backend = handle_backend(model, backend, remote)
        remote = None
    else:
        backend = check_backend(backend)
        remote = check_remote(remote, backend, model) if cls.needs_model else None
    loaded = getattr(getattr(model, "backend", None), "remote", None)  # a loaded handle runs where it was loaded
    line = refusal(getattr(cls, "needs", frozenset()), backend, remote or loaded, cls.name)
    if line is not None:
        raise BackendError(line)
    return backend, remote
