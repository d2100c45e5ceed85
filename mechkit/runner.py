"""Run a plugin end to end: resolve options, check and lock ``--out``, load the model, run, check, write the report.

The CLI and the Python API share this path, so ``mk.run("inspect", model="llama")`` and
``mechkit inspect --model llama`` produce the same report.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError, PluginError, first_line
from mechkit.executors import check_execution
from mechkit.io.fs_errors import one_line_errors, refuse_over_file_size_limit
from mechkit.io.out import refuse_tmpdir_inside
from mechkit.io.outlock import check_run_out, claimed, locked_fresh_dir, out_lock
from mechkit.io.patharg import checked_text, text_path
from mechkit.io.progress import heartbeat
from mechkit.io.quiet import quiet
from mechkit.io.reads import recording
from mechkit.io.returned import mark_checked, odd_entry, place_problem, protected, relation, was_checked
from mechkit.model.checks.code import changed_code, code_state
from mechkit.model.checks.identity import model_key as identity_key
from mechkit.model.checks.integrity import changed_weight, weights_checksums
from mechkit.model.checks.state import (
    changed_handle,
    changed_state,
    changed_torch,
    handle_state,
    hooked,
    model_state,
    torch_state,
)
from mechkit.options.inputs import input_digests, input_paths
from mechkit.options.resolve import check_backend_for, check_seed, check_switches, resolve_options
from mechkit.plugin import Plugin, Result, RunContext
from mechkit.plugin_key import plugin_code

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mechkit.model.placement.request import Dispatch


@dataclass(frozen=True)
class RunSetup:
    """How a run loads its model: ``dispatch`` holds ``device_map``, ``max_memory`` and ``offload_folder`` as
    given (:func:`mechkit.load_model` checks them), ``runs_on`` the checked ``(backend, remote)``."""

    model: Any
    seed: int
    force: bool
    device: str | None
    dtype: str | None
    dispatch: Dispatch
    runs_on: tuple[str, str | None]
    reads: Any = None  # what the option checks read (mechkit.io.reads.Reads): carried into the run's record


@dataclass(repr=False)
class Run:
    """A finished run: the report dict and where it was written (None when not written).

    At a prompt it shows in a few lines (plugin, model, finding, where it is); in Jupyter it renders
    inline as the top of its ``report.html`` (:mod:`mechkit.report.inline`); :meth:`show` prints what
    the CLI prints after a run. ``figures`` holds an unwritten run's figures (``write=False``).
    """

    report: dict
    out_dir: Path | None
    figures: dict = field(default_factory=dict, compare=False)
    plugin: type[Plugin] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.report, dict):
            raise MechkitError(f"a Run holds a report dict, not {type(self.report).__name__}",
                               "get runs from mk.run(...) or mk.load_report(PATH)")

    @property
    def results(self) -> dict:
        return self.report["results"]

    @property
    def finding(self) -> str:
        """The plugin's one- or two-sentence finding ("" where it states none)."""
        return str(self.report.get("finding") or "")

    def __repr__(self) -> str:
        from mechkit.report.inline import report_text

        return "Run: " + report_text(self.report, self.out_dir)

    __str__ = __repr__

    def _repr_html_(self) -> str:
        from mechkit.report.inline import render_fragment

        return render_fragment(self.report, self.images(), report_tables(self.report, self.plugin), self.out_dir)

    def images(self) -> dict[str, bytes]:
        """The run's figures as PNG bytes: read from its directory, or drawn from ``figures`` when unwritten."""
        from mechkit.report.inline import report_images

        if self.out_dir is not None:
            return report_images(self.out_dir, self.report)
        from mechkit.report.views import png_name
        from mechkit.report.writer import figure_png

        return {png_name(n): figure_png(f) for n, f in self.figures.items()}

    def show(self, console=None) -> None:
        """Print the summary the CLI prints after a run: finding, tables, timings, where the report is."""
        from rich.console import Console

        from mechkit.report import print_summary

        console = console or Console()
        print_summary(self.report, console=console, tables=report_tables(self.report, self.plugin))
        if self.out_dir is not None:
            console.print(f"report: {self.out_dir}/report.json  ({self.out_dir}/report.html)", markup=False)


def load_run(path: str | Path) -> Run:
    """A written run read back from its directory (or its ``report.json``): the same :class:`Run` that
    :func:`run_plugin` returned, shown the same way at a prompt, in Jupyter and by :meth:`Run.show`.

    >>> import tempfile, mechkit as mk
    >>> out = tempfile.mkdtemp() + "/inspect"
    >>> _ = mk.run("inspect", model="tiny:gpt2", out=out)
    >>> run = mk.load_report(out)
    >>> run.results["anatomy"]["n_layers"], len(repr(run).splitlines()) <= 6
    (2, True)
    >>> 'src="data:image/png;base64,' in run._repr_html_()
    True
    """
    from mechkit.report import load_report

    if text_path(path) is None:
        raise MechkitError(f"mk.load_report takes a run directory or its report.json, not {type(path).__name__}",
                           "pass a path, e.g. mk.load_report(\"mechkit-runs/inspect-1\")")
    text = checked_text(path, "mk.load_report", 'mk.load_report("mechkit-runs/inspect-1")')  # "" is no run
    report = load_report(text)  # as text: "report.json/" is refused there, not read as the file
    from mechkit.report.show import run_dir_of

    return Run(report=report, out_dir=run_dir_of(text))


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _probe_logits(handle):
    """The logits of 16 fixed tokens, each dynamic RoPE run as loaded and put back after
    (:func:`~mechkit.model.checks.rope.ropes_as_loaded`): a 40-token forward a plugin ran grows its frequencies,
    which a 16-token probe on a model trained for 16 kept, and an unchanged model was refused on its logits."""
    import torch

    from mechkit.model.checks.rope import ropes_as_loaded
    from mechkit.model.checks.token_ids import position_rows

    gen = torch.Generator().manual_seed(1234)
    length = min(16, position_rows(handle.model) or 16)  # a 12-position table took no 16-token probe: every run refused
    ids = torch.randint(0, _text_vocab(handle), (1, length), generator=gen)
    with torch.no_grad(), ropes_as_loaded(handle.model):
        return handle(ids).float().cpu()


def _text_vocab(handle) -> int:
    """How many ids text can make: the tokenizer's length where it says, else the config's vocabulary. A padded
    table's rows past it are no token's: their zero rows gave a flat probe of a working model, and their random
    rows a varied probe of a model whose head is one value over every real token."""
    top = handle.model.config.vocab_size
    tok = getattr(handle, "tokenizer", None)
    with contextlib.suppress(TypeError, ValueError):
        top = min(top, len(tok)) if tok is not None and len(tok) >= 2 else top
    return top


def resume_dir(cls: type[Plugin], model_key: Any, params: dict, seed: int, inputs: dict | None = None) -> Path:
    """Where finished steps of this exact run are kept: keyed on everything that decides its result, the
    plugin, its version and its source (:func:`plugin_code`), mechkit's version, the options, the seed, the
    model's identity (weights, config, tokenizer, dtype, train mode, device and device map:
    :func:`mechkit.model.checks.identity.model_key`) and the content of the files its options name (``inputs``: :func:`mechkit.options.inputs.input_digests`)."""
    from mechkit import __version__
    from mechkit.io.disk_cache import cache_root

    execution = {o.name for o in cls.options if getattr(o, "execution", False)}  # how it runs, not what: resumable
    params = {k: v for k, v in params.items() if k not in execution}  # under another --executor or --workers
    parts = [cls.name, cls.version, __version__, plugin_code(cls), model_key, params, seed, library_versions()] + \
        ([inputs] if inputs else [])
    key = json.dumps(parts, sort_keys=True, default=str)
    return cache_root() / "runs" / hashlib.sha256(key.encode()).hexdigest()[:16]


def check_config(parsed: dict, spec: Any) -> None:
    """The option checks that need the model's config alone, made before the load where the spec gives the
    config cheaply (a tiny model, a local directory): ``--gqa group`` without KV groups waited for the load."""
    if parsed.get("gqa") != "group":
        return
    from mechkit.model.sources.peek import has_kv_groups, spec_config
    from mechkit.options.unread import gqa_before_load

    with quiet():  # as in check_pruned_before_load
        config = spec_config(spec)
    if config is not None:
        gqa_before_load(parsed, spec, has_kv_groups(config))


def run_model_key(handle: Any) -> dict:
    """The model's part of a run's resume key (:func:`mechkit.model.checks.identity.model_key`): its identity and
    how it runs, so a run killed on the CPU never resumes on steps a GPU computed, or the other way round."""
    return identity_key(handle)


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    """The versions of the libraries that compute a run's numbers (torch's kernels, transformers' model code,
    accelerate's placement, tokenizers' ids, peft's LoRA layers, scikit-learn's fits of task-selection and
    adapt): a rerun after an upgrade computes differently from the steps a killed run kept."""
    from importlib import metadata

    versions = {"python": platform.python_version()}  # its random module and its pydoc_data text (prune's calibration)
    for name in ("torch", "transformers", "accelerate", "numpy", "tokenizers", "peft", "scikit-learn"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def run_plugin(
    plugin: str | type[Plugin],
    *,
    model: Any = "llama",
    seed: int = 0,
    out: str | Path | None = None,
    force: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    device_map: Any = None,
    max_memory: Any = None,
    offload_folder: str | Path | None = None,
    backend: str | None = None,
    remote: str | None = None,
    write: bool = True,
    console=None,
    **options: Any,
) -> Run:
    """Run a plugin and write its report; returns the :class:`Run`.

    It prints nothing but progress: the run is the return value. Displayed (the last line of a Jupyter
    cell, ``display(run)``) it renders inline; ``print(run)`` gives its finding in a few lines and
    ``run.show()`` prints the summary the CLI prints (:func:`mechkit.report.print_summary`).

    Before the model loads: the options are checked, then ``out`` (:func:`mechkit.io.check_out`: not a
    file, not a read-only place, no report there without ``force``) and it is locked for the run
    (:func:`mechkit.io.outlock.out_lock`), so a second run with the same ``out`` fails at once instead of
    racing this one to the report. Without ``out`` a fresh directory under ``mechkit-runs/`` is taken, also locked.
    ``device_map``, ``max_memory`` and ``offload_folder`` spread a model larger than one device
    (:func:`mechkit.load_model`). ``backend="nnsight"`` runs the forwards as nnsight traces, with
    ``remote="ndif"`` on an NDIF server or ``remote="local"`` in its offline simulation; a plugin whose
    :attr:`~mechkit.plugin.Plugin.needs` the backend cannot serve is refused here, before any work.

    >>> import mechkit as mk
    >>> run = mk.run("inspect", model="tiny:gpt2", write=False)
    >>> run.results["anatomy"]["n_layers"]
    2
    """
    with one_line_errors():  # a full disk: the line the CLI prints, not an OSError traceback
        from rich.console import Console

        from mechkit import registry
        from mechkit.model.placement.request import Dispatch

        if console is not None and not isinstance(console, Console):
            raise MechkitError(f"console must be a rich Console, not {type(console).__name__}",
                               "pass console=rich.console.Console(stderr=True), or leave it out")
        console = console or Console(stderr=True)
        seed = check_seed(seed)
        check_switches(force=force, write=write)
        if not write and force and out is None:  # it would be ignored: nothing is written (out=: refused below)
            raise MechkitError("write=False writes nothing, so force= would be ignored",
                               "drop force=, or pass write=True to write the report")
        if not (isinstance(plugin, str) or (isinstance(plugin, type) and issubclass(plugin, Plugin))):
            raise MechkitError(f"plugin must be a plugin name or a Plugin subclass, not {type(plugin).__name__}",
                               "pass a name such as \"inspect\" (see `mechkit plugins list`) or your Plugin class")
        cls = registry.get(plugin) if isinstance(plugin, str) else plugin
        with recording() as early:  # what its option checks read: a step rests on it as on what the run reads
            params, parsed = resolve_options(cls, options, seed=seed)  # every check that needs no model, before it loads
        check_config(parsed, model)
        from mechkit.io.fs_errors import refuse_missing_cwd

        refuse_missing_cwd()  # before anything reads a model: a deleted working directory was a traceback
        check_pruned_before_load(cls, model)
        runs_on = check_backend_for(cls, backend, remote, model)
        check_execution(params, *runs_on)  # --workers without --executor ray, ray with nnsight, an unreachable cluster
        setup = RunSetup(model=model, seed=seed, force=force, device=device, dtype=dtype,
                         dispatch=Dispatch(device_map, max_memory, offload_folder), runs_on=runs_on, reads=early)
        if not write:
            if out is not None:  # it would be silently ignored: the caller expects files there
                raise MechkitError(f"out={str(out)!r} with write=False: nothing would be written there",
                                   "drop write=False to write the run to out, or drop out=")
            refuse_unwritten_files(cls, params)
            return _run(cls, params, parsed, None, setup, console)
        with contextlib.ExitStack() as stack:
            if out is not None:
                try:
                    out_dir = text_path(out)
                except Exception:  # noqa: BLE001 - a path object whose own __fspath__ raises
                    out_dir = None
                if out_dir is None:
                    raise MechkitError(f"out must be a path, not {type(out).__name__}", "pass out=\"runs/name\"")
                check_run_out(out_dir, force, (*model_inputs(model), *input_paths(cls, parsed)), cls.name, cls.writes(params))  # a file, a read-only place, a report without --force, another run's model: before any work
                if set(cls.writes(params)) & set(cls.prepared):  # saved in $TMPDIR first: not inside --out or the cache
                    refuse_tmpdir_inside(out_dir)
                stack.enter_context(out_lock(out_dir))
                check_run_out(out_dir, force, plugin=cls.name, writes=cls.writes(params))  # again under the lock: a run that finished there meanwhile wrote a report
            else:
                out_dir = stack.enter_context(locked_default_out(cls.name))
                if set(cls.writes(params)) & set(cls.prepared):
                    refuse_tmpdir_inside(out_dir, "the run's folder")
            return _run(cls, params, parsed, out_dir, setup, console)


def model_inputs(model: Any) -> tuple[Path | str, ...]:
    """The local model files a run reads, which its ``out`` must not be or hold: a path given as text, or the
    directory a loaded handle came from (``out=`` that directory with ``force=True`` replaced the weights
    the handle was loaded from, a saved model mechkit wrote being a set it owns)."""
    if isinstance(model, (str, Path)):
        try:
            return (model,) if Path(model).expanduser().exists() else ()
        except (OSError, RuntimeError):  # too long a name, ~user without a home: the loader says so in one line
            return ()
    source = getattr(model, "source", None)
    return (source,) if isinstance(source, Path) and source.exists() else ()


def locked_default_out(plugin: str) -> contextlib.AbstractContextManager[Path]:
    """A fresh default run directory for ``plugin`` under ``mechkit-runs/``, locked
    (:func:`mechkit.io.outlock.locked_fresh_dir`)."""
    from mechkit.report import default_out_dir

    return locked_fresh_dir(default_out_dir(plugin))


def report_tables(report: dict, cls: type[Plugin] | None = None, console=None) -> list:
    """The tables of a report as its plugin pivots them (``Plugin.tables`` on the JSON results).

    ``cls`` defaults to the installed plugin named in the report. Where it is not installed, or its
    hook fails on these results (:func:`mechkit.report.plugin_tables`), the results are shown generically.
    """
    from mechkit.report import generic_tables, plugin_tables

    results = report.get("results") or {}
    if cls is None:
        from mechkit import registry

        try:
            cls = registry.get(str(report.get("plugin", "")))
        except MechkitError:
            return generic_tables(results)
    return plugin_tables(cls, results, console)


def refuse_unwritten_files(cls: type[Plugin], params: dict) -> None:
    """An option that asks for files (prune's ``save_model=True``) under ``write=False``: the run built the pruned
    model and dropped it (a :class:`Run` holds no files), so the option was silently ignored."""
    for option in cls.options:
        if params.get(option.name) != option.default and \
                set(cls.writes({**params, option.name: option.default})) != set(cls.writes(params)):
            raise MechkitError(f"write=False writes nothing, so {option.name}={params[option.name]!r} (it saves "
                               f"{', '.join(cls.writes(params))}) would be ignored",
                               f"pass out= (write=True) to keep what it saves, or drop {option.name}=")


def _saves_weights(names: tuple[str, ...]) -> bool:
    """A run that saves a model (a ``model/`` folder or a ``.safetensors`` file among what it declares it
    writes): only then is the model's size held to ``ulimit -f``; a plugin declaring a table it writes is not."""
    return any(name.rstrip("/").split("/")[-1] == "model" or name.endswith(".safetensors") for name in names)


def _run(cls: type[Plugin], params: dict, parsed: dict, out_dir: Path | None, setup: RunSetup, console) -> Run:
    """Load the model, run the plugin, check the logits and write the report (when ``out_dir``)."""
    from mechkit.report.memory import reset_memory_peaks

    t0 = time.perf_counter()
    reset_memory_peaks()
    with heartbeat(console, f"{cls.name}: loading the model {setup.model}"):
        handle = _load(cls, setup)
    load_s = time.perf_counter() - t0
    check_pruned(cls, handle)
    if out_dir is not None and handle is not None and _saves_weights(cls.writes(params)):  # ulimit -f before the work
        refuse_over_file_size_limit(cls.saved_model_bytes(parsed, handle), f"the model {cls.name} saves in {out_dir}")
    _seed_everything(setup.seed)
    # A model on NDIF cannot be changed by a run (its weights are the server's): no probe jobs for it.
    probe = handle is not None and handle.backend.remote != "ndif"
    before = _probe_logits(handle) if probe else None
    if before is not None:
        refuse_non_finite_logits(handle, before)
    sums = weights_checksums(handle.model) if probe else None  # every weight, not just what 16 tokens reach
    state = model_state(handle.model, handle.tokenizer) if probe else None  # modules, hooks, modes, config: read directly
    if sums is not None:
        handle.forget_stale_sha256(sums)  # weights edited in place since it was computed
    model_key = run_model_key(handle) if handle is not None else str(setup.model)  # train mode included
    if state is not None:
        state["handle"] = handle_state(handle)  # its anatomy, origin and remembered hash: after the key computed it
        state["code"] = code_state(handle.model, handle, handle.tokenizer)  # the code its forward (and the handle's,
        # the tokenizer's) runs: a global swap shows
        state["torch"] = torch_state()  # torch's modes and numeric settings: process-wide, read directly
    inputs = input_digests(cls, parsed)  # a file replaced at the same path between a kill and the rerun
    with _resume(cls, model_key, params, setup.seed, inputs, state, console) as resume:
        ctx = RunContext(model=handle, params=params, seed=setup.seed, console=console, resume_dir=resume,
                         options=parsed)
        t1 = time.perf_counter()
        with _handed_over() as returned:  # what the plugin prepared and the report did not move in: removed
            with _said_if_changed(cls, handle, before, sums, state):
                returned.append(_call(cls, ctx, handle, console, setup.reads, skip=(
                    out_dir, *model_inputs(setup.model), *model_inputs(handle), *_input_files(cls, parsed))))
                result = check_result(cls, returned[0], out_dir, (*model_inputs(setup.model), *input_paths(cls, parsed)))
                checked = Result(results=result.results, figures=dict(result.figures), files=dict(result.files),
                                 finding=result.finding)  # the runner's own: the plugin holds the other
            run_s = time.perf_counter() - t1
            _check_unchanged(cls, handle, before, sums, state)
            report = _report(cls, params, setup, handle, checked,
                             {"load_s": round(load_s, 4), "run_s": round(run_s, 4)})
            report["checks"] = {"logits_unchanged": before is not None, "weights_unchanged": sums is not None,
                                "modules_unchanged": state is not None}
            tables = report_tables(report, cls, console) if out_dir is not None else None
            check_returned(cls, checked)  # after the plugin's last code, its tables hook
            if out_dir is not None:
                from mechkit.report import write_report

                mark_checked(checked.files)  # by check_returned just now: the writer does not walk them again
                try:
                    write_report(out_dir, report, figures=checked.figures, files=checked.files, force=setup.force,
                                 tables=tables)
                finally:
                    was_checked(checked.files)  # the mark is let go where the writer refused before reading it
        if resume is not None:
            _finish_steps(resume, console)  # the run finished: its resumable steps are done with
    return Run(report=report, out_dir=out_dir, figures={} if out_dir is not None else dict(checked.figures), plugin=cls)


@contextlib.contextmanager
def _handed_over() -> Iterator[list]:
    """The one place a run's prepared files end, however it ends (success, a refusal, an error, Ctrl-C,
    ``write=False``): each ``Path`` in the returned result's ``files`` (the list the block appends the plugin's
    return value to) that the report did not move in is removed and its lock let go, and so is a folder the
    plugin made (:func:`mechkit.io.leftovers.make_prepared_dir`) but never returned. A refused run left a whole
    pruned model in ``$TMPDIR`` per try, held by the live process, which no ``cache clear`` could remove."""
    from mechkit.io.leftovers import prepared_scope
    from mechkit.report.writer import discard_unmoved

    returned: list = []
    with prepared_scope():
        try:
            yield returned
        finally:
            if returned:
                discard_unmoved(getattr(returned[0], "files", None))


def _finish_steps(resume: Path, console) -> None:
    """Remove what the finished run kept in its steps folder, and nothing else: a user's file put there (the
    folder is the user's disk too) stays, said in one line. A run resumes from a folder holding such files
    (they change none of its steps); only its own files are ever deleted."""
    from mechkit.io.disk_cache import finish_run_dir

    if finish_run_dir(resume):
        console.print(f"mechkit: warning: {resume} holds files no mechkit run writes; the finished run removed only "
                      "its own steps there and left the rest (delete the folder yourself when done with them)",
                      markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _resume(cls: type[Plugin], model_key: Any, params: dict, seed: int, inputs: dict, state: dict | None,
            console) -> Iterator[Path | None]:
    """The run's locked resume directory, or None (nothing kept, nothing resumed) where the model carries a
    hook or a replaced ``forward`` (inside ``mk.ablate`` or the user's own hooks): its steps then depend on
    code no key can name, and a rerun without it must not pick them up."""
    if state is not None and hooked(state) is not None:
        yield None
        return
    with claimed(resume_dir(cls, model_key, params, seed, inputs), console) as resume:
        yield resume


_FIX = ("return mechkit.Result(results={...}, figures={name: matplotlib figure}, "
        "files={name: bytes, text or a Path of a file or directory it prepared})")


def check_result(cls: type[Plugin], result: Any, out: Path | None = None, inputs: tuple = ()) -> Result:
    """A plugin's return value as the report writer needs it, else one line naming the plugin (a third-party
    plugin returning None, or a figure that is not a matplotlib figure, failed in the writer as an
    AttributeError; a ``Path`` that is missing, a link or a FIFO failed there after the work, as "removed
    before it was moved in", which no rerun fixes; a hard link to the user's key was chmod'ed world-readable,
    a mount inside chmod'ed through: :func:`mechkit.io.returned.odd_entry`). A ``Path`` that is ``out`` (``--out``), holds it or lies
    inside it or inside mechkit's cache is refused too, and dropped from ``files`` so that nothing removes it
    (a folder holding ``--out`` was deleted whole, the user's files in it, after its rename into itself
    failed); so is one returned twice, or inside another returned one (the second move found it gone, a
    misleading "removed by a cleaner", and the first, a user's folder, was lost when the write then failed)."""
    fix = _FIX
    if not isinstance(result, Result):
        raise PluginError(f"plugin {cls.name!r} returned {type(result).__name__}, not a Result", fix)
    from mechkit.report.writer import outputs_problem, plain_outputs

    for what in ("figures", "files"):  # read once, as checked: plain names, plain absolute paths
        values = getattr(result, what)
        if isinstance(values, Mapping):
            try:
                setattr(result, what, plain_outputs(what, values))
            except MechkitError as err:
                raise PluginError(f"plugin {cls.name!r} returned {err.problem}", fix) from None

    problem = outputs_problem(result.figures, result.files)
    if problem is not None:
        raise PluginError(f"plugin {cls.name!r} returned {problem}", fix)
    _check_paths(cls, result, out, fix, inputs)
    return result


def check_returned(cls: type[Plugin], result: Result) -> None:
    """Refuse (one line) a returned ``Path`` that is or holds anything but the plugin's own plain files and
    folders (:func:`mechkit.io.returned.odd_entry`). Made after the last of the plugin's code (its ``tables``
    hook) and before the writer, which then does not walk them again: a hook that added a hard link to a
    user's file inside a folder already checked got it into the report."""
    for name, value in result.files.items():
        odd = odd_entry(value) if isinstance(value, Path) else None  # moved, chmod'ed and synced file by file
        if odd is not None:
            where = f"the path {value}" if odd[0] == value else f"the path {value}, which holds {odd[0]}"
            raise PluginError(f"plugin {cls.name!r} returned files[{name!r}] as {where}, which is {odd[1]}, not "
                              "a regular file or a directory of its own to move into the report", _FIX)


def _check_paths(cls: type[Plugin], result: Result, out: Path | None, fix: str, inputs: tuple = ()) -> None:
    """Refuse (one line) a returned ``Path`` that the writer's move would wreck or that is no prepared file:
    ``out`` itself, a folder holding it, one inside it or inside the cache, one that is or holds the temporary,
    working or home directory, or one path returned twice; each by resolved path and by device and inode
    (:func:`mechkit.io.returned.relation`: the home directory reached through a bind mount of its parent was
    moved into a report and deleted)."""
    places = protected(out, inputs)
    seen: dict[Any, str] = {}
    for name, value in result.files.items():
        if not isinstance(value, Path):
            continue
        real = Path(os.path.realpath(value))
        why = place_problem(real, places)
        if why is not None:
            result.files = {k: v for k, v in result.files.items() if not isinstance(v, Path)
                            or relation(v, real) != "is"}  # the user's: nothing may remove it
            raise PluginError(f"plugin {cls.name!r} returned files[{name!r}] as the path {value}, which {why}: "
                              "moving it into the report would destroy it", fix.replace(
                                  "it prepared", "it prepared in a temporary folder of its own"))
        key = _identity(real)
        if key in seen:
            raise PluginError(f"plugin {cls.name!r} returned the path {value} twice, as files[{seen[key]!r}] "
                              f"and files[{name!r}]: a prepared file can be moved into the report only once",
                              f"return each prepared path under one name; {fix}")
        seen[key] = name
    paths = [(name, value) for name, value in result.files.items() if isinstance(value, Path)]
    for name, value in paths:  # moving the outer one took the inner along: its move then found it gone
        inner = next((other for other in paths if other[0] != name and relation(other[1], value) == "is inside"), None)
        if inner is not None:
            raise PluginError(f"plugin {cls.name!r} returned files[{name!r}] as the path {value}, which holds "
                              f"files[{inner[0]!r}] ({inner[1]}): a prepared path can be moved into the report only "
                              "once", f"return the folder or the paths inside it, not both; {fix}")


def _identity(path: Path) -> Any:
    """``path``'s device and inode (one file under two names through a bind mount is one), else the path."""
    try:
        info = os.stat(path)
    except OSError:
        return path
    return info.st_dev, info.st_ino


PRUNED_WORDS = {"uneven-heads": "heads (layers keeping different numbers of them)"}


def pruned_kinds(handle) -> set[str]:
    """How the handle's model was physically pruned (``prune --save-model``): "neurons", "heads", "layers",
    and "uneven-heads" where its layers kept different numbers of heads (its anatomy says so)."""
    structure = getattr(getattr(handle, "model", None), "_mechkit_structure", None)
    if structure is None:
        return set()
    kinds = {"neurons": structure.mlp_keep, "heads": structure.head_keep, "layers": structure.layers_removed,
             "uneven-heads": handle.anatomy.ragged_heads}
    return {kind for kind, units in kinds.items() if units}


def check_pruned(cls: type[Plugin], handle) -> None:
    """Refuse (one line) a pruned model the plugin does not declare it handles (:attr:`Plugin.pruned`)."""
    check_pruned_kinds(cls, pruned_kinds(handle))


def check_pruned_before_load(cls: type[Plugin], spec: Any) -> None:
    """:func:`check_pruned` from the config alone, where the spec gives it cheaply (a local directory): a saved
    pruned model's ``mechkit_pruning`` entry says how it was pruned, and ``adapt`` refused one after the load."""
    from mechkit.model.sources.peek import pruned_kinds as config_kinds
    from mechkit.model.sources.peek import spec_config

    with quiet():  # its first import of the loader pulls in tqdm.auto, which warns in a notebook without ipywidgets
        config = spec_config(spec)
    kinds = config_kinds(config) if config is not None else None
    if kinds:
        check_pruned_kinds(cls, kinds)


def check_pruned_kinds(cls: type[Plugin], kinds: set[str]) -> None:
    """Refuse (one line) pruned ``kinds`` the plugin does not declare it handles (:attr:`Plugin.pruned`)."""
    missing = sorted(kinds - set(cls.pruned))
    if not missing:
        return
    why, fix = next((cls.pruned_why[k] for k in missing if k in cls.pruned_why),
                    ("it is not yet checked on pruned models",
                     "run it on the dense model, or use `mechkit inspect` on the pruned one"))
    words = [PRUNED_WORDS.get(kind, kind) for kind in missing if not (kind == "heads" and "uneven-heads" in missing)]
    raise PluginError(f"{cls.name} cannot run on a model with pruned {', '.join(words)}: {why}", fix)


@contextlib.contextmanager
def _said_if_changed(cls: type[Plugin], handle, before, sums: dict[str, int] | None, state: dict | None) -> Iterator[None]:
    """A plugin that failed (a MechkitError, a bug) after changing the model without undoing it: the error said
    only why it failed, and the caller's in-memory handle stayed changed unsaid (``mk.run(plugin, model=h)``).
    The unchanged check runs on the way out too, and its finding is added to the error (the cause chained)."""
    try:
        yield
    except Exception as err:
        try:
            _check_unchanged(cls, handle, before, sums, state)
        except PluginError as changed:
            raise PluginError(f"{changed.problem}, after it failed: {first_line(err)}", changed.fix) from err
        except Exception:  # the model cannot even be probed now: the plugin's own error says more
            pass
        raise


def refuse_non_finite_logits(handle, logits) -> None:
    """Refuse (one line) a model whose probe logits hold NaN or +inf before the plugin runs: its weights are
    finite (checked at load) but what it computes is not, from a config value (``rms_norm_eps`` <= 0) or
    activations beyond float16's range. The plugin did all its work on NaN, and the run then failed as "the
    plugin left the model changed" (NaN equals nothing). -inf alone is left alone (a vocabulary mask)."""
    import torch

    dtype = str(getattr(getattr(handle, "model", None), "dtype", "")).replace("torch.", "")
    name = getattr(handle, "name", None) or getattr(handle, "spec", "the model")
    if not bool((torch.isnan(logits) | (logits == float("inf"))).any()):
        _refuse_flat_logits(name, logits[..., :_text_vocab(handle)])
        return
    half = dtype in ("float16", "bfloat16")
    raise MechkitError(f"the model {name} computes {'NaN' if bool(torch.isnan(logits).any()) else 'inf'} logits "
                       f"on 16 probe tokens (in {dtype or 'its dtype'}) although its weights are finite, so nothing "
                       "it computes can be analysed",
                       ("load it in float32 (--dtype float32, dtype=\"float32\"): activations beyond float16's "
                        "range overflow; " if half else "") + "check config.json for a value that makes a norm or "
                       "softmax divide by zero or take a root of a negative (rms_norm_eps or layer_norm_eps <= 0) or "
                       "a rotary base of 0 (rope_theta, in rope_parameters or rope_scaling)"
                       + ("" if half else "; in float16, try --dtype float32 or bfloat16"))


def _refuse_flat_logits(name: str, logits) -> None:
    """Refuse (one line) a model whose probe logits are one value across the vocabulary text can make (a padded
    table's rows past it left out) at every position:
    finite weights so large that a norm's mean square overflows (1e38 squared is inf, and the norm then gives 0)
    made every logit 0, and detect reported flat scores with exit 0. No trained or random model does this."""
    if logits.numel() == 0 or logits.shape[-1] < 2:
        return
    flat = logits.amax(dim=-1) == logits.amin(dim=-1)
    if bool(flat.all()):
        raise MechkitError(f"the model {name} computes the same logit for every token at each of its probe positions "
                           f"(all {float(logits.reshape(-1)[0]):g}), so nothing it computes can be analysed",
                           "check its weights for values so large that a norm overflows (finite, but near 1e38) or "
                           "an output head (lm_head) of zeros, and load the weights the model was made with")


def _same_logits(a, b) -> bool:
    """Equal logits, NaN equal to NaN (a NaN the model computed before and after is no change)."""
    import torch

    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _check_unchanged(cls: type[Plugin], handle, before, sums: dict[str, int] | None, state: dict | None = None) -> None:
    """Refuse a run that left the model changed: a weight (every parameter in memory, checksummed), a hook,
    a replaced ``forward``, a module's train/eval mode or a config field (read directly:
    :mod:`mechkit.model.checks.state`), or the logits of 16 probe tokens (what the others cannot see, such
    as a buffer)."""
    what = changed_handle(state["handle"], handle) if state is not None and "handle" in state else None
    if what is not None:
        raise PluginError(f"plugin {cls.name!r} left the model changed ({what}; this in-memory model stays changed)",
                          "reload the model; the plugin did not undo it: report this as a bug in the plugin")
    what = changed_torch(state["torch"], torch_state()) if state is not None and "torch" in state else None
    if what is not None:
        raise PluginError(f"plugin {cls.name!r} left torch's global settings changed ({what}; every model in this "
                          "process computes differently now)",
                          "restore the setting (exit the mode: use it as `with mode:`), or restart the Python process: "
                          "report this as a bug in the plugin")
    what = (changed_code(state["code"], code_state(handle.model, handle, handle.tokenizer))
            if state is not None and "code" in state else None)
    if what is not None:
        raise PluginError(f"plugin {cls.name!r} left the code the model runs changed ({what}; every model in this "
                          "process computes differently now)",
                          "restart the Python process (reloading the model does not undo it): report this as a "
                          "bug in the plugin")
    if sums is not None:
        name = changed_weight(sums, weights_checksums(handle.model))
        if name is not None:
            raise PluginError(f"plugin {cls.name!r} left the model changed (weight {name} differs after the run; "
                              "this in-memory model stays changed)",
                              "reload the model; a weight edit was not undone: report this as a bug in the plugin")
    what = changed_state(state, model_state(handle.model, handle.tokenizer)) if state is not None else None
    if what is not None:
        raise PluginError(f"plugin {cls.name!r} left the model changed ({what}; this in-memory model stays changed)",
                          "reload the model; the plugin did not undo it: report this as a bug in the plugin")
    if before is None:
        return
    try:
        after = _probe_logits(handle)
    except Exception as err:  # its forward replaced by one that returns nothing, or raises: one line, not the raw error
        raise PluginError(f"plugin {cls.name!r} left the model changed (its forward now fails: {first_line(err)})",
                          "reload the model; the plugin did not undo it: report this as a bug in the plugin") from err
    if not _same_logits(after, before):
        raise PluginError(f"plugin {cls.name!r} left the model changed (logits differ after the run)",
                          "a hook or weight edit was not undone; report this as a bug in the plugin")


def _load(cls: type[Plugin], setup: RunSetup):
    """The run's model handle, placed and served as asked; ``None`` for a plugin that needs no model."""
    if not cls.needs_model:
        return None
    from mechkit.model import loading

    where = setup.dispatch
    return loading.load_model(setup.model, device=setup.device, dtype=setup.dtype, device_map=where.device_map,
                              max_memory=where.max_memory, offload_folder=where.offload_folder,
                              backend=setup.runs_on[0], remote=setup.runs_on[1])


def _input_files(cls: type[Plugin], parsed: dict) -> list:
    """The files options name, whose bytes are in the resume key (:func:`input_digests`): not recorded again. A
    folder an option names is keyed by its top level only, so what the run reads inside it is recorded."""
    return [p for p in input_paths(cls, parsed) if not os.path.isdir(p)]


def _call(cls: type[Plugin], ctx: RunContext, handle, console, before=None, skip: tuple = ()):
    """``cls().run(ctx)`` with a remote model's jobs shown live, the executor's workers stopped however it ends;
    third-party chatter off (:mod:`mechkit.io.quiet`) and a plain line every 30 s off a terminal. A run that
    keeps steps records the files it reads (:mod:`mechkit.io.reads`), but those under ``skip`` (``--out``, the
    model, the files options name: keyed otherwise) and mechkit's cache, so a resumed step checks them."""
    from mechkit.io.disk_cache import cache_root
    from mechkit.report.remote import remote_progress

    recorded = recording((cache_root(), *(p for p in skip if isinstance(p, (str, Path)))), before) \
        if ctx.resume_dir is not None else contextlib.nullcontext()
    with remote_progress(handle, console), quiet(), heartbeat(console, f"{cls.name}: running"), recorded:
        try:
            return cls().run(ctx)
        finally:
            ctx.close()


def _report(cls: type[Plugin], params: dict, setup: RunSetup, handle, result, timings: dict) -> dict:
    """The run's report: what ran, on which model, with which options, what it found and what it cost."""
    from mechkit.report import build_report
    from mechkit.report.memory import memory_peaks
    from mechkit.report.remote import remote_timings
    from mechkit.report.views import png_name, views_of

    return build_report(
        plugin=cls.name, plugin_version=cls.version,
        model=handle.info() if handle is not None else {"spec": str(setup.model)},
        params=params, seed=setup.seed, results=result.results,
        artifacts=[png_name(n) for n in result.figures] + list(result.files),
        timings={**timings, **remote_timings(handle), **memory_peaks()},
        nonfinite="error",  # a NaN metric is refused naming its key, never written as null
        finding=result.finding,
        views=views_of(result.figures),  # the heatmaps' numbers (and patterns), drawn interactively on the page
    )
