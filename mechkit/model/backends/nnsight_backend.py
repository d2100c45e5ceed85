"""The nnsight backend: every forward is one nnsight trace, in this process or as jobs sent to a server.

mechkit's hook functions (:mod:`mechkit.hooking`) become operations inside that trace. With ``remote``
each *job* — one trace, or several grouped into one ``model.session`` (:meth:`NnsightBackend.run_group`:
a sweep's traces; :meth:`NnsightBackend.call`: a step reading weights,
:mod:`mechkit.model.backends.weight_reads`) — is serialised and run where the model is, by a
:class:`~mechkit.model.backends.base.Server` (:mod:`mechkit.model.backends.remotes` names them):

- ``remote="ndif"`` ships it to an NDIF server (``NDIF_API_KEY``; the model must be a hub id the
  server hosts). The client holds only the model's structure (meta weights).
- ``remote="local"`` runs a strict offline simulation of that path (:mod:`mechkit.model.backends.simulation`):
  the job is serialised exactly as for the server, then deserialised and executed with ``mechkit`` (and
  every other package a server lacks) unimportable, on the local model. A run that passes here ships
  everything it needs by value.

Remote, every job's lifecycle (queued, running, completed; what it printed; what the server says it
cost) goes to the backend's :class:`~mechkit.model.backends.jobs.JobLog`, which the runner shows live and
puts in the report.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mechkit.model.backends.base import Backend, nnsight_model, serves
from mechkit.model.backends.jobs import JobLog
from mechkit.model.backends.remotes import server_for
from mechkit.model.compat import cache_in, pop_cache, set_cache

if TYPE_CHECKING:
    import torch
    from torch import nn

# Import roots an NDIF server has (its environment), so they are never shipped by value.
SERVER_PACKAGES = frozenset({"torch", "numpy", "transformers", "accelerate", "diffusers", "einops", "peft",
                             "nnsight", "safetensors", "tokenizers", "huggingface_hub"})


class Trace:
    """One forward of a group (:meth:`NnsightBackend.run_group`): its inputs and forward options, the
    plan it runs (:mod:`mechkit.hooking.traced`), whether it takes gradients, and how many stacked copies
    of the batch it runs (made where it runs, so the request carries the batch once). A plain class, not
    a dataclass: it is shipped by value, and NDIF refuses ``dataclasses`` (:mod:`mechkit.model.backends.whitelist`)."""

    def __init__(self, input_ids: torch.Tensor, plan: Any = None, kwargs: dict | None = None, grad: bool = False,
                 repeat: int = 1) -> None:
        self.input_ids, self.plan, self.kwargs = input_ids, plan, dict(kwargs or {})
        self.grad, self.repeat = grad, repeat

    def inputs(self) -> tuple[torch.Tensor, dict]:
        """The ids and forward options as the forward takes them (the batch and its mask repeated)."""
        if self.repeat == 1:
            return self.input_ids, self.kwargs
        kwargs = dict(self.kwargs)
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = kwargs["attention_mask"].repeat(self.repeat, 1)
        return self.input_ids.repeat(self.repeat, 1), kwargs


def _run_traces(lm: Any, traces: list[Trace], announce: bool, save: Callable) -> list[tuple[dict, Any]]:
    """Run ``traces`` one after the other: ``(store, output)`` of each, what its plan kept and finished.

    The body of a grouped job: on a remote backend it runs *on the server*, inside one session, so it is
    plain code shipped by value. ``announce`` prints one line per finished trace; a server streams a
    job's prints back as its progress. ``save`` is nnsight's (passed in: the server refuses ``import
    nnsight`` inside a request, :mod:`mechkit.model.backends.whitelist`).
    """
    import torch

    found = []
    for i, t in enumerate(traces):
        input_ids, kwargs = t.inputs()
        with torch.set_grad_enabled(t.grad):  # noqa: SIM117 - nnsight captures its own `with` block
            with lm.trace(input_ids, **kwargs):
                store = {}
                if t.plan is not None:
                    t.plan.run(lm, store)
                output = lm.output
                if t.plan is not None:
                    output = t.plan.finish(output, store)
                store = save(store)
                output = save(output)
        found.append((store, output))
        if announce:
            print(f"trace {i + 1}/{len(traces)} done")
    return found


class Prefix:
    """Stands for the KV cache of ``ids`` on a remote model (:meth:`NnsightBackend.forward`)."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self.ids, self.mask = ids, mask

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """As a transformers cache answers it."""
        return int(self.ids.shape[1])


class NnsightBackend(Backend):
    """Every forward is one nnsight trace over ``lm`` (an nnsight ``TransformersModel``).

    :mod:`mechkit.hooking` keeps the active hook functions in :attr:`entries` and sets :attr:`planner`,
    which turns them into the plan a trace runs; :meth:`run` executes one trace with a plan,
    :meth:`run_group` several traces as one job, :meth:`call` any function of the model where it is.
    Remote, every job's lifecycle goes to :attr:`log` (:class:`~mechkit.model.backends.jobs.JobLog`).
    """

    name = "nnsight"
    traced = True

    def __init__(self, lm: Any, remote: str | None = None, model_key: str | None = None) -> None:
        self.lm = lm
        self.remote = remote
        self.server = server_for(remote)
        self.model_key = model_key
        self.entries: list = []
        self.planner: Callable[[list], Any] | None = None
        self.serves = serves("nnsight", remote)
        self.traces = 0
        self.log = JobLog(remote) if remote else None
        self.job_key: str | None = None  # the NDIF model key jobs name (nnsight's, asked of the hub once)
        # Traces a caller groups into one job: remote, as many as a sweep holds (a job is a round trip and
        # a place in the server's queue); in process one, so progress and finished steps come per trace.
        self.traces_per_job = JOB_TRACES if remote else 1

    def describe(self) -> str:
        return "nnsight" + (f" --remote {self.remote}" if self.remote else " (local)")

    def info(self) -> dict:
        out: dict = {"name": self.name, "remote": self.remote, "traces": self.traces}
        if self.model_key:
            out["model_key"] = self.model_key
        if self.log is not None:
            out["server"] = self.log.summary()
        return out

    def forward(self, input_ids: torch.Tensor, **kwargs) -> Any:
        """The model output of one forward under the active hook functions (one trace). Remote, a KV cache
        never travels: ``use_cache=True`` returns a :class:`Prefix` as its cache (:mod:`mechkit.model.compat`), and a forward
        given one runs the prefix again with the new ids (:meth:`_continued`)."""
        plan = self.planner(self.entries) if self.planner is not None and self.entries else None
        if self.remote and (kwargs.get("use_cache") or isinstance(cache_in(kwargs), Prefix)):
            return self._continued(input_ids, plan, **kwargs)
        return self.run(input_ids, plan, **kwargs)

    def _continued(self, input_ids: torch.Tensor, plan: Any, **kwargs) -> Any:
        """One decoding step on a remote model: the whole sequence (prefix and ``input_ids``) in one trace,
        the logits of the new positions back. A cache would go to the server and back with every step,
        and it names transformers' cache classes, which NDIF's whitelist refuses (:mod:`mechkit.model.backends.whitelist`).
        Hook functions see the whole sequence at every step, as in a forward without a cache: the same
        for position-wise edits and edits at fixed positions, not for a function that tells decoding
        steps by their length."""
        import torch

        prefix = pop_cache(kwargs)
        kwargs["use_cache"] = False
        mask = kwargs.get("attention_mask")
        ids = input_ids
        if prefix is not None:
            ids = torch.cat([prefix.ids.to(input_ids.device), input_ids], dim=1)
            if mask is not None or prefix.mask is not None:
                before = prefix.mask if prefix.mask is not None else torch.ones_like(prefix.ids)
                after = mask if mask is not None else torch.ones_like(input_ids)
                kwargs["attention_mask"] = mask = torch.cat([before.to(after.device), after], dim=1)
        output = self.run(ids, plan, **kwargs)
        if prefix is not None and getattr(output, "logits", None) is not None:
            output.logits = output.logits[:, -input_ids.shape[1]:]
        set_cache(output, Prefix(ids, mask))
        return output

    def run(self, input_ids: torch.Tensor, plan: Any = None, **kwargs) -> Any:
        """One trace (remote: one job). Inside it ``plan.run(model, store)`` reads and writes activations
        as the forward reaches them and ``plan.finish(output, store)`` picks what comes back; then
        ``plan.after(store, output)`` runs here. Returns the model output, or what ``after`` returns."""
        from nnsight import save  # the block names nnsight's save only, never the nnsight package

        lm = self.lm
        options = self._job_options(plan, traces=1)
        with self._shipping(plan), self._server_errors():  # noqa: SIM117 - nnsight captures its own `with` block
            with lm.trace(input_ids, **kwargs, **options):
                store = {}
                if plan is not None:
                    plan.run(lm, store)
                output = lm.output
                if plan is not None:
                    output = plan.finish(output, store)
                store = save(store)
                output = save(output)
        self.traces += 1
        return plan.after(store, output) if plan is not None else output

    def run_group(self, traces: list[Trace]) -> list[Any]:
        """Several traces as one job: remote, one ``model.session`` holding a trace per item (one request,
        one place in the queue, one reply); in process, the same traces one after the other. Each item's
        result is what :meth:`run` returns for it."""
        from nnsight import save

        found = self.call(_run_traces, traces, self.remote is not None, save, traces=len(traces))
        self.traces += len(traces)
        return [t.plan.after(store, output) if t.plan is not None else output
                for t, (store, output) in zip(traces, found, strict=True)]

    def call(self, fn: Callable, *args: Any, traces: int = 0) -> Any:
        """``fn(model, *args)`` where the model is, ``model`` being the nnsight model (its ``_module`` the
        HF model): in process here; remote, as one job (a session) on the server, ``fn`` and ``args``
        shipped by value and only its result sent back."""
        if not self.remote:
            return fn(self.lm, *args)
        from nnsight import save

        lm = self.lm
        options = self._job_options((fn, args), traces=traces)
        with self._shipping((fn, args)), self._server_errors():  # noqa: SIM117 - nnsight captures its own `with` block
            with lm.session(**options):
                result = fn(lm, *args)
                result = save(result)
        return result

    def _roots(self, shipped: Any) -> set[str]:
        """Top-level packages whose code ``shipped`` carries and a server lacks: shipped by value."""
        roots = {"mechkit"}
        for module in _modules(shipped):
            root = module.split(".")[0]
            if root and root not in SERVER_PACKAGES and root not in sys.stdlib_module_names and root != "__main__":
                roots.add(root)
        return roots

    def _job_options(self, shipped: Any, traces: int) -> dict:
        """The ``backend=`` of one remote job (a trace or a session), reporting to :attr:`log`."""
        if self.server is None:
            return {}
        return {"backend": self.server.job_backend(self, self._roots(shipped), traces)}

    def _server_errors(self) -> contextlib.AbstractContextManager:
        """The server's failures as one line while a job runs (nothing to translate in process)."""
        return self.server.errors() if self.server is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _shipping(self, shipped: Any) -> Iterator[None]:
        """While a remote job serialises: mechkit (and plugin packages) pickled by value, not by name."""
        if not self.remote:
            yield
            return
        import cloudpickle

        registered = []
        try:
            for root in sorted(self._roots(shipped)):
                module = sys.modules.get(root)
                if module is not None and root not in cloudpickle.list_registry_pickle_by_value():
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
            yield
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


JOB_TRACES = 256  # at most this many traces in one remote job; a sweep's chunk (see mechkit.heads.traced_effects)


def _modules(shipped: Any) -> set[str]:
    """The Python modules whose code ``shipped`` (plans, traces, functions, and containers of them) carries."""
    if shipped is None:
        return set()
    if isinstance(shipped, (list, tuple)):
        return set().union(*(_modules(x) for x in shipped)) if shipped else set()
    if isinstance(shipped, Trace):
        return _modules(shipped.plan)
    if hasattr(shipped, "modules") and callable(shipped.modules) and not isinstance(shipped, type):
        with contextlib.suppress(TypeError):
            return set(shipped.modules())
    if callable(shipped):
        return {getattr(shipped, "__module__", None) or ""}
    return set()


def wrap(model: nn.Module, tokenizer: Any, remote: str | None = None) -> NnsightBackend:
    """An nnsight backend over a model already in memory (its forward gets nnsight's inert controller).

    nnsight gets its own copy of the tokenizer: it switches a causal model's to left padding, where
    mechkit's batches are right-padded with explicit masks.
    """
    import copy

    lm = nnsight_model(model, copy.deepcopy(tokenizer) if tokenizer is not None else None)
    return NnsightBackend(lm, remote)
