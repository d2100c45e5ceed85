"""``--remote local``: offline, what an NDIF server does with a request — strictly.

nnsight's own ``remote="local"`` (``LocalSimulationBackend``) checks that a request deserialises with
non-installed modules hidden, then runs the *original* block and objects in place, and reports nothing
(no job, no status). This simulation goes further, as a server would: the request (a trace or a whole
session) is serialised, deserialised and *executed* with ``roots`` (mechkit, plugin packages)
unimportable — removed from ``sys.modules`` and blocked, since an installed mechkit would otherwise stay
importable — on the deserialised objects; only the saved values come back, through a pickle round trip,
into the caller's frame. So hook functions' side effects happen on the server's copies, exactly as
remotely. It also holds the request to NDIF's whitelist (:mod:`mechkit.model.backends.whitelist`): unpickling
refuses any module, module object or builtin the server would refuse to import (a dataclass shipped by
value names ``dataclasses``) and any function shipped as bytecode, and shipped functions and the block
run with the server's builtins only (imports of non-whitelisted modules refused). Like NDIF it reports the job's lifecycle to a :class:`~mechkit.model.backends.jobs.JobLog` and turns
what the job prints into ``LOG`` updates (NDIF redirects a job's stdout the same way).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import sys
from typing import Any

from mechkit.model.backends.base import Server
from mechkit.model.backends.jobs import Job, JobLog
from mechkit.model.backends.whitelist import server_builtins, server_unpickler


class _Unimportable(importlib.abc.MetaPathFinder):
    """Makes packages a server lacks unimportable while a simulated request deserialises and runs."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on the server)", name=name)
        return None


class _LogLines(io.TextIOBase):
    """A job's stdout on the "server": each printed line becomes a ``LOG`` update of the job."""

    def __init__(self, log: JobLog | None, job: Job | None) -> None:
        self.log, self.job, self.pending = log, job, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if self.log is not None and self.job is not None:
                self.log.note(self.job, "LOG", line)
        return len(text)


class SimulatedServer(Server):
    """``--remote local``: each job runs on this machine as a strict NDIF server would run it
    (:func:`strict_simulation`), its lifecycle going to the runner's job log."""

    name = "local"

    def job_backend(self, runner: Any, roots: set[str], traces: int) -> Any:
        return strict_simulation(runner.lm, roots, runner.log, traces)


def strict_simulation(lm: Any, roots: set[str], log: JobLog | None = None, traces: int = 1) -> Any:
    """An nnsight backend running one request as a strict simulated server (see the module docstring);
    its lifecycle goes to ``log`` as one job of ``traces`` traces."""
    import linecache

    from nnsight.intervention.serialization import CustomCloudUnpickler, dumps, loads
    from nnsight.ndif import pull_env
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.backend import Backend as NnsightBase
    from nnsight.tracing.tracer import mark
    from nnsight.tracing.util import push

    job = log.start(traces) if log is not None else None

    def note(status: str) -> None:
        if log is not None and job is not None:
            log.note(job, status)

    class StrictSimulation(NnsightBase):
        def __call__(self, tracer: Any) -> None:
            pull_env()
            blob = RequestModel.serialize(tracer)
            if job is not None:
                job.request_bytes = len(blob)
            note("RECEIVED")
            persistent = lm._remoteable_persistent_objects()
            filename = tracer.info.frame.f_code.co_filename
            cached = linecache.cache.get(filename)
            before = _marked()
            hidden = _hide(roots)
            classes = _fresh_classes()
            try:
                named: set[str] = set()
                if job is not None:
                    job.named = named  # as it fills: a refused request keeps what it named up to the refusal
                server = RequestModel.deserialize(blob, persistent, unpickler=server_unpickler(CustomCloudUnpickler, named))
                server.info.frame.f_locals["__builtins__"] = server_builtins()  # the block's, as the server's
                note("RUNNING")
                with contextlib.redirect_stdout(_LogLines(log, job)):
                    server.execute(server.info.code)
                frame = server.info.frame
                saves = _marked() - before
                result = {k: v for k, v in frame.f_locals.items() if id(v) in saves}
                reply = dumps(result)  # what the server sends back
            except BaseException:
                note("ERROR")
                raise
            finally:
                _restore_classes(classes)
                _unhide(hidden)
                if cached is not None:
                    linecache.cache[filename] = cached
                else:
                    linecache.cache.pop(filename, None)
            if job is not None:
                job.result_bytes = len(reply)
            note("COMPLETED")
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
