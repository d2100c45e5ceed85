"""From a run's execution options to its executor: checked before the model loads, opened at first use.

:func:`check_execution` refuses, in one line and before any work, what cannot run: ``--workers`` or
``--ray-address`` without ``--executor ray``, a cluster address nobody answers at, ``--executor ray`` with
the nnsight backend (:data:`RAY_WITH_NNSIGHT`). :func:`open_executor` makes the executor once the model is
loaded (a Ray worker loads what the run loaded), and refuses Ray for a model loaded on nnsight too.

>>> check_execution({"executor": "serial", "workers": None, "ray_address": None})
>>> try:
...     check_execution({"executor": "serial", "workers": 2, "ray_address": None})
... except MechkitError as err:
...     print(err)
--workers applies to --executor ray — add --executor ray, or leave out --workers
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError
from mechkit.options.execution import INSTALL_RAY, ray_installed
from mechkit.options.option import OptionError

if TYPE_CHECKING:
    from mechkit.executors.base import Executor
    from mechkit.model.handle import ModelHandle

CONNECT_TIMEOUT_S = 5.0
# Ray fans units out over model copies that workers load and hook natively; on nnsight the work runs as
# traces instead, grouped into one job per batch group remotely (mechkit.heads.traced_effects), and a
# remote model's workers would each be one more NDIF client. Refused rather than silently run serially.
RAY_WITH_NNSIGHT = ("--executor ray fans work out over local model copies; with --backend nnsight the work "
                    "already runs as nnsight traces (remote: one job per batch group)", "drop --executor ray")
NO_CLUSTER_FIX = ("start one with `ray start --head`, pass its HOST:PORT, or leave out --ray-address to run a "
                  "local one")


def check_execution(params: dict[str, Any], backend: str | None = "native", remote: str | None = None) -> None:
    """Refuse impossible execution options in one line (exit 2), before the model loads.

    A plugin without the options (no ``executor`` key) passes untouched.

    >>> try:
    ...     check_execution({"executor": "ray", "workers": None, "ray_address": None}, "nnsight")
    ... except MechkitError as err:
    ...     print(err)
    --executor ray fans work out over local model copies; with --backend nnsight the work already runs as nnsight traces (remote: one job per batch group) — drop --executor ray
    """
    kind = params.get("executor")
    if kind is None:
        return
    if kind == "ray" and (backend == "nnsight" or remote):
        raise OptionError(*RAY_WITH_NNSIGHT)
    if kind != "ray":
        for name, flag in (("workers", "--workers"), ("ray_address", "--ray-address")):
            if params.get(name) is not None:
                raise OptionError(f"{flag} applies to --executor ray", f"add --executor ray, or leave out {flag}")
        return
    if not ray_installed():
        raise OptionError("--executor 'ray': Ray is not installed", INSTALL_RAY)
    if params.get("ray_address"):
        check_reachable(params["ray_address"])


def check_reachable(address: str) -> None:
    """One line unless a Ray head answers at ``address`` (``auto``: the cluster this machine knows of)."""
    target = address
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            target = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError):
            target = None
        if target is None:
            raise MechkitError("--ray-address auto found no running Ray cluster", NO_CLUSTER_FIX)
    host, _, port = target.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        why = err.strerror or type(err).__name__.replace("TimeoutError", "timed out")
        at = f" ({target})" if target != address else ""
        raise MechkitError(f"--ray-address {address}{at} is unreachable: {why.lower()}", NO_CLUSTER_FIX) from None


def open_executor(params: dict[str, Any], handle: ModelHandle, console=None) -> Executor:
    """The executor the options ask for, on ``handle`` (serial) or on workers loading the same model (ray)."""
    from mechkit.executors.base import SerialExecutor

    if params.get("executor", "serial") != "ray":
        return SerialExecutor(handle)
    if handle is not None and getattr(handle.backend, "traced", False):  # a handle loaded on nnsight
        raise OptionError(*RAY_WITH_NNSIGHT)
    from mechkit.executors.load import LoadSpec
    from mechkit.executors.ray_pool import RayExecutor

    return RayExecutor(LoadSpec.of(handle), workers=params.get("workers"), address=params.get("ray_address"),
                       console=console)
