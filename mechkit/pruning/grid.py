"""The prune plugin's guide × sparsity grid as independent units of an executor (``--executor ray``).

Each row of the grid is a pruned copy measured on its own: plan, refit, held-out accuracy and
perplexity, and latency timed against the dense model in the same process. What the rows share and is
costly, or must be the same everywhere, is computed once by the run
(:meth:`~mechkit.pruning.PruneStudy.shared`: the guides' scores, measured sensitivities) and shipped to
the workers with the study's configuration. A worker rebuilds the study from that configuration on its
own copy of the model — calibration is deterministic from the model and the seed, and the worker
checks its calibration's fingerprint against the run's — adopts the shipped scores and measures
:meth:`~mechkit.pruning.PruneStudy.measure_row`. Each unit is kept under the step key
:meth:`~mechkit.pruning.PruneStudy.row` uses, so a run resumes across executors and its report is the
serial run's, timing aside.

Timing is measured where the row runs: dense and pruned forwards interleaved on one worker, so
``latency_ratio`` and ``speedup`` are same-process ratios wherever they ran. Workers sharing CPUs run at
the same time, so their absolute latencies (``latency_s``, ``dense_latency_s``) come out longer than a
serial run's; the ratios stay comparable.

>>> import mechkit as mk
>>> from mechkit.executors import SerialExecutor, map_units
>>> from mechkit.pruning import PruneStudy
>>> m = mk.load_model("tiny:llama")
>>> study = PruneStudy(m, ["capitalize"], n_calib=2, n=2, shots=2, repeats=1, timing_batch=2)
>>> rows = grid_rows(study, ["wanda"], [{"neurons": 0.25}],
...                  lambda *a, **k: map_units(SerialExecutor(m), None, *a, **k))
>>> rows[0]["params"] == study.row("wanda", {"neurons": 0.25})["params"]
True
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.pruning.study import PruneStudy

MapUnits = Callable[..., list]
"""``map_units(fn, shared, units, keys, on_result=None)``: a plugin's ``ctx.map_units``."""

_BUILT: dict[str, Any] = {}  # this process's last study: its model, configuration and the study itself


def grid_rows(study: PruneStudy, guides: Sequence[str], levels: Sequence[dict[str, float]], map_units: MapUnits,
              on_row: Callable[[], None] | None = None) -> list[dict]:
    """The rows of ``guides`` × ``levels`` (guide-major, as the serial loop), each measured as a unit of
    ``map_units``; ``on_row()`` is called as each arrives. The guides' scores and sensitivities are
    computed here first (steps of ``study``), once for all units."""
    pairs = [(guide, dict(level)) for guide in guides for level in levels]
    keys = [study.row_key(guide, level) for guide, level in pairs]
    unique = dict(zip(keys, pairs, strict=True))  # a guide or level given twice is measured once
    values = map_units(row_units, study.shared(guides, levels), [list(pair) for pair in unique.values()],
                       list(unique), on_result=None if on_row is None else lambda _i, _v: on_row())
    measured = dict(zip(unique, values, strict=True))
    return [study.labelled(guide, level, measured[key]) for (guide, level), key in zip(pairs, keys, strict=True)]


def row_units(handle: ModelHandle, shared: dict, units: list) -> Iterator[dict]:
    """Each unit ``[guide, level]`` -> :meth:`~mechkit.pruning.PruneStudy.measure_row` on ``handle``, with
    the study rebuilt from ``shared`` (:meth:`~mechkit.pruning.PruneStudy.shared`)."""
    study = study_for(handle, shared)
    for guide, level in units:
        yield study.measure_row(guide, level)


def study_for(handle: ModelHandle, shared: dict) -> PruneStudy:
    """The study ``shared`` describes, on ``handle``, with the shared scores adopted.

    A worker keeps its last study (calibration, held-out sets, token batches) for the next chunk on the
    same model and configuration: rebuilding it gives the same study, only later.
    """
    from mechkit.pruning.study import PruneStudy

    config = json.dumps(shared["config"], sort_keys=True)
    if _BUILT.get("handle") is not handle or _BUILT.get("config") != config:
        _BUILT.clear()
        _BUILT.update(handle=handle, config=config, study=PruneStudy(handle, **shared["config"]))
    study = _BUILT["study"]
    study.adopt(shared)
    return study
