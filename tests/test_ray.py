"""``--executor ray`` on a real local Ray cluster (2 CPUs): reports equal to the serial run's, a worker
killed mid-run by its PID included, and bad input refused in one line.

One cluster serves the module; its teardown stops it and checks no worker process outlives it. The
workers one run leaves up (same model, same session) serve the next, so the models load once. The
module runs torch on one thread: workers use the run's number of threads (CPU rounding can depend on
it), and two single-thread workers fit the cluster's two CPUs.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from rich.console import Console

import mechkit as mk
from tests.ray_cluster import KeptSteps, killing_a_busy_worker, ray_workers

TINY = {"model": "tiny:llama", "device": "cpu"}
RAY = {"executor": "ray", "workers": 2}
SWEEP = {"tasks": "capitalize", "n": 6, "shots": 1, "batch_size": 2}


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> str:
    """Two task-vector files of tiny:llama (for taskvec-sweep)."""
    from mechkit.taskarith import extract
    from tests.conftest import noisy_model_dir

    root = tmp_path_factory.mktemp("ray-vectors")
    base = mk.load_model("tiny:llama", device="cpu")
    files = [extract(base, noisy_model_dir(root / f"ft{i}", seed=i + 1), tasks=[task]).save(root / f"{task}.st")
             for i, task in enumerate(("capitalize", "lowercase"))]
    return ",".join(map(str, files))


PLUGINS = {
    "sweep": SWEEP,
    "ablate": {"tasks": "capitalize", "n": 4, "shots": 1, "heads": "random", "baseline_seeds": 3,
               "sweep": "1,2", "mode": "mean"},
    "taskvec-sweep": {"lambdas": "-1:1:0.5", "n": 3},
    "icl-vectors": {"tasks": "capitalize", "n": 3, "n_dev": 3, "n_contexts": 2, "n_cie": 2, "shots": 2,
                    "fv_scales": "1,2"},
}


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_a_ray_run_reports_what_the_serial_run_reports(cluster, ray_cache, vectors, plugin):
    options = {**PLUGINS[plugin], **({"vectors": vectors} if plugin == "taskvec-sweep" else {})}
    serial = mk.run(plugin, **TINY, **options, write=False)
    spread = mk.run(plugin, **TINY, **options, **RAY, write=False)
    assert spread.results == serial.results
    assert spread.report["params"]["executor"] == "ray" and len(ray_workers()) == 2  # the work ran on two workers


def test_a_worker_killed_mid_run_costs_nothing_but_its_chunk(cluster, ray_cache):
    options = {"tasks": "capitalize", "n": 16, "shots": 4, "batch_size": 1}  # 48 units in chunks of 6
    serial = mk.run("sweep", **TINY, **options, write=False)
    with killing_a_busy_worker() as (killed, log):
        spread = mk.run("sweep", **TINY, **options, **RAY, write=False, console=Console(file=log, width=200))
    assert killed, "no worker was caught running a chunk"
    assert f"(pid {killed[0]}) died running chunk" in log.getvalue()
    assert spread.results == serial.results


def test_finished_units_of_a_ray_run_are_resumed_not_redone(cluster, ray_cache):
    from mechkit.executors import LoadSpec, map_units
    from mechkit.executors.ray_pool import RayExecutor
    from mechkit.heads.effects import exact_units

    handle = mk.load_model("tiny:llama", device="cpu")
    prompts = mk.build_prompts("capitalize", n=4, shots=1, seed=0)
    units = [("clean", 0), ("layer", 0, 0), ("layer", 0, 1), ("clean", 1), ("layer", 1, 0), ("layer", 1, 1)]
    keys = [str(u) for u in units]
    step = KeptSteps()
    kept, computed = step.kept, step.computed

    executor = RayExecutor(LoadSpec.of(handle), workers=2, chunk_size=1)
    try:
        first = map_units(executor, step, exact_units, (prompts, 2), units, keys)
        for key in keys[1::2]:
            del kept[key]  # as if the driver died before those chunks came back
        computed.clear()
        arrived: list[int] = []
        again = map_units(executor, step, exact_units, (prompts, 2), units, keys,
                          on_result=lambda i, _v: arrived.append(i))
    finally:
        executor.close()
    assert again == first
    assert sorted(computed) == sorted(keys[1::2])  # only the lost units ran again (in any order)
    assert sorted(arrived) == list(range(6))  # every unit reported, the kept ones read back


def test_a_killed_ray_driver_resumes_from_its_finished_chunks(cluster, ray_cache, tmp_path):
    """The driver (a `mechkit sweep` joined to the cluster) is SIGKILLed once some chunks are kept; the
    same command, run again serially (executor options are not part of the resume key), finishes it."""
    import subprocess

    from mechkit.executors.ray_pool import release_workers

    release_workers()  # the cluster's 2 CPUs go to the driver's own workers
    options = {"tasks": "capitalize", "n": 16, "shots": 4, "batch_size": 1}  # 48 units
    args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    address = cluster.get_runtime_context().gcs_address
    code = "import sys; from mechkit.cli.main import main; main(sys.argv[1:])"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MECHKIT_CACHE": str(ray_cache)}
    driver = subprocess.Popen([sys.executable, "-c", code, "sweep", "--model", "tiny:llama", "--device", "cpu", *args,
                               "--executor", "ray", "--workers", "1", "--ray-address", address,
                               "--out", str(tmp_path / "run")], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(list(ray_cache.glob("runs/*/*.json"))) < 6 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait()
    kept = len(list(ray_cache.glob("runs/*/*.json")))
    assert 6 <= kept < 48 and not (tmp_path / "run" / "report.json").exists(), kept
    resumed = mk.run("sweep", **TINY, **options, out=tmp_path / "run")
    fresh = mk.run("sweep", **TINY, **options, write=False)  # the steps are gone now: computed afresh
    assert resumed.results == fresh.results


# ---- bad input: one line, exit 2, nothing written, the model never loaded --------------------------------

def _refused(capsys, monkeypatch, tmp_path, args: list[str], loads: bool = False) -> str:
    from mechkit.cli.main import main
    from mechkit.model import loading

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    if not loads:
        monkeypatch.setattr(loading, "_resolve", lambda *a, **k: pytest.fail("the model was loaded"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--model", "tiny:llama", "--device", "cpu", *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert not (tmp_path / "run").exists()
    return err[0]


@pytest.mark.parametrize(("args", "words"), [
    (["--executor", "ray", "--workers", "0"], "--workers 0 is below 1 — pass --workers 1 or more"),
    (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1 is unreachable"),
    (["--executor", "ray", "--ray-address", "head-node"], "'head-node' is not auto or HOST:PORT"),
    (["--workers", "2"], "--workers applies to --executor ray"),
])
def test_bad_execution_options_are_one_line(capsys, monkeypatch, tmp_path, args, words):
    assert words in _refused(capsys, monkeypatch, tmp_path, args)


def test_auto_with_no_cluster_answering_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # where `auto` looks first: nothing listens there
    line = _refused(capsys, monkeypatch, tmp_path, ["--executor", "ray", "--ray-address", "auto"])
    assert "--ray-address auto (" in line and ":1) is unreachable" in line and "ray start --head" in line


def test_without_ray_installed_the_line_says_how_to_install_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the extra looks like to import
    line = _refused(capsys, monkeypatch, tmp_path, ["--executor", "ray"])
    assert line == "mechkit: error: --executor 'ray': Ray is not installed — install it with pip install 'mechkit[ray]'"


def test_more_workers_than_the_cluster_holds_is_one_line(cluster, capsys, monkeypatch, tmp_path):
    line = _refused(capsys, monkeypatch, tmp_path, ["--executor", "ray", "--workers", "3"], loads=True)
    assert "the Ray cluster has 2 CPUs (2 on its largest node) and each worker runs torch on this run's 1 thread: " \
           "3 workers do not fit" in line
