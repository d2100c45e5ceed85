"""Run a plugin end to end: resolve options, load the model, run, check, write the report.

The CLI and the Python API share this path, so ``mk.run("inspect", model="llama")`` and
``mechkit inspect --model llama`` produce the same report.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechkit.errors import PluginError, ReportExistsError
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
    through its parser. ``params`` keeps the values as given (typed): what the report records and
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
    return params, parsed


def resolve_params(cls: type[Plugin], options: dict[str, Any]) -> dict[str, Any]:
    """Every option of the plugin with its checked value: given, else the default; unknown ones rejected."""
    return resolve_options(cls, options)[0]


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


def _resume_dir(cls: type[Plugin], model_key: str, params: dict, seed: int) -> Path:
    """Where finished steps of this exact run (plugin, options, seed, model weights) are kept."""
    from mechkit.model.cache import cache_root

    key = json.dumps([cls.name, cls.version, model_key, params, seed], sort_keys=True, default=str)
    return cache_root() / "runs" / hashlib.sha256(key.encode()).hexdigest()[:16]


def run_plugin(
    plugin: str | type[Plugin],
    *,
    model: Any = "llama",
    seed: int = 0,
    out: str | Path | None = None,
    force: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    write: bool = True,
    console=None,
    **options: Any,
) -> Run:
    """Run a plugin and write its report; returns the :class:`Run`.

    >>> import mechkit as mk
    >>> run = mk.run("inspect", model="tiny:gpt2", write=False)
    >>> run.results["anatomy"]["n_layers"]
    2
    """
    from rich.console import Console

    from mechkit import registry
    from mechkit.report import build_report, default_out_dir, write_report

    console = console or Console(stderr=True)
    cls = registry.get(plugin) if isinstance(plugin, str) else plugin
    params, parsed = resolve_options(cls, options)  # every check that needs no model, before it loads
    out_dir = Path(out) if out is not None else (default_out_dir(cls.name) if write else None)
    if write and (out_dir / "report.json").exists() and not force:
        raise ReportExistsError(f"{out_dir} already holds a report", "pass --force to overwrite or choose another --out")
    t0 = time.perf_counter()
    handle = None
    if cls.needs_model:
        from mechkit.model import loading

        handle = loading.load_model(model, device=device, dtype=dtype)
    load_s = time.perf_counter() - t0
    _seed_everything(seed)
    before = _probe_logits(handle) if handle is not None else None
    model_key = handle.weights_sha256() if handle is not None else str(model)
    resume = _resume_dir(cls, model_key, params, seed)
    ctx = RunContext(model=handle, params=params, seed=seed, console=console, resume_dir=resume, parsed=parsed)
    t1 = time.perf_counter()
    result = cls().run(ctx)
    run_s = time.perf_counter() - t1
    if before is not None and not bool((_probe_logits(handle) == before).all()):
        raise PluginError(f"plugin {cls.name!r} left the model changed (logits differ after the run)",
                          "a hook or weight edit was not undone; report this as a bug in the plugin")
    report = build_report(
        plugin=cls.name, plugin_version=cls.version,
        model=handle.info() if handle is not None else {"spec": str(model)},
        params=params, seed=seed, results=result.results,
        artifacts=[f"{n}.png" for n in result.figures] + list(result.files),
        timings={"load_s": round(load_s, 4), "run_s": round(run_s, 4)},
    )
    report["checks"] = {"logits_unchanged": before is not None}
    if write:
        write_report(out_dir, report, figures=result.figures, files=result.files, force=force)
    shutil.rmtree(resume, ignore_errors=True)  # the run finished: its resumable steps are done with
    return Run(report=report, out_dir=out_dir if write else None)
