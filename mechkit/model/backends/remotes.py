"""The servers an nnsight backend can send its jobs to, by the name ``--remote`` takes, and that option's check.

One row per server, each in its own file: ``ndif`` (:mod:`mechkit.model.backends.ndif`) and ``local``,
its strict offline simulation (:mod:`mechkit.model.backends.simulation`). The nnsight backend asks this
table for its server, so it never imports a server's file itself, and no server file imports it.
"""

from __future__ import annotations

from typing import Any

from mechkit.model.backends.base import BackendError, Server
from mechkit.model.backends.ndif import NdifServer, api_key
from mechkit.model.backends.simulation import SimulatedServer

SERVERS: dict[str, type[Server]] = {"local": SimulatedServer, "ndif": NdifServer}
REMOTES = tuple(SERVERS)


def server_for(remote: str | None) -> Server | None:
    """The server jobs go to for ``--remote remote`` (None: in this process).

    >>> server_for("local").name, server_for(None)
    ('local', None)
    """
    if remote is None:
        return None
    if remote not in SERVERS:
        raise BackendError(f"unknown remote {remote!r}",
                           "use --remote ndif (an NDIF server) or --remote local (its offline simulation)")
    return SERVERS[remote]()


def check_remote(remote: str | bool | None, backend: str, spec: Any) -> str | None:
    """``None``, ``"local"`` or ``"ndif"``, checked against the backend and the model spec before anything loads.

    A remote model is named, never shipped: a hub id (``ndif``), or for the local simulation also
    mechkit's built-in models (``tiny:FAMILY``, ``toy:induction``, the embedded aliases), which stand
    for a hosted model there. A local directory, a ``.gguf`` file or a model object cannot be remote.
    """
    if remote in (None, False, ""):
        return None
    remote = "ndif" if remote is True else remote
    if remote not in REMOTES:
        raise BackendError(f"unknown remote {remote!r}",
                           "use --remote ndif (an NDIF server) or --remote local (its offline simulation)")
    if backend != "nnsight":
        raise BackendError(f"--remote {remote} needs the nnsight backend", "add --backend nnsight")
    if not isinstance(spec, str):
        raise BackendError(f"a model object ({type(spec).__name__}) cannot run remotely: the server loads models "
                           "by name", "pass a hub id such as meta-llama/Llama-3.1-8B, or drop --remote")
    from pathlib import Path

    path = Path(spec).expanduser()
    builtin = spec.startswith(("tiny:", "toy:")) or spec in ("llama", "smollm2")
    if path.suffix == ".gguf" or (path.exists() and not builtin):
        raise BackendError(f"{spec} is a local {'file' if path.is_file() else 'directory'}: a remote server cannot "
                           "read it", "pass the hub id of a model the server hosts, or drop --remote")
    if remote == "ndif" and builtin:
        raise BackendError(f"{spec} is a mechkit built-in model, not hosted on NDIF",
                           "pass the hub id of a model NDIF hosts, or use --remote local to simulate")
    if remote == "ndif" and not api_key():
        raise BackendError("no NDIF API key", "set NDIF_API_KEY (get one at https://login.ndif.us) or run "
                           "`python -m nnsight login`; --remote local simulates a server offline")
    return remote
