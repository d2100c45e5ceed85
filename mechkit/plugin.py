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
    from mechkit.report import Table


@dataclass
class Result:
    """What ``run()`` returns: JSON-able results, matplotlib figures and extra files by name, and the
    ``finding``: one or two sentences, numbers included, stating what the run found (the first thing
    the report, its page and the terminal summary show). The first figure is the page's headline."""

    results: dict
    figures: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    finding: str | None = None


STEP_MAX_BYTES = 2**34  # a stored step larger than this is no step mechkit wrote


def _why_not(read: str) -> str:
    """Why a kept step is not taken, from :func:`mechkit.io.reads.changed`'s answer."""
    from mechkit.io.reads import BLIND, CWD, ENV, LISTED, MAX_READS, TOO_MANY

    if read == BLIND:
        return "the run opened a file relative to a folder descriptor (dir_fd), which no path names to check"
    if read == "?":
        return "its record of the files the run read is damaged"
    if read == TOO_MANY:
        return f"the run read more than {MAX_READS} files before it, too many to check"
    if read.startswith(CWD):
        return (f"the run read files by names relative to the working directory {read[len(CWD):]}, and this run "
                "works in another")
    if read.startswith(LISTED):
        return f"the folder {read[len(LISTED):]}, which the run listed, holds other names since the step was kept"
    if read.startswith(ENV):
        return f"the environment variable {read[len(ENV):]}, which the run read, has changed since the step was kept"
    return f"{read}, which the run read, has changed since the step was kept"


def _reads_so_far() -> list:
    """The files the recorded run read so far, with what they held (:mod:`mechkit.io.reads`); none unrecorded."""
    from mechkit.io.reads import current

    reads = current()
    return reads.signatures() if reads is not None else []


@dataclass
class RunContext:
    """Everything a plugin run needs, handed to ``Plugin.run``.

    A plugin reads its options one way: ``options[name]``, every option after its declared type check
    and parser (``Option(parse=...)``), e.g. ``options["sweep"] == (5, 10)`` for ``--sweep 5,10``, and
    the plain checked value for an option without a parser. ``params`` is the record, not for reading
    options: each option as given (``"5,10"``), what the report keeps and what reruns it.
    """

    model: ModelHandle | None
    params: dict
    seed: int
    console: Console
    resume_dir: Path | None = None
    options: dict = field(default_factory=dict)
    _unsaved: bool = field(default=False, init=False, repr=False)
    _executor: Any = field(default=None, init=False, repr=False)

    def step(self, key: str, compute: Callable[[], Any]) -> Any:
        """Run ``compute()`` once and keep its JSON-able result, so an interrupted run resumes here.

        Finished steps are stored under the cache directory keyed by plugin, options, seed and
        model weights, and cleared once the whole run has written its report. A stored step that
        cannot be read back (truncated, corrupted, not a step of this key) is discarded with a
        one-line warning on the run's console and computed again; a step that cannot be stored
        (a full disk, a read-only cache) is warned about once and the run goes on without it. What
        sits under a step's name and is no plain file (a directory, a FIFO, a link) is no step of
        mechkit's: it is never read, replaced or deleted, and the step is computed and not kept, said
        in one line.

        >>> import io, json, tempfile, pathlib
        >>> from rich.console import Console
        >>> log = io.StringIO()
        >>> ctx = RunContext(model=None, params={}, seed=0, console=Console(file=log, width=60),
        ...                  resume_dir=pathlib.Path(tempfile.mkdtemp()))
        >>> ctx.step("sum", lambda: 1 + 2), ctx.step("sum", lambda: 0)  # the second is read back
        (3, 3)
        >>> _ = ctx.step_path("sum").write_text('{"key": "sum", "val')  # cut short, e.g. by a full disk
        >>> ctx.step("sum", lambda: 1 + 2)
        3
        >>> print(log.getvalue().replace(str(ctx.resume_dir), "DIR"))  # doctest: +NORMALIZE_WHITESPACE
        mechkit: warning: discarded the damaged resume step 'sum' (DIR/...json: not valid JSON); computing it again
        """
        if self.resume_dir is None:
            return compute()
        from mechkit.io.read import not_regular

        path = self.step_path(key)
        odd = not_regular(path)
        if odd is not None:  # a user's: a FIFO's read hung the run, a folder was deleted as a "damaged step"
            self._warn(f"not resuming step {key!r}: {path} is {odd}, not a step file mechkit wrote; it is left "
                       "alone, and the step is computed again and not kept")
        elif path.exists():
            found, value = self._read_step(path, key)
            if found:
                return value
        from mechkit.report import to_jsonable

        value = to_jsonable(compute(), "keep")  # a NaN stays NaN (JSON's NaN extension), so the report refuses it
        if odd is None:
            self._write_step(path, key, value)
        return value

    def step_path(self, key: str) -> Path:
        """Where the finished step ``key`` is kept (under ``resume_dir``)."""
        assert self.resume_dir is not None
        return self.resume_dir / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")

    def _read_step(self, path: Path, key: str) -> tuple[bool, Any]:
        """``(True, value)`` for a sound stored step; else the file is removed, a warning printed, ``(False, None)``.
        The file is opened without following a link and without blocking, and read only as a plain file
        (:func:`mechkit.io.read.read_plain`); anything else at its name is never removed."""
        from mechkit.io.read import not_regular, read_plain
        from mechkit.io.reads import changed

        try:
            stored = json.loads(read_plain(path, STEP_MAX_BYTES).decode("utf-8"))
            if not isinstance(stored, dict) or "value" not in stored:
                problem = "not a stored step"
            elif stored.get("key") != key:
                problem = "written for another step"
            elif (read := changed(stored.get("reads", []))) is not None:  # a file the run read holds another now
                self._warn(f"not resuming step {key!r}: " + _why_not(read) + "; computing it again")
                return False, None
            else:
                return True, stored["value"]
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except ValueError:  # json.JSONDecodeError
            problem = "not valid JSON"
        except RecursionError:
            problem = "nested too deeply"
        except OSError as err:
            problem = err.strerror or type(err).__name__
        if not_regular(path) is not None:  # replaced meanwhile by what is not a step file: left alone
            self._warn(f"not resuming step {key!r}: {path} is {not_regular(path)}, not a step file mechkit wrote; "
                       "it is left alone, and the step is computed again")
            return False, None
        import contextlib

        with contextlib.suppress(OSError):  # the rewrite below replaces it, or warns that it cannot
            path.unlink(missing_ok=True)
        self._warn(f"discarded the damaged resume step {key!r} ({path}: {problem}); computing it again")
        return False, None

    def _write_step(self, path: Path, key: str, value: Any) -> None:
        from mechkit.io import write_atomic
        from mechkit.io.disk_cache import mark_run_dir
        from mechkit.io.read import not_regular

        if not_regular(path) is not None:  # put there since it was read: never written over
            return
        try:
            mark_run_dir(self.resume_dir)  # marked as mechkit's: `cache clear` deletes only marked folders
            write_atomic(path, json.dumps({"key": key, "value": value, "reads": _reads_so_far()}))
        except OSError as err:
            if not self._unsaved:
                why = err.strerror or type(err).__name__
                self._warn(f"cannot keep finished steps in {self.resume_dir} ({why}); this run will not resume "
                           "from here if it stops")
            self._unsaved = True

    def _warn(self, message: str) -> None:
        self.console.print(f"mechkit: warning: {message}", markup=False, highlight=False, soft_wrap=True)

    def progress(self):
        """A rich progress bar on the run's console (stderr), transient so reports stay clean. Where the
        console is not a terminal (a log file, a pipe, a Jupyter notebook) a bar would draw nothing or need
        ipywidgets: plain lines stand in, one per task at least every 30 s, 10 s in a notebook
        (:class:`mechkit.io.progress.PlainProgress`).

        >>> import io
        >>> from rich.console import Console
        >>> ctx = RunContext(model=None, params={}, seed=0, console=Console(file=io.StringIO()))
        >>> with ctx.progress() as bar:
        ...     job = bar.add_task("work", total=2)
        ...     bar.advance(job)
        """
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from mechkit.io.progress import draws_live, plain_progress

        if not draws_live(self.console):  # a bar would draw nothing there, or want ipywidgets
            return plain_progress(self.console)
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)

    def map_units(self, fn: Callable, shared: Any, units: list, keys: list[str],
                  on_result: Callable[[int, Any], None] | None = None) -> list:
        """``fn``'s results over independent ``units``, in order, each kept as the step ``keys[i]``.

        Where they run is the run's ``--executor`` (:mod:`mechkit.executors`: this process, or Ray actors
        that each load the model once), opened at the first call and closed when the run ends; a plugin
        only chooses what a unit is. ``fn(handle, shared, units)`` is a module-level function yielding one
        JSON-able result per unit that depends on nothing but the model, ``shared`` and the unit itself.
        Finished units are read back instead of run again, as with :meth:`step`.
        """
        from mechkit.executors import map_units, open_executor

        if self._executor is None:
            self._executor = open_executor(self.params, self.model, self.console)
        return map_units(self._executor, self.step, fn, shared, units, keys, on_result)

    def close(self) -> None:
        """Release the executor's workers, if any were started (the runner calls this as the run ends)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.close()

    def scratch(self, name: str) -> Path | None:
        """A directory for bulky resumable state (tensor checkpoints) that ``step`` cannot hold as JSON.

        It lives beside the finished steps and goes with them when the run completes; ``None`` when
        the run is not resumable (a plugin then simply runs without checkpoints).
        """
        if self.resume_dir is None:
            return None
        import contextlib

        from mechkit.io.disk_cache import mark_scratch

        with contextlib.suppress(OSError):  # the caller's own write then fails and says so
            mark_scratch(self.resume_dir, name)  # marked before a checkpoint's own mkdir, the folder recorded as ours
        return self.resume_dir / name


class Plugin:
    """Base class for analyses. Subclasses set the class attributes and implement ``run``."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = "0.0.0"
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    needs_model: ClassVar[bool] = True
    # What the run needs beyond forward passes with hooks: any of "weight_writes", "gradients",
    # "patterns", "generation", "module_calls" (partial forwards calling blocks one by one),
    # "weight_reads" (reading weights in this process rather than through mechkit.model.backends.weight_reads.
    # read_weights). A backend that cannot serve one (nnsight on a remote model cannot write weights)
    # refuses before any work.
    needs: ClassVar[frozenset[str]] = frozenset()
    # Which kinds of physically pruned model (``prune --save-model``) the plugin handles: any of "neurons"
    # (narrower MLPs), "heads" (heads removed), "uneven-heads" (heads removed so that layers keep different
    # numbers of them: a ``[layers, heads]`` grid has empty cells), "layers" (blocks removed). A model
    # pruned in a way not listed is refused in one line before any work; the default lists none.
    # ``pruned_why`` gives that line's reason and fix for a kind (``{kind: (why, fix)}``) where the plugin
    # knows why it cannot (a method that needs every layer to have as many heads, say).
    pruned: ClassVar[frozenset[str]] = frozenset()
    pruned_why: ClassVar[dict[str, tuple[str, str]]] = {}
    # Which of the names ``writes`` gives the run prepares in ``$TMPDIR`` for its report to move in
    # (:func:`mechkit.io.leftovers.make_prepared_dir`: ``prune --save-model``'s ``model``): for such a run a
    # ``$TMPDIR`` inside ``--out`` or mechkit's cache is refused before the model loads, not after the work.
    prepared: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: RunContext) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def check_options(cls, parsed: dict[str, Any]) -> None:
        """Checks that span several options (each option's own type, bounds and choices are checked
        already), run with the others before any model loads: raise
        :class:`~mechkit.options.OptionError` with one line. The default has none."""

    @classmethod
    def writes(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """Names a run with ``params`` writes into ``--out`` besides its report and figures (a saved model's
        ``config.json``, a ``model/`` folder). The runner checks them before the model loads, so a model
        that another writer saved there, or one mechkit never wrote, is refused at once and not after the
        work (:func:`mechkit.io.replace.refuse_foreign_model`). Where a name is a ``model`` folder or a
        ``.safetensors`` file, the run saves a model, and the model's size is also checked against the
        process's file-size limit (``ulimit -f``) before the work (:meth:`saved_model_bytes`). The default writes
        none."""
        return ()

    @classmethod
    def saved_model_bytes(cls, parsed: dict[str, Any], handle: Any) -> int:
        """The fewest bytes the model a run saves can hold, held to ``ulimit -f`` before the work where
        :meth:`writes` names a model: refused only where even that cannot fit. The default is every weight of
        the loaded model (tied tensors once), the size of a saved copy; a plugin that saves a smaller model
        (prune) returns a lower bound, so a model that would fit is not refused for the dense model's size."""
        from mechkit.model.placement.ties import weight_bytes

        return weight_bytes(handle.model.state_dict(keep_vars=True).values())

    @classmethod
    def tables(cls, results: dict) -> list[Table]:
        """The tables a reader sees, pivoted the natural way for this analysis, built from a report's
        JSON ``results`` at render time (``report.html``, ``mechkit report show`` and ``compare``).

        The default shows the results generically (:func:`mechkit.report.generic_tables`); override
        it to return :class:`mechkit.report.Table` pivots such as conditions × tasks.
        """
        from mechkit.report import generic_tables

        return generic_tables(results)


__all__ = ["Option", "Plugin", "Result", "RunContext"]
