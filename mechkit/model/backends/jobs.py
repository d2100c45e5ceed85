"""What remote jobs report: each job's status updates, the server's own figures, and live progress.

A remote run is a series of jobs (one per trace, or one per group of traces: :meth:`NnsightBackend.run_group
<mechkit.model.backends.nnsight_backend.NnsightBackend.run_group>`). NDIF streams each job's lifecycle over a websocket —
``RECEIVED``, ``QUEUED`` (and ``PROVISIONING``/``DEPLOYING``/``DISPATCHED`` while a model is being placed),
``RUNNING``, ``COMPLETED`` or ``ERROR`` — plus ``LOG`` lines (whatever the job printed on the server), and
may attach ``meta``: what the job cost the server, in the server's own names. Nothing else is timed there,
so the durations here are the client's clock between those updates: queue = first update → ``RUNNING``,
run = ``RUNNING`` → ``COMPLETED`` (the server runs the job, then stores its result).

``--remote local`` (mechkit's strict simulation) sends the same lifecycle from its own phases —
``RECEIVED`` once the request is serialised, ``RUNNING`` once the "server" has deserialised it, ``LOG`` for
each line the job prints, ``COMPLETED`` once the reply is pickled — so the whole path is tested offline.
It has no queue and no server ``meta``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

LIFECYCLE = ("RECEIVED", "QUEUED", "PROVISIONING", "DEPLOYING", "DISPATCHED", "RUNNING", "COMPLETED", "ERROR")


@dataclass
class Job:
    """One remote job: how many traces it holds, its updates ``(status, client time)``, its logs and meta."""

    number: int
    traces: int
    statuses: list[tuple[str, float]] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    meta: dict | None = None
    request_bytes: int | None = None
    result_bytes: int | None = None
    named: set[str] | None = None  # --remote local: the modules the request named (each on NDIF's whitelist)

    def at(self, status: str) -> float | None:
        """When ``status`` first arrived (None if it never did)."""
        return next((t for s, t in self.statuses if s == status), None)

    def durations(self) -> dict[str, float]:
        """``queue_s``, ``run_s`` and ``total_s`` where the updates that bound them arrived."""
        if not self.statuses:
            return {}
        first, last = self.statuses[0][1], self.statuses[-1][1]
        running, done = self.at("RUNNING"), self.at("COMPLETED") or self.at("ERROR")
        out = {"total_s": last - first}
        if running is not None:
            out["queue_s"] = running - first
            if done is not None:
                out["run_s"] = done - running
        return out


Listener = Callable[[Job, str, str], None]


class JobLog:
    """Every remote job of one model handle, in order; ``listener(job, status, description)`` sees each
    update as it arrives (the runner shows them as live progress)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.jobs: list[Job] = []
        self.listener: Listener | None = None
        self.window = slice(None)  # the jobs a summary counts: a plugin run's (set by :func:`progress`)

    def start(self, traces: int) -> Job:
        job = Job(len(self.jobs) + 1, traces)
        self.jobs.append(job)
        return job

    def note(self, job: Job, status: str, description: str = "", meta: dict | None = None) -> None:
        """Record one update of ``job`` (a ``LOG`` keeps its line; ``meta`` is kept as the server sent it)."""
        if status == "LOG":
            job.logs.append(description)
        else:
            job.statuses.append((status, time.time()))
        if meta is not None:
            job.meta = dict(meta)
        if self.listener is not None:
            self.listener(job, status, description)

    def timings(self) -> dict[str, float]:
        """The report's ``timings`` entries: ``server_queue_s``, ``server_run_s``, ``server_total_s`` and,
        when the server gave it, ``server_peak_memory`` (in its unit)."""
        summary = self.summary()
        keys = ("queue_s", "run_s", "total_s", "peak_memory")
        return {f"server_{k}": summary[k] for k in keys if k in summary}

    def summary(self) -> dict:
        """The report's ``model.backend.server``: jobs, traces, summed durations and bytes, the server's meta."""
        jobs = self.jobs[self.window]
        out: dict[str, Any] = {"where": self.where, "jobs": len(jobs), "traces": sum(j.traces for j in jobs)}
        for key in ("queue_s", "run_s", "total_s"):
            values = [j.durations()[key] for j in jobs if key in j.durations()]
            if values:
                out[key] = round(sum(values), 4)
        for key in ("request_bytes", "result_bytes"):
            values = [getattr(j, key) for j in jobs if getattr(j, key) is not None]
            if values:
                out[key] = sum(values)
        metas = [j.meta for j in jobs if j.meta]
        if metas:
            out["meta"] = metas if len(metas) > 1 else metas[0]
            peak = peak_memory(metas)
            if peak is not None:
                out["peak_memory"] = peak
        return out


def peak_memory(metas: list[dict]) -> float | None:
    """The largest number the server reported under a key naming memory (``gpu_mem``, ``peak_memory``…).

    The server names its own figures; this only lifts the one a reader looks for first.

    >>> peak_memory([{"gpu_mem": 1.5e9, "execution_time": 2.0}, {"gpu_mem": 2e9}])
    2000000000.0
    >>> peak_memory([{"execution_time": 2.0}]) is None
    True
    """
    found = [float(v) for meta in metas for k, v in meta.items()
             if "mem" in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(found) if found else None


@contextmanager
def progress(log: JobLog | None, console: Any) -> Iterator[None]:
    """While a plugin runs: its jobs are the ones ``log`` summarises (not the runner's probes around it),
    and each update shows live on ``console`` — a transient status line on a terminal, nothing on a log
    file, a pipe or in a notebook (no live display there without ipywidgets; the report keeps the totals,
    a failure is its own line)."""
    if log is None:
        yield
        return
    first = len(log.jobs)
    try:
        from mechkit.io.progress import draws_live

        if draws_live(console):
            with _live(log, console):
                yield
        else:
            yield
    finally:
        log.window = slice(first, len(log.jobs))


@contextmanager
def _live(log: JobLog, console: Any) -> Iterator[None]:
    """A transient status line while a job runs, shown from its first update to its last. Only then:
    between jobs the plugin's own progress bar may start (rich before 14 allows one live display at a
    time; where the bar is live already, the job goes unshown)."""
    from rich.errors import LiveError

    status = console.status("remote job", spinner="dots")
    where = "NDIF" if log.where == "ndif" else "simulated server"
    shown: list[Job] = []

    def show(job: Job, state: str, description: str) -> None:
        if not shown or shown[-1] is not job:
            shown.append(job)
            try:
                status.start()
            except LiveError:
                return
        what = description if state == "LOG" else state
        status.update(f"{where}: job {job.number} ({job.traces} trace{'s' if job.traces != 1 else ''}) {what}")
        if state in ("COMPLETED", "ERROR"):
            status.stop()

    log.listener = show
    try:
        yield
    finally:
        log.listener = None
        status.stop()
