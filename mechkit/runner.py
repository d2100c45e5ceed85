"""Run a plugin end to end: resolve options, check and lock ``--out``, load the model, run, check, write the report.

The CLI and the Python API share this path, so ``mk.run("inspect", model="llama")`` and
``mechkit inspect --model llama`` produce the same report.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechkit.errors import MechkitError, PluginError, ReportExistsError
from mechkit.executors import check_execution
from mechkit.io.quiet import quiet
from mechkit.plugin import Plugin, RunContext


@dataclass
class Run:
    """A finished run: the report dict and where it was written (None when not written)."""

    report: dict
    out_dir: Path | None

    @property
    def results(self) -> dict:
        return self.report["results"]


def resolve_options(cls: type[Plugin], options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, parsed)`` for every option of the plugin, checked before any model loads.

    Each value (given, else the default) is coerced to the option's declared type (text from the
    command line and numbers from Python alike), checked against its bounds and choices, and run
    through its parser, then the plugin's :meth:`~mechkit.plugin.Plugin.check_options` sees them
    together. ``params`` keeps the values as given (typed): what the report records and
    what reruns it; ``parsed`` holds the parsers' results (``ctx.parsed``). Unknown options and bad
    values raise :class:`~mechkit.options.OptionError` (a ``PluginError``) with one line.
    """
    known = {o.name: o for o in cls.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise PluginError(f"plugin {cls.name!r} has no option {', '.join(unknown)}",
                          f"its options are: {', '.join(known) or 'none'}")
    params, parsed = {}, {}
    for name, opt in known.items():
        params[name], parsed[name] = opt.check(options.get(name, opt.default))
    cls.check_options(parsed)
    return params, parsed


def resolve_params(cls: type[Plugin], options: dict[str, Any]) -> dict[str, Any]:
    """Every option of the plugin with its checked value: given, else the default; unknown ones rejected."""
    return resolve_options(cls, options)[0]


MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``0..2**63-1``, else one :class:`PluginError` line — before any model loads.

    >>> check_seed(7)
    7
    >>> try:
    ...     check_seed(10**30)
    ... except PluginError as err:
    ...     print(err)
    seed 1000000000000000000000000000000 is out of range — pass a whole number from 0 to 9223372036854775807
    """
    fix = f"pass a whole number from 0 to {MAX_SEED}"
    if isinstance(seed, bool) or not isinstance(seed, int):
        if isinstance(seed, str) and seed.strip().isdigit():
            return check_seed(int(seed))
        raise PluginError(f"seed must be a whole number, not {seed!r}", fix)
    if not 0 <= seed <= MAX_SEED:
        raise PluginError(f"seed {seed} is out of range", fix)
    return int(seed)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _probe_logits(handle):
    import torch

    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, handle.model.config.vocab_size, (1, 16), generator=gen)
    with torch.no_grad():
        return handle(ids).float().cpu()


def resume_dir(cls: type[Plugin], model_key: str, params: dict, seed: int) -> Path:
    """Where finished steps of this exact run (plugin, options, seed, model weights) are kept."""
    from mechkit.io.disk_cache import cache_root

    execution = {o.name for o in cls.options if getattr(o, "execution", False)}  # how it runs, not what: resumable
    params = {k: v for k, v in params.items() if k not in execution}  # under another --executor or --workers
    key = json.dumps([cls.name, cls.version, model_key, params, seed], sort_keys=True, default=str)
    return cache_root() / "runs" / hashlib.sha256(key.encode()).hexdigest()[:16]


def lock_path(out_dir: str | os.PathLike[str]) -> Path:
    """The lock file of a run writing ``out_dir``: hidden, beside it, never inside the report directory.

    >>> lock_path("runs/a").as_posix()
    'runs/.a.mechkit-lock'
    """
    out = Path(out_dir)
    return out.parent / f".{out.name}.mechkit-lock"


class OutInUseError(MechkitError):
    """Another mechkit run holds the lock of the same ``--out``."""


def _holder(fd: int) -> str:
    """The pid recorded in a lock file another run holds (it writes it just after locking)."""
    for _ in range(50):
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return ""
        if text:
            return text
        time.sleep(0.01)
    return ""


@contextlib.contextmanager
def out_lock(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the lock of ``out_dir`` for a run, or raise :class:`OutInUseError` (one line) at once.

    An ``flock`` on :func:`lock_path`, a hidden file beside ``out_dir`` holding the owner's pid: the
    kernel releases it when the process ends however it ends (``kill -9`` included), so a lock file a
    killed run left behind is simply taken over. The file is removed, still locked, when the run ends
    (success, error or Ctrl-C); a run that locked a file just removed this way sees it is no longer at
    the path and locks the new one, so two runs never both hold the lock. Missing parents of
    ``out_dir`` are created for the lock file, and removed again if the run leaves them empty.
    Where ``fcntl`` is missing (Windows) runs are not locked.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> with out_lock(out):
    ...     try:
    ...         with out_lock(out):
    ...             pass
    ...     except OutInUseError as err:
    ...         print(str(err).replace(str(out), "OUT").replace(str(os.getpid()), "N"))
    --out OUT is in use by another mechkit run (pid N) — wait for it or choose another --out
    >>> lock_path(out).exists()
    False
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield lock_path(out_dir)
        return
    path = lock_path(out_dir)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    try:
        for attempt in itertools.count():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # a parent another run had made was removed again as it ended
                if attempt < 100:
                    continue
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder(fd)
                os.close(fd)
                raise OutInUseError(f"--out {out_dir} is in use by another mechkit run"
                                    + (f" (pid {pid})" if pid else ""),
                                    "wait for it or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed this file as it finished: lock the one now at the path
    except OSError as err:
        _remove_empty(created)
        raise MechkitError(f"cannot lock --out {out_dir}: {err.strerror or type(err).__name__} ({path})",
                           "choose an --out in a writable directory") from err
    except BaseException:
        _remove_empty(created)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still locked: whoever opened it meanwhile retries on the new file
        os.close(fd)
        _remove_empty(created)  # those the run left empty (a written report keeps its parents)


def _remove_empty(dirs: list[Path]) -> None:
    """Remove the directories a failed run created (deepest first) while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


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
    backend: str = "native",
    remote: str | None = None,
    write: bool = True,
    console=None,
    **options: Any,
) -> Run:
    """Run a plugin and write its report; returns the :class:`Run`.

    Before the model loads: the options are checked, then ``out`` (:func:`mechkit.io.check_out`: not a
    file, not a read-only place, no report there without ``force``) and it is locked for the run
    (:func:`out_lock`), so a second run with the same ``out`` fails at once instead of racing this one
    to the report. Without ``out`` a fresh directory under ``mechkit-runs/`` is taken, also locked.
    ``device_map``, ``max_memory`` and ``offload_folder`` spread a model larger than one device
    (:func:`mechkit.load_model`). ``backend="nnsight"`` runs the forwards as nnsight traces, with
    ``remote="ndif"`` on an NDIF server or ``remote="local"`` in its offline simulation; a plugin whose
    :attr:`~mechkit.plugin.Plugin.needs` the backend cannot serve is refused here, before any work.

    >>> import mechkit as mk
    >>> run = mk.run("inspect", model="tiny:gpt2", write=False)
    >>> run.results["anatomy"]["n_layers"]
    2
    """
    from rich.console import Console

    from mechkit import registry

    console = console or Console(stderr=True)
    seed = check_seed(seed)
    cls = registry.get(plugin) if isinstance(plugin, str) else plugin
    params, parsed = resolve_options(cls, options)  # every check that needs no model, before it loads
    runs_on = _check_backend(cls, backend, remote, model)
    check_execution(params, *runs_on)  # --workers without --executor ray, ray with nnsight, an unreachable cluster
    if not write:
        return _run(cls, params, parsed, None, model=model, seed=seed, force=force, device=device, dtype=dtype,
                    dispatch=(device_map, max_memory, offload_folder), console=console, runs_on=runs_on)
    with contextlib.ExitStack() as stack:
        if out is not None:
            out_dir = Path(out)
            _check_out(out_dir, force)  # a file, a read-only place, a report without --force: before any work
            stack.enter_context(out_lock(out_dir))
            _check_out(out_dir, force)  # again under the lock: a run that finished there meanwhile wrote a report
        else:
            out_dir = stack.enter_context(locked_default_out(cls.name))
        return _run(cls, params, parsed, out_dir, model=model, seed=seed, force=force, device=device, dtype=dtype,
                    dispatch=(device_map, max_memory, offload_folder), console=console, runs_on=runs_on)


def _check_backend(cls: type[Plugin], backend: str | None, remote: str | None, model: Any) -> tuple[str, str | None]:
    """``(backend, remote)`` checked (names, the model spec, an API key) and the plugin's needs served."""
    from mechkit.model.backends.base import BackendError, check_backend, refusal
    from mechkit.model.backends.remotes import check_remote

    backend = check_backend(backend)
    remote = check_remote(remote, backend, model) if cls.needs_model else None
    loaded = getattr(getattr(model, "backend", None), "remote", None)  # a loaded handle runs where it was loaded
    line = refusal(getattr(cls, "needs", frozenset()), backend, remote or loaded, cls.name)
    if line is not None:
        raise BackendError(line)
    return backend, remote


def _check_out(out_dir: Path, force: bool) -> None:
    from mechkit.io import check_out

    if (out_dir / "report.json").exists() and not force:
        raise ReportExistsError(f"{out_dir} already holds a report", "pass --force to overwrite or choose another --out")
    check_out(out_dir, force=force, kind="dir")


@contextlib.contextmanager
def locked_default_out(plugin: str) -> Iterator[Path]:
    """A fresh default run directory, locked: two runs started in the same second get ``NAME`` and
    ``NAME-2`` instead of one failing."""
    from mechkit.report import default_out_dir

    base = default_out_dir(plugin)
    for n in range(1, 1000):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        if candidate.exists():
            continue
        _check_out(candidate, force=False)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(out_lock(candidate))
            except OutInUseError:
                continue
            if candidate.exists():  # made between the check and the lock
                continue
            yield candidate
            return
    raise MechkitError(f"no free run directory name beside {base}", "pass --out")


@contextlib.contextmanager
def _claimed(resume: Path, console) -> Iterator[Path | None]:
    """The run's resume directory, locked for it; ``None`` (with a warning) where another run of the same
    plugin, options, seed and model holds it, so two such runs never write or clear each other's steps."""
    try:
        lock = out_lock(resume)
        lock.__enter__()
    except OutInUseError:
        console.print(f"mechkit: warning: another run with the same options and model is keeping its steps in "
                      f"{resume}; this one keeps none (it will not resume if stopped)",
                      markup=False, highlight=False, soft_wrap=True)
        yield None
        return
    except MechkitError:  # an unwritable cache: RunContext.step warns once and the run goes on
        yield resume
        return
    try:
        yield resume
    finally:
        lock.__exit__(None, None, None)


def report_tables(report: dict, cls: type[Plugin] | None = None, console=None) -> list:
    """The tables of a report as its plugin pivots them (``Plugin.tables`` on the JSON results).

    ``cls`` defaults to the installed plugin named in the report. Where it is not installed, or its
    hook fails on these results (a report written by another version), the results are shown
    generically, with a one-line warning on ``console`` when the hook failed.
    """
    from mechkit.report import generic_tables

    results = report.get("results") or {}
    if cls is None:
        from mechkit import registry

        try:
            cls = registry.get(str(report.get("plugin", "")))
        except MechkitError:
            return generic_tables(results)
    try:
        return list(cls.tables(results))
    except Exception as err:  # a third-party hook's bug must not cost the run its report
        if console is not None:
            console.print(f"mechkit: warning: the tables of plugin {cls.name!r} failed ({type(err).__name__}: "
                          f"{err}); the report shows its results generically", markup=False, highlight=False)
        return generic_tables(results)


def remote_progress(handle, console):
    """Live progress of a remote model's jobs (:func:`mechkit.model.backends.jobs.progress`); nothing otherwise."""
    from mechkit.model.backends.jobs import progress

    return progress(getattr(handle.backend, "log", None) if handle is not None else None, console)


def remote_timings(handle) -> dict:
    """``server_queue_s``, ``server_run_s``, ``server_total_s`` of a remote model's jobs (the rest of what
    they reported — jobs, bytes, the server's meta and peak memory — is in ``model.backend.server``)."""
    log = getattr(handle.backend, "log", None) if handle is not None else None
    return log.timings() if log is not None else {}


def _reset_memory_peaks() -> None:
    """Start the peak-memory counters afresh — the kernel's RSS high-water mark (Linux
    ``/proc/self/clear_refs``) and each CUDA device's — so the report's peaks are this run's."""
    import torch

    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)


def _rss_high_water_mb() -> float:
    """The process's resident-memory high-water mark: ``VmHWM`` (reset per run) where Linux gives it,
    else ``ru_maxrss`` (the whole process's life)."""
    import resource
    import sys

    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return round(int(line.split()[1]) / 2**10, 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)


def memory_peaks() -> dict:
    """``peak_rss_mb``: the process's peak resident memory during the run (model loading and the
    model's weights included), and on CUDA ``peak_cuda{i}_mb``, each used device's peak allocated
    memory — what a user needs to size the next run."""
    import torch

    out = {"peak_rss_mb": _rss_high_water_mb()}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(i)
            if peak > 0:
                out[f"peak_cuda{i}_mb"] = round(peak / 2**20, 1)
    return out


def _run(cls: type[Plugin], params: dict, parsed: dict, out_dir: Path | None, *, model: Any, seed: int,
         force: bool, device: str | None, dtype: str | None, console, dispatch: tuple = (None, None, None),
         runs_on: tuple[str, str | None] = ("native", None)) -> Run:
    """Load the model, run the plugin, check the logits and write the report (when ``out_dir``)."""
    from mechkit.report import build_report, write_report

    write = out_dir is not None
    t0 = time.perf_counter()
    handle = None
    _reset_memory_peaks()
    if cls.needs_model:
        from mechkit.model import loading

        device_map, max_memory, offload_folder = dispatch
        handle = loading.load_model(model, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory,
                                    offload_folder=offload_folder, backend=runs_on[0], remote=runs_on[1])
    load_s = time.perf_counter() - t0
    _seed_everything(seed)
    # A model on NDIF cannot be changed by a run (its weights are the server's): no probe jobs for it.
    probe = handle is not None and handle.backend.remote != "ndif"
    before = _probe_logits(handle) if probe else None
    model_key = handle.weights_sha256() if handle is not None else str(model)
    with _claimed(resume_dir(cls, model_key, params, seed), console) as resume:
        ctx = RunContext(model=handle, params=params, seed=seed, console=console, resume_dir=resume, parsed=parsed)
        t1 = time.perf_counter()
        with remote_progress(handle, console), quiet():  # a remote model's jobs, live on a terminal
            try:
                result = cls().run(ctx)
            finally:
                ctx.close()  # stop the executor's workers, whatever happened
        run_s = time.perf_counter() - t1
        if before is not None and not bool((_probe_logits(handle) == before).all()):
            raise PluginError(f"plugin {cls.name!r} left the model changed (logits differ after the run)",
                              "a hook or weight edit was not undone; report this as a bug in the plugin")
        report = build_report(
            plugin=cls.name, plugin_version=cls.version,
            model=handle.info() if handle is not None else {"spec": str(model)},
            params=params, seed=seed, results=result.results,
            artifacts=[f"{n}.png" for n in result.figures] + list(result.files),
            timings={"load_s": round(load_s, 4), "run_s": round(run_s, 4), **remote_timings(handle),
                     **memory_peaks()},
            nonfinite="error",  # a NaN metric is refused naming its key, never written as null
            finding=result.finding,
        )
        report["checks"] = {"logits_unchanged": before is not None}
        if write:
            write_report(out_dir, report, figures=result.figures, files=result.files, force=force,
                         tables=report_tables(report, cls, console))
        if resume is not None:
            shutil.rmtree(resume, ignore_errors=True)  # the run finished: its resumable steps are done with
    return Run(report=report, out_dir=out_dir if write else None)
