"""Every benchmark's ``--quick`` mode runs: a smoke test that the scripts still work against today's API.

``python bench/NAME.py`` puts ``bench/`` first on the import path, so a bench named like a package it
imports would shadow that package (``bench/nnsight.py`` once did); no bench may share a name with an
importable module. Each bench runs in its own process, as a user runs it, with its output sent to a
temporary folder where the script takes ``--out``. ``--quick`` sizes are a smoke test, never a
measurement: nothing here reads the figures. A bench whose ``--quick`` still takes minutes on two shared
cores (the embedded model, a whole study, a Ray cluster) is skipped with that reason unless
``MECHKIT_BENCH_SMOKE=all``; every bench is checked to declare ``--quick`` either way.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
HELPERS = {"common"}  # imported by the benches, not run

# bench -> extra arguments beside --quick ({tmp}: a temporary folder); every bench file is listed here
ARGS: dict[str, list[str]] = {
    "activation_patching": ["--out", "{tmp}/out.json", "--threads", "1"],
    "adapt_reproduce": ["--out", "{tmp}/out.json"],
    "backend_equality": ["--out", "{tmp}/out.json", "--threads", "1"],
    "detect": ["--out", "{tmp}/out.json", "--threads", "1"],
    "gpu": ["--out", "{tmp}/out.json", "--threads", "1"],
    "icl_vectors": ["--tag", "smoke", "--threads", "1"],
    "load": ["--out", "{tmp}/out.json"],
    "memory": ["--out", "{tmp}/out.json", "--threads", "1"],
    "nnsight_backend": ["--out", "{tmp}/out.json", "--threads", "1"],
    "prune": ["--out", "{tmp}/out.json", "--save-dir", "{tmp}/model", "--threads", "1"],
    "prune_reproduce": ["--out", "{tmp}/out.json", "--threads", "1"],
    "ray_executor": ["--out", "{tmp}/out.json", "--threads", "1"],
    "sweep": ["--out", "{tmp}/out.json", "--threads", "1"],
    "taskarith_mergekit": [],
    "taskselect": ["--out", "{tmp}/out.json", "--threads", "1"],
    "taskarith_sweep": [],
    "timing_noise": ["--out", "{tmp}/out.json"],
}
# what a bench prints when something it compares against is not installed: the test then skips, saying so
ABSENT = {"taskarith_mergekit": "mergekit is not importable"}
# benches whose --quick cannot run in seconds on 2 shared cores, and why: skipped unless
# MECHKIT_BENCH_SMOKE=all (measured on 2 shared cores at load 5-7: icl_vectors --quick 7 min, adapt_reproduce
# 85 s, prune_reproduce 63 s)
HEAVY = {
    "activation_patching": "imports TransformerLens and builds a bridge: 48 s (its TL equality is in test_patching)",
    "adapt_reproduce": "runs a whole `mechkit adapt` study first (85 s)",
    "detect": "five worker processes, each loading the embedded model (and a TransformerLens bridge): 240 s",
    "gpu": "a GPU bench; on a CPU its tiny shape still takes 46 s (15 s of CPU)",
    "icl_vectors": "extracts task and function vectors on the embedded model (7 min)",
    "load": "times fresh-process loads of the embedded model, several times",
    "memory": "one worker process per plugin on the embedded model",
    "nnsight_backend": "every workload under four backends, each in its own process",
    "prune": "a pruning study with reconstruction, then a saved model re-measured in a new process",
    "prune_reproduce": "prunes tiny:llama with mechkit prune first (63 s)",
    "ray_executor": "starts a local Ray cluster and its workers",
    "taskselect": "starts a local Ray cluster and its workers, and fine-tunes under each executor",
    "sweep": "the exact and attribution sweeps, and TransformerLens hooks, on the embedded model",
}
TIMEOUT_S = 600


def _benches() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in HELPERS)


def test_every_bench_is_smoke_tested():
    assert set(_benches()) == set(ARGS), f"list every bench in ARGS: {sorted(set(_benches()) ^ set(ARGS))}"


def test_every_bench_takes_quick():
    """Each bench declares ``--quick`` (its own flag, or ``common.base_parser``'s), heavy ones included."""
    lacking = [name for name in ARGS
               if not any(t in (BENCH / f"{name}.py").read_text(encoding="utf-8") for t in ('"--quick"', "base_parser("))]
    assert not lacking, f"benches without --quick: {lacking}"


def test_no_bench_shadows_a_module():
    importable = {m.name for m in pkgutil.iter_modules()} | set(sys.stdlib_module_names)
    clashes = sorted(name for name in [*_benches(), *HELPERS] if name in importable)
    assert not clashes, f"bench files named like importable modules (rename them): {clashes}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARGS))
def test_quick_mode_runs(name, tmp_path):
    if name in HEAVY and os.environ.get("MECHKIT_BENCH_SMOKE") != "all":
        pytest.skip(f"bench/{name}.py --quick is minutes, not seconds, on 2 cores: {HEAVY[name]}; "
                    "MECHKIT_BENCH_SMOKE=all runs it")
    args = [a.replace("{tmp}", str(tmp_path)) for a in ARGS[name]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path)
    output = done.stdout + done.stderr
    if name in ABSENT and ABSENT[name] in output:
        pytest.skip(f"bench/{name}.py compared nothing: {ABSENT[name]} (see its docstring to install it)")
    assert done.returncode == 0, f"bench/{name}.py --quick failed:\n{output[-4000:]}"
