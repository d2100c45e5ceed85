"""User-facing errors: one line that names the problem and the fix.

The CLI turns every :class:`MechkitError` into that single line on stderr and exit code 2,
so a researcher never has to read a traceback to learn that a head index is out of range.
"""

from __future__ import annotations


class MechkitError(Exception):
    """A problem the user can fix. ``str(err)`` is the one line the CLI prints."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(one_line(f"{problem} — {fix}" if fix else problem))


def one_line(text: str) -> str:
    """``text`` with its line breaks and other control characters written as escapes: a value quoted raw (a
    path or task id holding a newline) split a refusal over two lines, the second looking like another message.
    Only those are escaped (Unicode's control, line and paragraph separator categories): any other character,
    a no-break space in a path included, is shown as it is, so a path a fix names can be copied.

    >>> print(one_line("unknown task 'a" + chr(10) + "b'"))
    unknown task 'a\\nb'
    """
    import unicodedata

    if text.isprintable():
        return text
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)


class ModelLoadError(MechkitError):
    """The model spec does not resolve to a loadable model."""


class UnsupportedArchitectureError(MechkitError):
    """The model's module tree lacks the parts mechkit needs (named in the message)."""


class HeadSpecError(MechkitError, ValueError):
    """A ``--heads`` spec is malformed or names a head outside the model."""


class UnknownTaskError(MechkitError, ValueError):
    """A task id is not in the task registry."""


class PluginError(MechkitError):
    """A plugin is unknown, failed to import, or was given bad options."""


class ReportExistsError(MechkitError):
    """The output directory already holds a report and ``--force`` was not given."""


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (or its type's name), cut to ``limit`` characters:
    what a one-line error may quote of a library's multi-line message."""
    text = str(err).strip().splitlines()
    return text[0][:limit] if text else type(err).__name__


def single_use(func):
    """``contextlib.contextmanager`` for the API's contexts (``mk.hooks``, ``mk.edit_weights``…), whose second
    ``with`` of one object is one :class:`MechkitError` line: contextlib raised ``AttributeError: ... has no
    attribute 'args'``, a traceback from inside the standard library.

    >>> @single_use
    ... def ctx():
    ...     yield 1
    >>> c = ctx()
    >>> with c as value:
    ...     value
    1
    >>> try:
    ...     with c:
    ...         pass
    ... except MechkitError as err:
    ...     print(err)
    this ctx(...) context was entered already; a context can be entered once — call ctx(...) again for a new one
    """
    import contextlib
    import functools

    factory = contextlib.contextmanager(func)

    @functools.wraps(func)
    def make(*args, **kwargs):
        return _Once(lambda: factory(*args, **kwargs), func.__name__)

    return make


class _Once:
    """One entry of a context; as a decorator (``@mk.enable_grad()``), a fresh one for each call."""

    def __init__(self, make, name: str) -> None:
        self._make, self._name, self._entered = make, name, False
        self._inner = make()

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with _Once(self._make, self._name):
                return fn(*args, **kwargs)

        return wrapped

    def __enter__(self):
        if self._entered:
            raise MechkitError(f"this {self._name}(...) context was entered already; a context can be entered once",
                               f"call {self._name}(...) again for a new one")
        self._entered = True
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)
