"""``--executor``, ``--ray-address`` and ``--workers``: where a plugin's independent units run.

A plugin whose work splits into independent units (the exact sweep's layers, ablation baselines,
a λ grid, a layer scan) adds :data:`EXECUTION` to its options and submits its units through
``ctx.map_units``; everything else about it stays the same. The three are ``execution`` options: the
report records them, the resume key leaves them out (a run stopped under Ray resumes serially, and
the other way round), and the results never depend on them.

>>> [o.flag for o in EXECUTION]
['--executor', '--ray-address', '--workers']
>>> RayAddress()("10.0.0.5:6379"), RayAddress()("auto")
('10.0.0.5:6379', 'auto')
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from mechkit.model.headspec import whole_number_text
from mechkit.options.option import Option, OptionError

INSTALL_RAY = "install it with pip install 'mechkit[ray]'"


@dataclass(frozen=True)
class ExecutorChoice:
    """``serial`` or ``ray``; ``ray`` only where Ray is installed (checked without importing it)."""

    metavar: str = "[serial|ray]"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> str:
        if text == "ray" and not ray_installed():
            raise OptionError("Ray is not installed", INSTALL_RAY)
        return text


def ray_installed() -> bool:
    """Whether ``import ray`` can work, without paying for it (``--help`` and bad input stay fast)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


@dataclass(frozen=True)
class RayAddress:
    """``auto`` (the cluster this machine runs, or ``RAY_ADDRESS``) or ``[ray://]HOST:PORT``.

    Only the syntax is checked here; whether the cluster answers is checked before the model loads
    (:func:`mechkit.executors.check_execution`).

    >>> try:
    ...     RayAddress()("head-node")
    ... except OptionError as err:
    ...     print(err)
    'head-node' is not auto or HOST:PORT — use auto or the head node's HOST:PORT, e.g. 10.0.0.5:6379
    """

    metavar: str = "auto|HOST:PORT"
    fix: str = "use auto or the head node's HOST:PORT, e.g. 10.0.0.5:6379"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> str:
        text = str(text).strip()
        if text == "auto":
            return text
        host, sep, port = text.removeprefix("ray://").rpartition(":")
        if not sep or not host or not whole_number_text(port):  # ASCII digits: int("²") raised
            raise OptionError(f"{text!r} is not auto or HOST:PORT", self.fix)
        if not 0 < int(port) < 65536:
            raise OptionError(f"port {port} is out of range", self.fix)
        return text


EXECUTION = (
    Option("executor", str, "serial", "Where the independent units run: serial (this process) or ray "
                                      "(actors that each load the model once).",
           choices=("serial", "ray"), parse=ExecutorChoice(), execution=True),
    Option("ray_address", str, None, "With --executor ray: the cluster to join, auto or HOST:PORT (default: "
                                     "start a local one).", parse=RayAddress(), execution=True),
    Option("workers", int, None, "With --executor ray: actors, each holding the model (default: one per GPU, "
                                 "else as many as the cluster's CPUs hold at the run's torch threads each).",
           min=1, execution=True),
)
"""The execution options, for a plugin's ``options``: ``options = (..., *EXECUTION)``."""
