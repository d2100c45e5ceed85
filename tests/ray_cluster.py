"""A real local Ray cluster for the executor tests, and a way to kill one of its busy workers by PID.

A pytest plugin of the suite (``pytest_plugins`` in tests/conftest.py): the fixtures ``cluster`` and
``ray_cache`` serve tests/test_ray.py and tests/test_ray_prune.py. One cluster serves a test module; its teardown stops it and checks no worker
process outlives it. The module runs torch on one thread: workers use the run's number of threads (CPU
rounding can depend on it), and two single-thread workers fit the cluster's two CPUs.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections.abc import Iterator

import psutil
import pytest


def ray_workers(title: str = "ray::UnitWorker") -> list[int]:
    """PIDs of this session's mechkit Ray workers whose process title starts with ``title``
    (Ray titles a busy one ``ray::UnitWorker.run``)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if " ".join(proc.cmdline()).startswith(title):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def cluster():
    import ray
    import torch

    from mechkit.executors.ray_pool import release_workers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        release_workers()
        ray.shutdown()
        torch.set_num_threads(threads)
        for sig, handler in handlers.items():  # Ray installs its own: later tests (and their children) get ours back
            signal.signal(sig, handler)
    deadline = time.monotonic() + 15
    while ray_workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_workers() == [], "Ray worker processes outlived the cluster"


@pytest.fixture
def ray_cache(tmp_path, monkeypatch):
    """A fresh step cache per test: serial and Ray runs share a resume key (executor options are not part
    of it), so each must compute, not read the other's steps."""
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@contextlib.contextmanager
def killing_a_busy_worker() -> Iterator[tuple[list[int], io.StringIO]]:
    """While the block runs, SIGKILL the first worker seen running a chunk; yields ``(killed, log)``:
    the PID killed (empty if none was caught busy) and a console buffer for the run's warning line."""
    killed: list[int] = []
    done = threading.Event()

    def kill():
        while not done.is_set():
            busy = ray_workers("ray::UnitWorker.run")
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
                return
            time.sleep(0.002)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        yield killed, io.StringIO()
    finally:
        done.set()
        killer.join()


class KeptSteps:
    """An in-memory step cache (``step(key, compute)``) that records the keys it computed, in order."""

    def __init__(self) -> None:
        self.kept: dict = {}
        self.computed: list[str] = []

    def __call__(self, key, compute):
        if key not in self.kept:
            self.kept[key] = compute()  # map_units asks first with a compute that raises: nothing is kept then
            self.computed.append(key)
        return self.kept[key]
