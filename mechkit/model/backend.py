"""Where a model's forward passes run: ``native`` or ``nnsight`` (locally, simulated remote, or NDIF).

``native`` is PyTorch hooks on the local HuggingFace model. ``nnsight`` runs every forward as one
nnsight trace over the same model: mechkit's hook functions (:mod:`mechkit.hooking`) become operations
inside that trace. With ``remote`` the trace is serialised and run where the model is:

- ``remote="ndif"`` ships it to an NDIF server (``NDIF_API_KEY``; the model must be a hub id the
  server hosts). The client holds only the model's structure (meta weights).
- ``remote="local"`` runs nnsight's own local simulation of that path, made strict: the trace is
  serialised exactly as for the server, then deserialised with ``mechkit`` (and every other package a
  server lacks) unimportable, and run on the local model. A run that passes here ships everything it
  needs by value.

What a backend can do is a set of *needs* plugins declare (:attr:`mechkit.plugin.Plugin.needs`); the
runner refuses an impossible pairing before any work (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError, ModelLoadError, first_line

if TYPE_CHECKING:
    import torch
    from torch import nn

BACKENDS = ("native", "nnsight")
REMOTES = ("local", "ndif")

# need -> how a refusal names it
NEEDS = {
    "weight_writes": "weight writes",
    "gradients": "gradients",
    "patterns": "attention patterns",
    "generation": "generation",
    "module_calls": "partial forwards (calling the model's blocks one by one)",
}

# Import roots an NDIF server has (its environment), so they are never shipped by value.
SERVER_PACKAGES = frozenset({"torch", "numpy", "transformers", "accelerate", "diffusers", "einops", "peft",
                             "nnsight", "safetensors", "tokenizers", "huggingface_hub"})


class BackendError(MechkitError):
    """A backend, a remote or a pairing of plugin and backend that cannot work."""


def check_backend(name: str | None) -> str:
    """The backend name, checked: one line naming the choices for anything else.

    >>> check_backend("nnsight")
    'nnsight'
    >>> check_backend("jax")
    Traceback (most recent call last):
    ...
    mechkit.model.backend.BackendError: unknown backend 'jax' — use --backend native or --backend nnsight
    """
    name = "native" if name is None else name
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}", "use --backend native or --backend nnsight")
    return name


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


def serves(backend: str, remote: str | None) -> frozenset[str]:
    """The needs a backend serves: native all; nnsight all but partial forwards (the trace runs whole
    forwards), and remotely no weight writes either (the weights are the server's)."""
    if backend == "native":
        return frozenset(NEEDS)
    return frozenset({"gradients", "patterns", "generation"} | (set() if remote else {"weight_writes"}))


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
    why = " (the weights live on the server)" if "weight_writes" in missing and remote else ""
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


class _Unimportable(importlib.abc.MetaPathFinder):
    """Makes packages a server lacks unimportable while a simulated request deserialises."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on the server)", name=name)
        return None


def strict_simulation(lm: Any, roots: set[str]) -> Any:
    """An nnsight backend that does offline what an NDIF server does with a request, strictly.

    nnsight's own ``remote="local"`` (``LocalSimulationBackend``) checks that the request deserialises
    with non-installed modules hidden, then runs the *original* block and objects in place. This one
    goes further, as a server would: the request is serialised, deserialised and *executed* with
    ``roots`` (mechkit, plugin packages) unimportable — removed from ``sys.modules`` and blocked, since
    an installed mechkit would otherwise stay importable — on the deserialised objects; only the saved
    values come back, through a pickle round trip, into the caller's frame. So hook functions' side
    effects happen on the server's copies, exactly as remotely.
    """
    import linecache

    from nnsight.intervention.serialization import dumps, loads
    from nnsight.ndif import pull_env
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.backend import Backend as NnsightBase
    from nnsight.tracing.tracer import mark
    from nnsight.tracing.util import push

    class StrictSimulation(NnsightBase):
        def __call__(self, tracer: Any) -> None:
            pull_env()
            blob = RequestModel.serialize(tracer)
            persistent = lm._remoteable_persistent_objects()
            filename = tracer.info.frame.f_code.co_filename
            cached = linecache.cache.get(filename)
            before = _marked()
            hidden = _hide(roots)
            classes = _fresh_classes()
            try:
                server = RequestModel.deserialize(blob, persistent)
                server.execute(server.info.code)
                frame = server.info.frame
                saves = _marked() - before
                result = {k: v for k, v in frame.f_locals.items() if id(v) in saves}
                reply = dumps(result)  # what the server sends back
            finally:
                _restore_classes(classes)
                _unhide(hidden)
                if cached is not None:
                    linecache.cache[filename] = cached
                else:
                    linecache.cache.pop(filename, None)
            result = loads(reply)
            for value in result.values():
                mark(value)
            push(tracer.info.frame, result)

    return StrictSimulation()


def _marked() -> set[int]:
    from nnsight.tracing import tracer as nnsight_tracer

    return set(nnsight_tracer._saves())


def _fresh_classes() -> dict:
    """Let classes shipped by value be rebuilt as a server would rebuild them. In one process cloudpickle
    would map them back to the client's own classes and overwrite their methods with the recompiled ones."""
    from cloudpickle import cloudpickle as cp

    saved = dict(cp._DYNAMIC_CLASS_TRACKER_BY_ID)
    cp._DYNAMIC_CLASS_TRACKER_BY_ID.clear()
    return saved


def _restore_classes(saved: dict) -> None:
    from cloudpickle import cloudpickle as cp

    cp._DYNAMIC_CLASS_TRACKER_BY_ID.clear()
    cp._DYNAMIC_CLASS_TRACKER_BY_ID.update(saved)


def _hide(roots: set[str]) -> dict:
    hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] in roots}
    blocker = _Unimportable(roots)
    sys.meta_path.insert(0, blocker)
    return {"modules": hidden, "blocker": blocker}


def _unhide(hidden: dict) -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(hidden["blocker"])
    sys.modules.update(hidden["modules"])


class NnsightBackend(Backend):
    """Every forward is one nnsight trace over ``lm`` (an nnsight ``TransformersModel``).

    :mod:`mechkit.hooking` keeps the active hook functions in :attr:`entries` and sets :attr:`planner`,
    which turns them into the plan a trace runs; :meth:`run` executes one trace with a plan.
    """

    name = "nnsight"
    traced = True

    def __init__(self, lm: Any, remote: str | None = None, model_key: str | None = None) -> None:
        self.lm = lm
        self.remote = remote
        self.model_key = model_key
        self.entries: list = []
        self.planner: Callable[[list], Any] | None = None
        self.serves = serves("nnsight", remote)
        self.traces = 0
        self.server: dict[str, float] = {}

    def describe(self) -> str:
        return "nnsight" + (f" --remote {self.remote}" if self.remote else " (local)")

    def info(self) -> dict:
        out: dict = {"name": self.name, "remote": self.remote, "traces": self.traces}
        if self.model_key:
            out["model_key"] = self.model_key
        if self.server:
            out["server"] = dict(self.server)
        return out

    def forward(self, input_ids: torch.Tensor, **kwargs) -> Any:
        """The model output of one forward under the active hook functions (one trace)."""
        plan = self.planner(self.entries) if self.planner is not None and self.entries else None
        return self.run(input_ids, plan, **kwargs)

    def run(self, input_ids: torch.Tensor, plan: Any = None, **kwargs) -> Any:
        """One trace. Inside it ``plan.run(model, store)`` reads and writes activations as the forward
        reaches them and ``plan.finish(output, store)`` picks what comes back; then ``plan.after(store,
        output)`` runs here. Returns the model output, or what ``after`` returns."""
        import nnsight

        lm = self.lm
        options = self._trace_options(plan)
        with self._shipping(plan), _remote_errors(self):  # noqa: SIM117 - nnsight captures its own `with` block
            with lm.trace(input_ids, **kwargs, **options):
                store = {}
                if plan is not None:
                    plan.run(lm, store)
                output = lm.output
                if plan is not None:
                    output = plan.finish(output, store)
                store = nnsight.save(store)
                output = nnsight.save(output)
        self.traces += 1
        return plan.after(store, output) if plan is not None else output

    def _roots(self, plan: Any) -> set[str]:
        """Top-level packages whose code the plan carries and a server lacks: shipped by value."""
        roots = {"mechkit"}
        for module in getattr(plan, "modules", lambda: ())():
            root = module.split(".")[0]
            if root and root not in SERVER_PACKAGES and root not in sys.stdlib_module_names and root != "__main__":
                roots.add(root)
        return roots

    def _trace_options(self, plan: Any) -> dict:
        if self.remote == "local":
            return {"backend": strict_simulation(self.lm, self._roots(plan))}
        if self.remote == "ndif":
            return {"remote": True}
        return {}

    @contextlib.contextmanager
    def _shipping(self, plan: Any) -> Iterator[None]:
        """While a remote trace serialises: mechkit (and plugin packages) pickled by value, not by name."""
        if not self.remote:
            yield
            return
        import cloudpickle

        registered = []
        try:
            for root in sorted(self._roots(plan)):
                module = sys.modules.get(root)
                if module is not None and root not in cloudpickle.list_registry_pickle_by_value():
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
            yield
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


@contextlib.contextmanager
def _remote_errors(backend: NnsightBackend) -> Iterator[None]:
    """A failed NDIF request is one line, never a traceback (errors of mechkit's own code pass through)."""
    if backend.remote != "ndif":
        yield
        return
    try:
        yield
    except MechkitError:
        raise
    except Exception as err:
        name = type(err).__name__
        if name in ("RemoteError", "ConnectError", "ConnectionError", "TimeoutException", "HTTPStatusError",
                    "WebSocketException", "ConnectionRefusedError", "gaierror"):
            raise BackendError(f"the NDIF request failed: {first_line(err)}",
                               "check NDIF_API_KEY, the network and that the server hosts the model "
                               "(python -c 'import nnsight; print(nnsight.status())')") from err
        raise


def wrap(model: nn.Module, tokenizer: Any, remote: str | None = None) -> NnsightBackend:
    """An nnsight backend over a model already in memory (its forward gets nnsight's inert controller).

    nnsight gets its own copy of the tokenizer: it switches a causal model's to left padding, where
    mechkit's batches are right-padded with explicit masks.
    """
    import copy

    lm = _nnsight_model(model, copy.deepcopy(tokenizer) if tokenizer is not None else None)
    return NnsightBackend(lm, remote)


def _nnsight_model(model_or_id: Any, tokenizer: Any = None, **kwargs) -> Any:
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


def api_key() -> str | None:
    """The NDIF API key nnsight will send (``NDIF_API_KEY`` or nnsight's config), or None."""
    from nnsight import CONFIG

    return CONFIG.API.APIKEY or None


def connect_ndif(repo_id: str) -> tuple[Any, NnsightBackend]:
    """``(meta model, backend)`` for ``repo_id`` on NDIF: the client builds the structure (no weights).

    Refuses, with one line each: no API key, an unreachable server, a model the server does not host
    (naming what it hosts when it says).
    """
    import io
    from contextlib import redirect_stderr

    import nnsight.ndif as ndif
    from nnsight import CONFIG

    with redirect_stderr(io.StringIO()):  # nnsight prints its own "service down" message
        state = ndif.status(raw=True)
    if not state:
        raise BackendError(f"cannot reach the NDIF server at {CONFIG.API.HOST}",
                           "check your network (or NDIF_HOST); --remote local simulates a server offline")
    hosted = sorted({str(d.get("repo_id")) for d in (state.get("deployments") or {}).values()
                     if d.get("application_state") == "RUNNING"})
    if hosted and repo_id not in hosted:
        shown = ", ".join(hosted[:12]) + (" …" if len(hosted) > 12 else "")
        raise BackendError(f"NDIF does not host {repo_id} right now", f"use one it hosts: {shown}")
    try:
        lm = _nnsight_model(repo_id)
    except Exception as err:
        raise ModelLoadError(f"cannot build {repo_id} for NDIF: {first_line(err)}",
                             "the client reads the model's config from the hub: check the id and your network") from err
    backend = NnsightBackend(lm, "ndif", model_key=repo_id)
    model = lm._module
    for module in model.modules():  # the client's copy holds no weights: say so where one is read
        module.__dict__["_mechkit_remote"] = repo_id
    return model, backend


def refuse_remote_weights(module: Any) -> None:
    """One line, where a step reads a weight of a model on NDIF locally (the client has structure only)."""
    repo = module.__dict__.get("_mechkit_remote")
    if repo is not None:
        raise BackendError(f"this step reads weights of {repo}, which stay on the NDIF server (the client holds "
                           "its structure only)", "run it on a local copy of the model (without --remote)")


def client_tokenizer(backend: NnsightBackend) -> Any:
    """The tokenizer mechkit uses beside an NDIF model: nnsight's, copied, padding on the right again."""
    import copy

    tok = copy.deepcopy(backend.lm.tokenizer)
    if tok is not None:
        tok.padding_side = "right"
    return tok
