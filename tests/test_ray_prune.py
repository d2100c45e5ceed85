"""``prune --executor ray`` on a real local Ray cluster (2 CPUs): the guide × sparsity grid's rows equal
the serial run's in everything but timing, a worker killed mid-run included, and rows kept by a serial
run are read back, not measured again, by a Ray run (one step key for both).

Timing fields are measured on whichever worker ran the row (dense and pruned interleaved there), so
only they may differ. The cluster fixture is test_ray.py's pattern: torch on one thread, two
single-thread workers on the cluster's two CPUs, every worker process gone after teardown.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from tests.ray_cluster import KeptSteps, killing_a_busy_worker, ray_workers

TINY = {"model": "tiny:llama", "device": "cpu"}
RAY = {"executor": "ray", "workers": 2}
GRID = {"guide": "wanda,attribution@sensitivity", "sparsity": "0.2,0.4", "tasks": "capitalize", "n": 4,
        "calib": 3, "shots": 2, "repeats": 1, "timing_batch": 2}
TIMING = {"latency_s", "dense_latency_s", "latency_ratio", "speedup", "speedup_other_timing", "reconstruct_s"}


@pytest.fixture(scope="module")
def serial(cluster, tmp_path_factory) -> dict:
    """The serial run's results (torch on the cluster fixture's one thread, as the workers run)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MECHKIT_CACHE", str(tmp_path_factory.mktemp("serial-cache")))
        return mk.run("prune", **TINY, **GRID, write=False).results


def _untimed(results: dict) -> dict:
    """The results without what depends on where and when forwards were timed."""
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in results["rows"]]
    dense = {k: v for k, v in results["dense"].items() if k not in TIMING}
    summary = {k: v.rpartition(" | speedup")[0] for k, v in results["summary"].items()}
    return {**results, "rows": rows, "dense": dense, "summary": summary}


def _timed_in_one_process(row: dict) -> bool:
    """The row's ratios are its own latencies' (both timed on the worker that measured it)."""
    return row["latency_s"] > 0 and row["latency_ratio"] == pytest.approx(row["latency_s"] / row["dense_latency_s"]) \
        and row["speedup"] == pytest.approx(1 / row["latency_ratio"])


def test_the_prune_grid_on_two_workers_is_the_serial_run_but_timing(cluster, ray_cache, serial):
    spread = mk.run("prune", **TINY, **GRID, **RAY, write=False)
    assert spread.report["params"]["executor"] == "ray" and len(ray_workers()) == 2  # ran on two workers
    assert [(r["guide"], r["sparsity"]) for r in spread.results["rows"]] == \
           [(r["guide"], r["sparsity"]) for r in serial["rows"]]  # the serial order
    assert _untimed(spread.results) == _untimed(serial)  # accuracy, perplexity, params, FLOPs, plans: all equal
    assert all(_timed_in_one_process(r) for r in spread.results["rows"])


def test_a_worker_killed_mid_grid_costs_only_its_row(cluster, ray_cache, serial):
    with killing_a_busy_worker() as (killed, log):
        spread = mk.run("prune", **TINY, **GRID, **RAY, write=False, console=Console(file=log, width=200))
    assert killed, "no worker was caught measuring a row"
    assert f"(pid {killed[0]}) died running chunk" in log.getvalue()
    assert _untimed(spread.results) == _untimed(serial)


def test_rows_a_serial_run_kept_are_read_back_by_a_ray_run(cluster):
    """One step key for a row wherever it runs: a run stopped serially resumes on Ray (and back)."""
    from mechkit.executors import LoadSpec, map_units
    from mechkit.executors.ray_pool import RayExecutor
    from mechkit.pruning import PruneStudy
    from mechkit.pruning.grid import grid_rows

    handle = mk.load_model("tiny:llama", device="cpu")
    step = KeptSteps()
    computed = step.computed

    sizes = {"n_calib": 3, "n": 4, "shots": 2, "repeats": 1, "timing_batch": 2}
    levels = [{"neurons": 0.2}, {"neurons": 0.4}]
    first = PruneStudy(handle, ["capitalize"], step=step, **sizes).row("wanda", levels[0])  # then "killed"
    executor = RayExecutor(LoadSpec.of(handle), workers=2, chunk_size=1)
    computed.clear()
    try:
        study = PruneStudy(handle, ["capitalize"], step=step, **sizes)
        rows = grid_rows(study, ["wanda"], levels, lambda *a, **k: map_units(executor, step, *a, **k))
    finally:
        executor.close()
    assert rows[0] == first  # read back, timing included
    assert computed == [study.row_key("wanda", levels[1])]  # only the missing row was measured


def test_a_study_calibrated_on_other_weights_refuses_the_shared_scores():
    from mechkit.pruning import PruneStudy

    sizes = {"n_calib": 2, "n": 2, "shots": 2}
    handle = mk.load_model("tiny:llama", device="cpu")
    study = PruneStudy(handle, ["capitalize"], **sizes)
    shared = study.shared(["wanda"], [{"neurons": 0.2}])
    again = PruneStudy(mk.load_model("tiny:llama", device="cpu"), **shared["config"])
    again.adopt(shared)  # the same model, options and seed: the same calibration
    assert np.array_equal(again.scores("wanda").mlp, study.scores("wanda").mlp)
    other = mk.load_model("tiny:llama", device="cpu")
    with torch.no_grad():
        other.anatomy.mlp_out(0).weight.mul_(1.5)  # other weights than the run's
    with pytest.raises(MechkitError, match="calibrated the pruning study differently"):
        PruneStudy(other, **shared["config"]).adopt(shared)
