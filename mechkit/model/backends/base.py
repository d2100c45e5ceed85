"""The seam every backend sits behind: what a backend is, what it can do, and the native one.

A backend decides where a model's forwards run. ``native`` is PyTorch hooks on the local HuggingFace model
(:data:`NATIVE`, here). ``nnsight`` runs every forward as one nnsight trace
(:mod:`mechkit.model.backends.nnsight_backend`), in this process or, with ``remote``, as jobs sent to a
:class:`Server`: NDIF (:mod:`mechkit.model.backends.ndif`) or its strict offline simulation
(:mod:`mechkit.model.backends.simulation`). Each lives in its own file and imports only this one (and
the support modules beside it: :mod:`~mechkit.model.backends.jobs`, :mod:`~mechkit.model.backends.whitelist`);
:mod:`mechkit.model.backends.remotes` names the servers.

What a backend can do is a set of *needs* plugins declare (:attr:`mechkit.plugin.Plugin.needs`); the
runner refuses an impossible pairing before any work (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mechkit.errors import MechkitError

BACKENDS = ("native", "nnsight")

# need -> how a refusal names it
NEEDS = {
    "weight_writes": "weight writes",
    "gradients": "gradients",
    "patterns": "attention patterns",
    "generation": "generation",
    "module_calls": "partial forwards (calling the model's blocks one by one)",
    # reading weights in the client's process; steps that go through
    # mechkit.model.backends.weight_reads.read_weights run where the weights are and need nothing
    "weight_reads": "reading weights here",
}


class BackendError(MechkitError):
    """A backend, a remote or a pairing of plugin and backend that cannot work."""


def check_backend(name: str | None) -> str:
    """The backend name, checked: one line naming the choices for anything else.

    >>> check_backend("nnsight")
    'nnsight'
    >>> check_backend("jax")
    Traceback (most recent call last):
    ...
    mechkit.model.backends.base.BackendError: unknown backend 'jax' — use --backend native or --backend nnsight
    """
    name = "native" if name is None else name
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}", "use --backend native or --backend nnsight")
    return name


def serves(backend: str, remote: str | None) -> frozenset[str]:
    """The needs a backend serves: native all; nnsight all but partial forwards (the trace runs whole
    forwards), and remotely no weight writes or reads here either (the weights are the server's)."""
    if backend == "native":
        return frozenset(NEEDS)
    return frozenset({"gradients", "patterns", "generation"} | (set() if remote else {"weight_writes", "weight_reads"}))


def refusal(needs: frozenset[str] | set[str], backend: str, remote: str | None, plugin: str) -> str | None:
    """The one line refusing ``plugin`` on a backend (``None`` when the backend serves every need).

    >>> print(refusal({"weight_writes"}, "nnsight", "ndif", "prune"))
    plugin 'prune' needs weight writes, which the nnsight --remote ndif backend cannot do (the weights live on the server) — run it with --backend native on a local model
    """
    missing = sorted(n for n in needs if n not in serves(backend, remote))
    if not missing:
        return None
    what = ", ".join(NEEDS.get(n, n) for n in missing)
    where = backend + (f" --remote {remote}" if remote else "")
    why = " (the weights live on the server)" if {"weight_writes", "weight_reads"} & set(missing) and remote else ""
    return (f"plugin {plugin!r} needs {what}, which the {where} backend cannot do{why} — "
            f"run it with --backend native on a local model")


class Backend:
    """What runs a model's forwards; the native one is plain PyTorch hooks (the model's own modules)."""

    name = "native"
    remote: str | None = None
    traced = False
    serves: frozenset[str] = frozenset(NEEDS)

    def describe(self) -> str:
        return self.name

    def info(self) -> dict:
        return {"name": self.name}


NATIVE = Backend()


class Server:
    """Where an nnsight backend's remote jobs run: each kind of server is one file filling in these two.

    ``runner`` is the :class:`~mechkit.model.backends.nnsight_backend.NnsightBackend` sending the job
    (its nnsight model ``lm``, its job ``log``), ``roots`` the top-level packages the job ships by value.
    """

    name = ""

    def job_backend(self, runner: Any, roots: set[str], traces: int) -> Any:
        """The nnsight backend (``trace(..., backend=)``) one job of ``traces`` traces goes through."""
        raise NotImplementedError

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """While a job runs: this server's failures as one line (none by default)."""
        yield


def nnsight_model(model_or_id: Any, tokenizer: Any = None, **kwargs) -> Any:
    """nnsight's ``TransformersModel`` of ``model_or_id`` (one line where nnsight is missing): the model
    every nnsight-based backend runs, around a HF model in memory or, for a server, a hub id."""
    import warnings

    try:
        from nnsight.modeling.transformers import TransformersModel
    except ImportError as err:
        raise BackendError("the nnsight backend needs the nnsight package",
                           "pip install 'mechkit[interop]' (or pip install 'nnsight>=0.8')") from err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tokenizer is not None:
            return TransformersModel(model_or_id, tokenizer=tokenizer, task="text-generation", **kwargs)
        return TransformersModel(model_or_id, task="text-generation", **kwargs)


def handle_backend(handle: Any, backend: str | None, remote: str | None) -> str:
    """The backend a loaded handle runs on: its own. ``backend=`` left out means that one (an nnsight handle was
    refused under the default ``"native"``, with a fix that loaded it again as it already was); another
    backend, or any ``remote=``, is refused naming what to do instead."""
    own = handle.backend.name
    if remote not in (None, False, ""):
        raise BackendError(f"a loaded handle runs where it was loaded (backend {own!r}, "
                           f"remote {handle.backend.remote!r}); remote={remote!r} cannot move it",
                           "drop remote=, or pass the model's name instead of the handle: "
                           f"mk.load_model(name, backend='nnsight', remote={remote!r})")
    if backend is not None and check_backend(backend) != own:
        raise BackendError(f"a loaded handle keeps the backend it was loaded with ({own!r}), not {backend!r}",
                           f"drop backend= (the handle runs on {own!r}), or load the model again with "
                           f"mk.load_model(name, backend={backend!r})")
    return own
