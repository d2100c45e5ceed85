"""A normal run prints mechkit's output and nothing from the libraries under it.

transformers, accelerate, peft, nnsight and tqdm each talk while a model loads and runs: progress bars
("Loading weights", "Converting and de-quantizing GGUF tensors"), deprecation warnings about their own
future APIs, and advisory log lines. None of it is about the user's result, and in a log file it buries
mechkit's own lines. :func:`quiet` turns that off for the code inside it and puts everything back on
exit; ``MECHKIT_VERBOSE=1`` (the CLI's ``--verbose``) leaves it all on.

What can mean a result is wrong still shows: ``UserWarning`` and ``RuntimeWarning`` (a NaN, a dtype
cast), every log record at ERROR, and transformers' load report when it lists weights that were
*missing* from the checkpoint and so initialised at random.

>>> import warnings
>>> with quiet(), warnings.catch_warnings(record=True) as seen:
...     warnings.simplefilter("default", UserWarning)
...     warnings.warn("a library's future API", FutureWarning)
...     warnings.warn("a value the user should see", UserWarning)
>>> [str(w.message) for w in seen] if not is_verbose() else ["a value the user should see"]
['a value the user should see']
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

ENV = "MECHKIT_VERBOSE"
NOISY_LOGGERS = ("transformers", "accelerate", "peft", "nnsight", "torch", "huggingface_hub", "datasets", "ray",
                 "transformer_lens", "filelock", "urllib3", "httpx")
NOISY_WARNINGS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
LOAD_REPORT = "transformers.utils.loading_report"  # logs missing (randomly initialised) weights: kept


def is_verbose() -> bool:
    """Whether third-party output is wanted (``MECHKIT_VERBOSE`` set to anything but ``""`` or ``0``)."""
    return os.environ.get(ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    """Turn verbose output on or off for this process and the processes it starts (Ray workers)."""
    if on:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Third-party progress bars, deprecation warnings and log lines below ERROR off inside; restored after."""
    if is_verbose():
        yield
        return
    with warnings.catch_warnings():
        for category in NOISY_WARNINGS:
            warnings.filterwarnings("ignore", category=category)
        # tqdm.auto's import in a notebook without ipywidgets: mechkit's own progress is plain text there
        warnings.filterwarnings("ignore", message="IProgress not found")
        with _loggers_quiet(), _tqdm_off():
            yield


class _MissingWeightsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "MISSING" in record.getMessage()


@contextlib.contextmanager
def _loggers_quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    report, keep = logging.getLogger(LOAD_REPORT), _MissingWeightsOnly()
    report_level = report.level
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        report.setLevel(logging.WARNING)
        report.addFilter(keep)
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        report.setLevel(report_level)
        report.removeFilter(keep)


@contextlib.contextmanager
def _tqdm_off() -> Iterator[None]:
    """Every tqdm bar created inside is disabled: transformers' own switch covers only the bars it makes
    through its logging module, not its GGUF reader's nor other libraries' ``tqdm.auto`` bars."""
    try:
        from tqdm import std
    except ImportError:  # no tqdm installed: nothing draws its bars
        yield
        return
    original = std.tqdm.__dict__["__init__"]  # a function, or a partialmethod where TQDM_* is set

    def disabled(self, *args, **kwargs):
        kwargs["disable"] = True
        original.__get__(self, type(self))(*args, **kwargs)

    std.tqdm.__init__ = disabled
    try:
        yield
    finally:
        std.tqdm.__init__ = original


def quietly(fn):
    """``fn`` run inside :func:`quiet` (for entry points: loading a model, running a plugin)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with quiet():
            return fn(*args, **kwargs)

    return wrapper
