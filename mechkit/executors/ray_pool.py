"""The Ray executor: long-lived actors that each load the model once and run chunks of units.

Work goes out in chunks (:func:`~mechkit.executors.base.chunks`), one chunk per idle actor at a time,
so fast workers take more; results are put back in submission order, so a report never depends on
the number of workers. Faults:

- a worker that dies mid-chunk (killed, out of memory, its node lost) is replaced by a fresh actor
  (which loads the model again) and its chunk goes back to the front of the queue, for whichever
  worker is idle first; a chunk that kills ``MAX_ATTEMPTS`` workers stops the run with one line;
- an error raised by the unit function itself is a real error, not a fault: it stops the run
  (a :class:`~mechkit.errors.MechkitError` as its own one line);
- the driver keeps each chunk's results as it returns (``map_units`` writes the steps), so a driver
  killed mid-run resumes from the finished chunks.

Actors ask Ray for the GPUs their model needs (``num_gpus``) and one CPU; on CPUs, for as many CPUs as
the run's torch threads, which every worker uses: a CPU matrix product's rounding can depend on the
number of threads, and results must not depend on where a unit ran.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError, first_line
from mechkit.executors.base import OnResult, UnitFn, check_count, chunks

if TYPE_CHECKING:
    from mechkit.executors.load import LoadSpec
    from mechkit.model.handle import ModelHandle

MAX_ATTEMPTS = 3
ENV_PREFIXES = ("MECHKIT_", "HF_", "TRANSFORMERS_")  # where the driver finds models and caches: same for workers


class UnitWorker:
    """A Ray actor's body: the model, loaded once; then any unit function, chunk after chunk.

    A load that fails is kept as the worker's error and reported by :meth:`ready` as one line, rather
    than raised (Ray would turn it into a multi-line actor death indistinguishable from a kill).
    """

    def __init__(self, load: LoadSpec) -> None:
        self.handle: ModelHandle | None = None
        self.error: str | None = None
        try:
            import torch

            torch.set_num_threads(load.threads)  # the run's: the same rounding as a serial run
            self.handle = load.load()
            if load.sha256 and self.handle.weights_sha256() != load.sha256:
                self.error = (f"a Ray worker loaded other weights for {load.spec!r} than the run did — give every "
                              "node the same files (or a shared path) for --model")
        except MechkitError as err:
            self.error = f"a Ray worker could not load the model: {err}"
        except Exception as err:  # a worker's environment (missing file, no GPU): said in one line
            self.error = f"a Ray worker could not load the model: {type(err).__name__}: {first_line(err)}"

    def ready(self) -> tuple[int, str | None]:
        """``(pid, error)``: called once the actor exists, so the driver waits for every model to load."""
        return os.getpid(), self.error

    def run(self, fn: UnitFn, shared: Any, units: list) -> list:
        if self.error is not None:
            raise MechkitError(self.error)
        return list(fn(self.handle, shared, units))


_REMOTE: Any = None
_KEPT: dict[str, Any] = {}  # the last run's sound workers, while the caller's Ray session lives: key, actors, pids


def release_workers() -> None:
    """Stop the workers a finished run left up for the next one (see :meth:`RayExecutor.close`)."""
    actors = _KEPT.get("actors") or []
    _KEPT.clear()
    if actors:
        _kill(actors)


def _kill(actors: list) -> None:
    ray = _ray()
    for actor in actors:
        with contextlib.suppress(Exception):  # already gone with its node or its session: nothing to stop
            ray.kill(actor, no_restart=True)


def _remote_worker(ray):
    """:class:`UnitWorker` as a Ray actor class, made once per process."""
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(UnitWorker)
    return _REMOTE


def _ray():
    try:
        import ray
    except ImportError:
        from mechkit.options.execution import INSTALL_RAY

        raise MechkitError("--executor ray needs Ray, which is not installed", INSTALL_RAY) from None
    return ray


class RayExecutor:
    """Units on Ray actors (see the module docstring). Ray starts, or is joined, at the first ``map``.

    ``address``: a running cluster (``"auto"``, ``HOST:PORT``), else a Ray already initialised in this
    process, else a local one started here (and stopped by :meth:`close`). ``workers``: actors (default
    one per GPU, or per GPU set a sharded model needs; on CPUs as many as the cluster's CPUs hold at the
    run's torch threads each).
    """

    name = "ray"

    def __init__(self, load: LoadSpec, workers: int | None = None, address: str | None = None, console=None,
                 chunk_size: int | None = None) -> None:
        self.load, self.requested, self.address, self.console = load, workers, address, console
        self.chunk_size = chunk_size
        self.workers = workers or 0
        self.pids: list[int | str] = []  # "?" for a replacement still loading
        self._actors: list = []
        self._owns_ray = False
        self._cpus = 1
        self._sound = True  # False while a map is under way or after one failed: then close() stops the actors

    def map(self, fn: UnitFn, shared: Any, units, on_result: OnResult | None = None) -> list:
        units = list(units)
        if not units:
            return []
        self._start()
        self._sound = False
        results = self._run_chunks(fn, _ray().put(shared), units, on_result)  # shared travels once per map
        self._sound = True
        return results

    def _run_chunks(self, fn: UnitFn, shared_ref, units: list, on_result: OnResult | None) -> list:
        """One chunk per idle actor until all are done. A lost chunk goes back to the front of the queue,
        for the first worker free: a live one, or the replacement once it has loaded the model."""
        ray = _ray()
        parts = chunks(len(units), self.workers, self.chunk_size)
        results: list[Any] = [None] * len(units)
        queue, idle, waiting = deque(range(len(parts))), deque(range(len(self._actors))), {}
        attempts: Counter = Counter()
        while queue or any(what == "chunk" for what, _, _ in waiting.values()):
            while queue and idle:
                c, a = queue.popleft(), idle.popleft()
                waiting[self._actors[a].run.remote(fn, shared_ref, [units[i] for i in parts[c]])] = ("chunk", c, a)
            (ref,), _ = ray.wait(list(waiting), num_returns=1)
            what, c, a = waiting.pop(ref)
            out = self._outcome(ref)
            if what == "ready":  # a replacement has loaded the model (or says why it could not)
                self._ready_one(a, out)
                idle.append(a)
            elif isinstance(out, BaseException):
                attempts[c] += 1
                waiting[self._lost(a, c, len(parts), out, attempts[c])] = ("ready", None, a)
                queue.appendleft(c)
            else:
                check_count(fn, parts[c], out)
                for i, value in zip(parts[c], out, strict=True):
                    results[i] = value
                    if on_result is not None:
                        on_result(i, value)
                idle.append(a)
        return results

    def _ready_one(self, a: int, answer: Any) -> None:
        if isinstance(answer, BaseException):
            raise MechkitError(f"a replacement Ray worker died while loading the model ({type(answer).__name__})",
                               "check the workers' memory and logs (`ray logs`)")
        pid, error = answer
        if error:
            raise MechkitError(error)
        self.pids[a] = pid

    def _outcome(self, ref) -> Any:
        """A chunk's results, or the fault that lost them (a dead worker); the unit function's own
        errors are raised (a :class:`MechkitError` stays its one line)."""
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # the unit function raised: an error, not a fault
            cause = getattr(err, "cause", None)
            raise (cause if isinstance(cause, Exception) else err) from None
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError,
                ray.exceptions.OutOfMemoryError, ray.exceptions.NodeDiedError) as err:
            return err

    def close(self) -> None:
        """Release the workers; safe to call twice.

        A run that started Ray stops it with everything in it. In a Ray session the caller runs (a
        notebook, a test session, a driver joined to a cluster) sound workers stay up holding the model
        for the next run on the same model in this process (:func:`release_workers` stops them; so does
        the end of the session)."""
        if self._actors and self._sound and not self._owns_ray:
            _KEPT.update(key=self._key(), actors=self._actors, pids=self.pids)
        elif self._actors:
            _kill(self._actors)
        self._actors = []
        if self._owns_ray:
            _ray().shutdown()
            self._owns_ray = False

    def _start(self) -> None:
        if self._actors:
            return
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         logging_level="WARNING")
            except ConnectionError as err:
                raise MechkitError(f"cannot join the Ray cluster at {self.address}: {first_line(err)}",
                                   "start it (`ray start --head`) or check --ray-address") from None
            self._owns_ray = True
        try:
            self.workers, self._cpus = self._plan(ray)
            if _KEPT.get("key") == self._key():  # the last run's workers, holding this very model
                self._actors, self.pids = _KEPT.pop("actors"), _KEPT.pop("pids")
                _KEPT.clear()
                return
            release_workers()  # another model's workers: free their CPUs and GPUs first
            self._actors = [self._actor(ray) for _ in range(self.workers)]
            self.pids = self._ready(ray, self._actors)
        except BaseException:
            self._sound = False
            self.close()
            raise

    def _key(self) -> tuple:
        """What kept workers must match: this Ray session (job ids restart at each cluster, node ids do not),
        the model, the number and size of workers."""
        context = _ray().get_runtime_context()
        return (context.get_node_id(), context.get_job_id(), repr(self.load), self.workers, self._cpus)

    def _plan(self, ray) -> tuple[int, int]:
        """``(workers, CPUs each)`` for this cluster; one line where it cannot hold them.

        A GPU worker asks for the GPUs its model needs and one CPU; a CPU worker for as many CPUs as it
        runs torch threads (the run's own number, so its results are the serial run's)."""
        total = ray.cluster_resources()
        cpus, gpus, need = int(total.get("CPU", 0)), int(total.get("GPU", 0)), self.load.gpus
        if need:
            most = gpus // need
            workers = self.requested or most
            if workers < 1 or workers > most:
                raise MechkitError(f"the Ray cluster has {gpus} GPUs and each worker needs {need}: "
                                   f"{workers or 1} workers do not fit", f"pass --workers {max(most, 1)} or fewer, "
                                   "or add GPU nodes")
            return workers, 1
        threads = self.load.threads
        widest = max((int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=0)
        workers = self.requested or max(1, cpus // threads)
        if workers * threads > cpus or threads > widest:
            raise MechkitError(f"the Ray cluster has {cpus} CPUs ({widest} on its largest node) and each worker runs "
                               f"torch on this run's {threads} thread{'s' * (threads != 1)}: {workers} workers do not fit",
                               f"pass --workers {max(cpus // threads, 1)} or fewer, or use fewer threads for the run "
                               "(OMP_NUM_THREADS=1: serial and Ray runs stay identical at any equal count)")
        return workers, threads

    def _actor(self, ray):
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        options = {"num_cpus": self._cpus, "num_gpus": self.load.gpus, "max_restarts": 0}
        if env:
            options["runtime_env"] = {"env_vars": env}
        return _remote_worker(ray).options(**options).remote(self.load)

    def _ready(self, ray, actors: list) -> list[int]:
        answers = ray.get([actor.ready.remote() for actor in actors])
        errors = [error for _, error in answers if error]
        if errors:
            raise MechkitError(errors[0])
        return [pid for pid, _ in answers]

    def _lost(self, a: int, c: int, n_chunks: int, err: Exception, attempt: int):
        """Replace dead worker ``a`` with a fresh actor and warn; the ref of its ``ready()`` (it joins the idle
        workers once loaded). A chunk that has lost ``MAX_ATTEMPTS`` workers stops the run."""
        ray = _ray()
        pid = self.pids[a]
        if attempt >= MAX_ATTEMPTS:
            raise MechkitError(f"chunk {c + 1} of {n_chunks} killed {attempt} Ray workers in a row (last: pid {pid}, "
                               f"{type(err).__name__})", "check the workers' memory and logs (`ray logs`)")
        _kill([self._actors[a]])  # it is dead; this only drops Ray's record of it
        self._actors[a] = self._actor(ray)
        self.pids[a] = "?"
        if self.console is not None:
            self.console.print(f"mechkit: warning: Ray worker {a + 1} (pid {pid}) died running chunk {c + 1} of "
                               f"{n_chunks} ({type(err).__name__}); a fresh worker replaces it and the chunk "
                               "runs again", markup=False, highlight=False, soft_wrap=True)
        return self._actors[a].ready.remote()
