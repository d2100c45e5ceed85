"""A plugin of steps that stops after its first, and the kill-change-rerun each resume test is about.

A resume test changes one input between a run stopped after a kept step and its rerun, then asks whether the
step was taken or computed again. The plugin and the stop around it are the same each time; one copy keeps each
test about the input it changes.

>>> plugin = stepping("doc-two", lambda ctx: 1)
>>> plugin.name, plugin.needs_model
('doc-two', False)
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

import mechkit as mk

CALLS: list[str] = []  # the steps computed (not taken from the kept run), in order
STOP: list[bool] = []  # while it holds anything, a plugin stops after its first step


def quiet() -> Console:
    """A console whose output nobody reads."""
    return Console(file=io.StringIO(), width=400)


def stepping(name: str, *computes: Callable, options: tuple = (), check: Callable | None = None) -> type[mk.Plugin]:
    """A plugin named ``name`` running ``computes[i](ctx)`` as step ``s{i}``; results are keyed by step name.

    It raises KeyboardInterrupt after step ``s0`` while :data:`STOP` holds anything (not an option: options are
    in the resume key). ``check`` becomes its ``check_options``.
    """
    class Stepping(mk.Plugin):
        version, summary, needs_model = "0.1", "steps", False

        def run(self, ctx):
            values = {}
            for i, compute in enumerate(computes):
                values[f"s{i}"] = ctx.step(f"s{i}", lambda c=compute, i=i: CALLS.append(f"s{i}") or c(ctx))
                if STOP:
                    raise KeyboardInterrupt
            return mk.Result(results=values)

    Stepping.name, Stepping.options = name, options
    if check is not None:
        Stepping.check_options = classmethod(lambda cls, params: check(params))
    return Stepping


def stop_then_rerun(tmp_path: Path, plugin: type[mk.Plugin], change: Callable[[], object],
                    **options) -> tuple[dict, str]:
    """Run ``plugin`` into ``tmp_path/<name>`` until it stops, call ``change()``, run it again; return the rerun's
    results and what it printed. :data:`CALLS` then holds the steps computed by both runs."""
    CALLS.clear()
    STOP.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            mk.run(plugin, out=tmp_path / plugin.name, console=quiet(), **options)
    finally:
        STOP.clear()
    change()
    log = io.StringIO()
    run = mk.run(plugin, out=tmp_path / plugin.name, console=Console(file=log, width=400), **options)
    return run.report["results"], log.getvalue()
