"""Progress a person can see wherever stderr goes.

A rich bar is drawn only on a terminal or in a notebook: redirected to a file, it draws nothing, and a
long run looks hung. :class:`PlainProgress` stands in there with the same calls (``add_task``,
``advance``, ``update``), printing one plain line per unfinished task every ``every`` seconds (a timer
thread, so a single slow step still reports) and one when it ends. A task shorter than ``every`` prints
only its end: a run that stops early on bad input still says so in one line.

>>> import io
>>> out = io.StringIO()
>>> with PlainProgress(out, every=3600) as bar:
...     job = bar.add_task("ablate", total=2)
...     bar.advance(job)
...     bar.advance(job)
>>> print(out.getvalue().replace("0s", "Ns"), end="")
mechkit: ablate 2/2 done (elapsed Ns)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import IO


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float = 0
    start: float = field(default_factory=time.monotonic)
    done: bool = False


_last_line = [0.0]  # when any progress line of this process was last printed (time.monotonic)


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class PlainProgress:
    """Plain progress lines ``mechkit: TASK done/total (elapsed T)`` on ``file``, every ``every`` seconds."""

    def __init__(self, file: IO[str], every: float = 30.0) -> None:
        self.file, self.every = file, every
        self.tasks: dict[int, _Task] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def __enter__(self) -> PlainProgress:
        self._timer = threading.Thread(target=self._tick, name="mechkit-progress", daemon=True)
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()

    def add_task(self, description: str, total: float | None = None, **_ignored) -> int:
        with self._lock:
            task_id = len(self.tasks)
            self.tasks[task_id] = _Task(description, total)
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, advance: float = 0, completed: float | None = None,
               total: float | None = None, description: str | None = None, **_ignored) -> None:
        with self._lock:
            task = self.tasks[task_id]
            task.completed = completed if completed is not None else task.completed + advance
            task.total = total if total is not None else task.total
            task.description = description or task.description
            if task.total is not None and task.completed >= task.total and not task.done:
                task.done = True
                self._line(task)

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                for task in self.tasks.values():
                    if not task.done:
                        self._line(task)

    def _line(self, task: _Task) -> None:
        count = f"{task.completed:g}/{task.total:g}" if task.total is not None else f"{task.completed:g}"
        state = " done" if task.done else ""
        self.file.write(f"mechkit: {task.description} {count}{state} "
                        f"(elapsed {_elapsed(time.monotonic() - task.start)})\n")
        self.file.flush()
        _last_line[0] = time.monotonic()


class Heartbeat:
    """``mechkit: LABEL (elapsed T)`` every ``every`` seconds of a long step that counts nothing (loading
    a model, computing head scores), unless a progress line was printed meanwhile. Change ``label`` as
    the step changes.

    >>> import io
    >>> out = io.StringIO()
    >>> with Heartbeat(out, "loading the model", every=0.05) as beat:
    ...     time.sleep(0.12)
    >>> out.getvalue().splitlines()[0]
    'mechkit: loading the model (elapsed 0s)'
    """

    def __init__(self, file: IO[str], label: str, every: float = 30.0) -> None:
        self.file, self.label, self.every = file, label, every
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._tick, name="mechkit-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._timer.join()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            now = time.monotonic()
            if now - _last_line[0] >= self.every * 0.9:
                self.file.write(f"mechkit: {self.label} (elapsed {_elapsed(now - self._start)})\n")
                self.file.flush()
                _last_line[0] = now


def heartbeat(console, label: str, every: float = 30.0):
    """A :class:`Heartbeat` on a rich ``console``'s file where no bar can show (a log file, a pipe);
    nothing on a terminal or in a notebook, where bars and spinners speak for themselves."""
    import contextlib

    if console.is_terminal or console.is_jupyter:
        return contextlib.nullcontext()
    return Heartbeat(console.file, label, every)
