"""The plugin protocol: a name, a version, a one-line summary, options, and ``run()``.

A plugin is a short script over the public API. It receives a :class:`RunContext` (the loaded
model, resolved options, seed, a console and resumable steps) and returns a :class:`Result`;
mechkit turns that into ``report.json`` + ``report.html`` and a CLI subcommand. Options are
:class:`~mechkit.options.Option` declarations (re-exported here), each checked before the model
loads. Register it under the ``mechkit.plugins`` entry-point group, exactly as the built-ins are::

    [project.entry-points."mechkit.plugins"]
    my-probe = "my_package.probe:MyProbe"
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mechkit.options import Option

if TYPE_CHECKING:
    from rich.console import Console

    from mechkit.model.handle import ModelHandle


@dataclass
class Result:
    """What ``run()`` returns: JSON-able results, matplotlib figures and extra files by name."""

    results: dict
    figures: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)


@dataclass
class RunContext:
    """Everything a plugin run needs, handed to ``Plugin.run``.

    ``params`` holds every option as given (checked and of its declared type): what the report
    records and what reruns it. ``parsed`` holds the same options after their declared parser
    (``Option(parse=...)``), e.g. ``params["sweep"] == "5,10"`` and ``parsed["sweep"] == (5, 10)``;
    for options without a parser the two agree.
    """

    model: ModelHandle | None
    params: dict
    seed: int
    console: Console
    resume_dir: Path | None = None
    parsed: dict = field(default_factory=dict)

    def step(self, key: str, compute: Callable[[], Any]) -> Any:
        """Run ``compute()`` once and keep its JSON-able result, so an interrupted run resumes here.

        Finished steps are stored under the cache directory keyed by plugin, options, seed and
        model weights, and cleared once the whole run has written its report.
        """
        if self.resume_dir is None:
            return compute()
        path = self.resume_dir / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
        if path.exists():
            return json.loads(path.read_text())["value"]
        from mechkit.io import write_atomic
        from mechkit.report import to_jsonable

        value = to_jsonable(compute())
        self.resume_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "value": value}))
        return value

    def progress(self):
        """A rich progress bar on the run's console (stderr), transient so reports stay clean.

        >>> import io
        >>> from rich.console import Console
        >>> ctx = RunContext(model=None, params={}, seed=0, console=Console(file=io.StringIO()))
        >>> with ctx.progress() as bar:
        ...     job = bar.add_task("work", total=2)
        ...     bar.advance(job)
        """
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)

    def scratch(self, name: str) -> Path | None:
        """A directory for bulky resumable state (tensor checkpoints) that ``step`` cannot hold as JSON.

        It lives beside the finished steps and goes with them when the run completes; ``None`` when
        the run is not resumable (a plugin then simply runs without checkpoints).
        """
        return None if self.resume_dir is None else self.resume_dir / name


class Plugin:
    """Base class for analyses. Subclasses set the class attributes and implement ``run``."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = "0.0.0"
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    needs_model: ClassVar[bool] = True

    def run(self, ctx: RunContext) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError


__all__ = ["Option", "Plugin", "Result", "RunContext"]
