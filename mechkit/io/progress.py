"""Progress a person can see wherever stderr goes.

A rich bar is drawn only on a terminal (:func:`draws_live`): redirected to a file it draws nothing, and a
long run looks hung; in Jupyter a live display needs ipywidgets, and without it rich warns and leaves
empty output blocks behind. :class:`PlainProgress` stands in there with the same calls (``add_task``,
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


NOTEBOOK_EVERY = 10.0  # seconds between plain progress lines in a notebook, where a reader is watching


def draws_live(console) -> bool:
    """Whether a rich live display (a bar, a spinner) works on ``console``: on a terminal only. A log
    file or a pipe shows nothing of it, and a notebook needs ipywidgets for it; those get plain lines
    on the console's file (in Jupyter, the cell's stderr stream).

    >>> import io
    >>> from rich.console import Console
    >>> draws_live(Console(file=io.StringIO(), force_terminal=True))
    True
    >>> draws_live(Console(file=io.StringIO(), force_jupyter=True)), draws_live(Console(file=io.StringIO()))
    (False, False)
    """
    return bool(console.is_terminal) and not console.is_jupyter


def plain_every(console) -> float:
    """How often plain progress lines come where no bar draws: every 10 s in a notebook, 30 s in a log."""
    return NOTEBOOK_EVERY if console.is_jupyter else 30.0


def plain_progress(console) -> PlainProgress:
    """:class:`PlainProgress` on ``console``'s file, as often as :func:`plain_every` says."""
    return PlainProgress(console.file, plain_every(console))


def heartbeat(console, label: str, every: float | None = None):
    """A :class:`Heartbeat` on a rich ``console``'s file where no bar can show (a log file, a pipe, a
    notebook); nothing on a terminal, where bars and spinners speak for themselves."""
    import contextlib

    if draws_live(console):
        return contextlib.nullcontext()
    return Heartbeat(console.file, label, every if every is not None else plain_every(console))
