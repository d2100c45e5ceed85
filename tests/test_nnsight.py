"""The nnsight backend: the same primitives and plugins give the same results as native hooks.

Three executions of every check: ``native`` (PyTorch hooks), ``nnsight`` (each forward one trace,
in process) and ``nnsight --remote local`` — mechkit's strict simulation of an NDIF server: the trace
is serialised, deserialised and *executed* with mechkit unimportable, on the deserialised objects, and
only saved values come back. A pass there means everything the trace needs is shipped by value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.heads.effects import attribution_effects, exact_effects
from mechkit.hooking import gradients
from mechkit.interventions import ablate
from mechkit.model.backends.base import BackendError, refusal
from mechkit.model.backends.jobs import JobLog
from mechkit.model.backends.ndif import check_hosted, client_model, hosted_models, reporting_remote
from mechkit.model.backends.nnsight_backend import NnsightBackend, Trace
from mechkit.model.backends.weight_reads import read_weights
from mechkit.model.sources.tiny import tiny_families
from tests.conftest import cli_in_process

pytest.importorskip("nnsight")

RUNS = [("native", None), ("nnsight", None), ("nnsight", "local")]


def _load(family: str, backend: str, remote: str | None):
    return mk.load_model(f"tiny:{family}", device="cpu", backend=backend, remote=remote)


def _primitives(m) -> dict:
    """Every primitive plugins use, on one model: logits under each, and what was recorded."""
    ids = torch.tensor([[256, 104, 101, 108, 108, 111, 32, 119], [256, 104, 105, 33, 258, 258, 258, 258]])
    mask = (ids != 258).long()
    ref = torch.tensor([[256, 97, 98, 99, 100, 101], [256, 120, 121, 122, 32, 33], [256, 49, 50, 51, 52, 53]])
    out = {}
    names = ["blocks.*.attn.hook_z", "blocks.*.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.0.hook_attn_out",
             "blocks.1.mlp.hook_post", "blocks.0.hook_mlp_out", "blocks.*.attn.hook_pattern"]
    with torch.no_grad():
        out["plain"] = m(ids, attention_mask=mask)
        with mk.record(m, names) as cache:
            m(ids, attention_mask=mask)
        out.update({f"cache {n}": v for n, v in cache.items()})
        for mode in ("zero", "mean", "resample"):
            with ablate(m, "0.1,1.2,1.3", mode=mode, reference=ref, seed=3):
                out[mode] = m(ids, attention_mask=mask)
                out[mode + " again"] = m(ids, attention_mask=mask)  # resample: the generator moved on

        def flatten(p, _point):  # replace a pattern: uniform attention over the visible keys
            return (p > 0).to(p) / (p > 0).sum(-1, keepdim=True)

        def push(x, _point):  # a residual edit at one position
            x = x.clone()
            x[:, 2] += 1.0
            return x

        with mk.hooks(m, {"blocks.1.attn.hook_pattern": flatten, "blocks.0.hook_resid_post": push}):
            out["edited"] = m(ids, attention_mask=mask)
    return out


@pytest.mark.parametrize("family", tiny_families())
def test_primitives_equal_on_every_backend(family):
    results = {run: _primitives(_load(family, *run)) for run in RUNS}
    base = results[RUNS[0]]
    for run in RUNS[1:]:
        got = results[run]
        assert got.keys() == base.keys(), run
        for key, value in base.items():
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=f"{family} {run} {key}")
    assert not torch.equal(base["zero"], base["plain"]) and not torch.equal(base["edited"], base["plain"])
    assert not torch.equal(base["resample"], base["resample again"])


def test_one_trace_per_forward_and_the_model_untouched():
    m = _load("llama", "nnsight", "local")
    before = [p.detach().clone() for p in m.model.parameters()]
    _primitives(m)
    assert m.backend.traces == 1 + 1 + 2 + 3 + 3 + 1  # plain, record, zero ×2, (reference + 2) × 2 modes, edited
    assert all(torch.equal(a, b) for a, b in zip(before, m.model.parameters(), strict=True))
    assert m.backend.entries == []  # every hook context removed its functions
    assert m.info()["backend"]["remote"] == "local"


def test_gradients_equal_on_every_backend():
    ids = torch.tensor([[256, 10, 20, 30, 40, 50]])
    got = {}
    for run in RUNS:
        m = _load("gpt2", *run)
        value, grads = gradients(m, ["blocks.*.attn.hook_z", "blocks.1.hook_resid_pre"], ids,
                                            lambda logits: logits[:, -1].log_softmax(-1)[:, 7].sum())
        got[run] = (value, grads)
    base = got[RUNS[0]]
    for run in RUNS[1:]:
        torch.testing.assert_close(got[run][0], base[0])
        for name, (act, grad) in base[1].items():
            torch.testing.assert_close(got[run][1][name][0], act)
            torch.testing.assert_close(got[run][1][name][1], grad, atol=1e-6, rtol=1e-5)


def _diffs(a, b, path="results"):
    """(largest float difference, paths of non-float mismatches) between two result trees."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        out = [_diffs(a[k], b[k], f"{path}.{k}") for k in a]
        return max([0.0, *(d for d, _ in out)]), [m for _, ms in out for m in ms]
    if isinstance(a, list):
        assert len(a) == len(b), path
        out = [_diffs(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
        return max([0.0, *(d for d, _ in out)]), [m for _, ms in out for m in ms]
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b), []
    return 0.0, ([] if a == b else [f"{path}: {a!r} != {b!r}"])


SMALL = {"n": 6, "shots": 2, "batch_size": 4}
ABLATE = [  # every mode and head selection, rotated over the families
    {"heads": "0.1,1.2", "mode": "zero"},
    {"heads": "induction", "top_k": 2, "mode": "mean", "n_seqs": 4, "seg_len": 6},
    {"heads": "random", "top_k": 2, "mode": "resample"},
]


def _every_family() -> list[tuple[str, str, dict]]:
    """inspect, detect, ablate, sweep (exact and attribution) and icl-vectors on the tiny model of every family."""
    runs = []
    for i, family in enumerate(tiny_families()):
        model = f"tiny:{family}"
        runs += [
            ("inspect", model, {"repeats": 1, "seq_len": 16}),
            ("detect", model, {"n_seqs": 6, "seg_len": 8, "batch_size": 4}),
            ("ablate", model, {**SMALL, **ABLATE[i % len(ABLATE)], "baseline_seeds": 2, "tasks": "capitalize"}),
            ("sweep", model, {**SMALL, "method": "both"}),
            ("icl-vectors", model, {"tasks": "capitalize", "n": 4, "n_dev": 3, "n_contexts": 3, "n_cie": 2,
                                    "shots": 2, "top_k": 2, "fv_scales": "1,2", "batch_size": 8}),
        ]
    return runs


PLUGINS = [*_every_family(),
           ("ablate", "tiny:llama", {**SMALL, "heads": "0.1,1.2", "mode": "zero", "baseline_seeds": 2,
                                     "tasks": "capitalize,past-tense"})]


@pytest.mark.parametrize(("plugin", "model", "options"), PLUGINS, ids=[f"{p}-{m}" for p, m, _ in PLUGINS])
def test_plugins_equal_on_every_backend(plugin, model, options):
    """Exact-match accuracies and every other non-float value equal, scores within float tolerance."""
    runs = {run: mk.run(plugin, model=model, device="cpu", write=False, backend=run[0], remote=run[1], **options)
            for run in RUNS}
    base = runs[RUNS[0]]
    for run in RUNS[1:]:
        results, expected = dict(runs[run].results), dict(base.results)
        if plugin == "inspect":  # the timed forward differs between runs; the rest must not
            results.pop("forward"), expected.pop("forward")
        largest, mismatches = _diffs(results, expected)
        assert not mismatches, (run, mismatches[:5])
        assert largest <= 1e-5, (run, largest)
        assert runs[run].report["model"]["backend"]["traces"] > 0
        assert runs[run].report["checks"]["logits_unchanged"]


def test_the_simulation_is_strict():
    """The simulated server has no mechkit: code that reaches for it there (a lazy import) fails, as on NDIF."""
    m = _load("llama", "nnsight", "local")

    def lazy(view):
        import mechkit  # noqa: F401 - what a server cannot do

        return view.anatomy.n_layers

    with pytest.raises(ModuleNotFoundError, match="mechkit"):
        read_weights(m, lazy)
    assert "mechkit.hooking" in sys.modules  # hidden only while the request was on the "server"
    assert read_weights(m, lambda view: view.anatomy.n_layers) == 2
    assert [job.statuses[-1][0] for job in m.backend.log.jobs] == ["ERROR", "COMPLETED"]


WHITELIST_RUNS = [
    ("detect", {"n_seqs": 4, "seg_len": 6, "batch_size": 4}),
    *[("ablate", {"heads": "0.1,1.2", "mode": mode, "tasks": "capitalize", "n": 4, "shots": 2, "batch_size": 4,
                  "baseline_seeds": 1}) for mode in ("zero", "mean", "resample")],
    ("sweep", {"method": "both", "n": 4, "shots": 2, "batch_size": 4}),
    ("icl-vectors", {"tasks": "capitalize", "n": 4, "n_dev": 3, "n_contexts": 3, "n_cie": 2, "shots": 2, "top_k": 2,
                     "fv_scales": "1", "batch_size": 8}),
]


def test_requests_stay_within_the_ndif_whitelist():
    """Every request of detect, ablate (zero, mean, resample), sweep (exact and attribution) and icl-vectors
    is unpickled as NDIF's Protector would (mechkit.model.backends.whitelist: any module, module object or builtin
    outside the server's whitelist refused, no bytecode) and runs with the server's builtins only."""
    from mechkit.model.backends.whitelist import NNSIGHT_OWN, may_unpickle

    m = _load("llama", "nnsight", "local")
    for plugin, options in WHITELIST_RUNS:
        mk.run(plugin, model=m, write=False, backend="nnsight", **options)
    jobs = m.backend.log.jobs
    assert len(jobs) > 10 and all(job.statuses[-1][0] == "COMPLETED" and job.named for job in jobs)
    named = set().union(*(job.named for job in jobs))
    assert all(may_unpickle(module) for module in named), named
    assert not {"dataclasses", "nnsight", "sys", "types", "functools", "transformers"} & named
    assert {"torch", "einops.einops"} <= named  # shipped code is torch and einops
    assert {n for n in named if n.startswith("nnsight")} <= {n for n, _ in NNSIGHT_OWN} | {"nnsight.intervention.envoy"} \
        | {n for n in named if n.startswith("nnsight.modeling.")}


def _one(lm):
    return 1


def test_nnsight_itself_names_only_its_own_modules():
    """What nnsight 0.8's serialiser names in every request — a bare trace, a session shipping a function —
    is on NDIF's lists or in mechkit.model.backends.whitelist.NNSIGHT_OWN, and NNSIGHT_OWN holds nothing it does not name."""
    from mechkit.model.backends.whitelist import NNSIGHT_OWN, may_unpickle

    m = _load("llama", "nnsight", "local")
    m.backend.run(torch.tensor([[256, 1, 2]]))
    assert m.backend.call(_one) == 1
    named = set().union(*(job.named for job in m.backend.log.jobs))
    assert all(may_unpickle(module) for module in named), named
    assert {n for n, _ in NNSIGHT_OWN} <= named


@dataclass
class _Edit:
    scale: float


def test_the_simulation_refuses_what_ndif_refuses():
    """A hook shipping a dataclass, importing a module off the whitelist, or calling a builtin NDIF removes
    fails under --remote local, as on the server; plain code over torch passes."""
    m = _load("llama", "nnsight", "local")
    ids = torch.tensor([[256, 104, 105, 33]])
    edit = _Edit(2.0)

    def scaled(x, _point):
        return x * edit.scale

    def imports(x, _point):
        import functools  # noqa: F401 - not on NDIF's whitelist

        return x

    def opens(x, _point):
        return x if callable(open) else None

    for fn, message in ((scaled, "names dataclasses"), (imports, "functools is not whitelisted"),
                        (opens, "'open' is not defined")):
        with pytest.raises(Exception, match=message), mk.hooks(m, {"blocks.0.hook_resid_post": fn}):
            m(ids)
        assert m.backend.log.jobs[-1].statuses[-1][0] == "ERROR"
    with torch.no_grad(), mk.hooks(m, {"blocks.0.hook_resid_post": lambda x, _point: x * 2.0}):
        m(ids)
    assert m.backend.log.jobs[-1].statuses[-1][0] == "COMPLETED"


def test_refusals_name_what_is_missing():
    assert refusal({"patterns", "gradients"}, "nnsight", "local", "detect") is None
    assert refusal({"weight_writes"}, "nnsight", None, "shuffle") is None
    line = refusal({"weight_writes", "module_calls"}, "nnsight", "local", "prune")
    assert "weight writes" in line and "partial forwards" in line and "--backend native" in line
    assert "\n" not in line
    with pytest.raises(BackendError, match="unknown backend 'jax'"):
        mk.load_model("tiny:llama", backend="jax")
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model("llama")
    with pytest.raises(BackendError, match="model object"):
        mk.run("detect", model=model, write=False, backend="nnsight", remote="local")
    remote = _load("llama", "nnsight", "local")  # a loaded handle is refused for where it runs
    with pytest.raises(BackendError, match="plugin 'shuffle' needs reading weights here, weight writes, which the nnsight --remote local"):
        mk.run("shuffle", model=remote, write=False, backend="nnsight")
    line = refusal({"weight_reads"}, "nnsight", "ndif", "my-probe")
    assert "needs reading weights here, which" in line and "weights live on the server" in line
    assert refusal({"weight_reads"}, "nnsight", None, "my-probe") is None


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mechkit.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "message"), [
    (["detect", "--model", "tiny:llama", "--backend", "jax"], "'jax' is not one of"),
    (["detect", "--model", "tiny:llama", "--remote", "local"], "needs the nnsight backend"),
    (["detect", "--model", "{dir}", "--backend", "nnsight", "--remote", "local"], "local directory"),
    (["detect", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "ndif"], "not hosted on NDIF"),
    (["detect", "--model", "org/model", "--backend", "nnsight", "--remote"], "no NDIF API key"),
    (["detect", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local", "--reference", "transformer_lens"],
     "has no local weights to build a TransformerBridge"),
    # Ray fans out over local model copies; on nnsight the work runs as traces (one job per batch group)
    (["sweep", "--model", "tiny:llama", "--backend", "nnsight", "--executor", "ray"], "drop --executor ray"),
    (["ablate", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local", "--executor", "ray",
      "--workers", "2"], "drop --executor ray"),
])
def test_bad_backend_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    env = {"NDIF_API_KEY": "", "NNSIGHT_CONFIG": str(tmp_path / "none.yaml")}
    result = _cli(*args, "--out", str(out), env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


# Every plugin that reads or writes the model's weights in this process, or calls its blocks one by one:
# refused under --remote local (as on NDIF, where the weights are the server's) before any work.
WEIGHT_PLUGINS = [("shuffle", "reading weights here, weight writes"),
                  ("taskvec-sweep", "reading weights here, weight writes"),
                  ("compose", "needs partial forwards"), ("adapt", "needs partial forwards"),
                  ("prune", "needs partial forwards"), ("finetune", "weights live on the server")]


@pytest.mark.parametrize(("plugin", "message"), WEIGHT_PLUGINS, ids=[p for p, _ in WEIGHT_PLUGINS])
def test_plugins_on_the_weights_are_refused_remotely(tmp_path, plugin, message):
    out = tmp_path / "run"
    extra = []
    if plugin == "taskvec-sweep":  # its required vectors (never read: the refusal comes first)
        paths = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
        for path in paths:
            path.write_bytes(b"")
        extra = ["--vectors", ",".join(map(str, paths))]
    result = cli_in_process(plugin, "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local", *extra,
                            "--out", str(out))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"plugin '{plugin}' needs" in lines[0] and message in lines[0], result.stderr
    assert "--backend native" in lines[0] and not out.exists()


def test_a_model_loaded_on_nnsight_refuses_ray():
    """A handle loaded on nnsight, passed to a run asking for Ray: refused when the executor opens."""
    from mechkit.options import OptionError

    handle = _load("llama", "nnsight", None)
    with pytest.raises(OptionError, match="drop --executor ray"):
        mk.run("ablate", model=handle, write=False, backend="nnsight", executor="ray", heads="0.1", tasks="capitalize", n=2,
               shots=1, baseline_seeds=1, batch_size=2)


def test_unreachable_ndif_server_is_one_line(tmp_path):
    out = tmp_path / "run"
    env = {"NDIF_API_KEY": "not-a-key", "NDIF_HOST": "http://127.0.0.1:9", "NNSIGHT_CONFIG": str(tmp_path / "n.yaml")}
    result = _cli("detect", "--model", "org/model", "--backend", "nnsight", "--remote", "--out", str(out), env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the NDIF server" in lines[0], result.stderr
    assert not out.exists() and not Path(str(out) + ".mechkit-lock").exists()


def test_nnsight_leaves_the_tokenizer_right_padded():
    native, traced = _load("llama", "native", None), _load("llama", "nnsight", None)
    texts = ["hello world", "hi"]
    assert torch.equal(native.to_tokens(texts), traced.to_tokens(texts))
    with torch.no_grad():
        assert torch.equal(native(native.to_tokens("abc")), traced(traced.to_tokens("abc")))


def test_weights_of_a_model_on_ndif_are_refused_in_one_line():
    """The NDIF client holds the model's structure only: a step that reads a weight says so."""
    from transformers import AutoModelForCausalLM

    from mechkit.model.anatomy import discover_anatomy
    from mechkit.model.modules.linear import weight_out_in
    from mechkit.model.sources.tiny import tiny_model

    config = tiny_model("llama")[0].config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    for module in model.modules():  # as connect_ndif marks the client's copy
        module.__dict__["_mechkit_remote"] = "org/model"
    with pytest.raises(BackendError, match="stay on the NDIF server"):
        weight_out_in(discover_anatomy(model).attn_out(0))


def test_an_unhosted_model_names_what_the_server_hosts():
    """From the server's /status reply (as nnsight reads it): deployed models are listed, others refused."""
    state = {"deployments": {"a": {"repo_id": "org/hosted", "deployment_level": "HOT", "application_state": "RUNNING"},
                             "b": {"repo_id": "org/warm", "deployment_level": "WARM"},
                             "c": {"repo_id": "org/cold", "deployment_level": "COLD"}}}
    assert hosted_models(state) == ["org/hosted", "org/warm"]
    check_hosted("org/warm", state)
    check_hosted("org/any", {})  # a server that lists nothing says nothing: the job will answer
    with pytest.raises(BackendError, match="NDIF does not host org/cold right now — use one it hosts: "
                                           "org/hosted, org/warm$"):
        check_hosted("org/cold", state)


def test_a_hosted_model_the_client_cannot_build_is_one_line(monkeypatch):
    """The client reads the model's config from the hub; offline (as here) that is one line."""
    import huggingface_hub.constants

    from mechkit.errors import ModelLoadError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1, read at import
    with pytest.raises(ModelLoadError, match="cannot build org/hosted for NDIF") as err:
        client_model("org/hosted")
    assert "\n" not in str(err.value)


def test_a_job_against_an_unreachable_server_is_one_line(monkeypatch):
    """nnsight's own NDIF client, pointed at a closed port: every kind of job builds and serialises its
    request for the server, then fails with one line."""
    import nnsight

    monkeypatch.setattr(nnsight.CONFIG.API, "HOST", "http://127.0.0.1:9")
    monkeypatch.setattr(nnsight.CONFIG.API, "APIKEY", "not-a-key")
    m = _load("llama", "nnsight", None)
    backend = NnsightBackend(m.backend.lm, "ndif")
    backend.job_key = 'nnsight.modeling.transformers.TransformersModel:{"repo_id": "org/model"}'  # no hub here
    ids = torch.tensor([[256, 1, 2, 3]])
    jobs = [lambda: backend.run(ids), lambda: backend.run_group([Trace(ids), Trace(ids)]),
            lambda: backend.call(lambda lm: 1)]
    for job in jobs:
        with pytest.raises(BackendError, match=r"^cannot reach the NDIF server at http://127.0.0.1:9 \(") as err:
            job()
        assert "\n" not in str(err.value)
    assert [j.traces for j in backend.log.jobs] == [1, 2, 0]
    assert all(j.request_bytes > 0 for j in backend.log.jobs)


def test_what_ndif_reports_lands_in_the_log():
    """Each status update nnsight's NDIF client receives (its own message type) reaches the job log."""
    from nnsight.intervention.backends.remote import RemoteError
    from nnsight.schema.response import ResponseModel

    log = JobLog("ndif")
    remote = reporting_remote(_load("llama", "nnsight", None).backend.lm, log, 3, model_key="key")
    for status in ("RECEIVED", "QUEUED", "RUNNING"):
        remote.note(ResponseModel(id="job", status=status))
    remote.note(ResponseModel(id="job", status="LOG", description="trace 1/3 done"))
    remote.note(ResponseModel(id="job", status="COMPLETED", meta={"gpu_mem": 2.5e9, "execution_time": 0.4}))
    summary = log.summary()
    assert (summary["jobs"], summary["traces"], summary["peak_memory"]) == (1, 3, 2.5e9)
    assert summary["meta"] == {"gpu_mem": 2.5e9, "execution_time": 0.4}
    assert set(log.timings()) == {"server_queue_s", "server_run_s", "server_total_s", "server_peak_memory"}
    assert log.timings()["server_total_s"] >= log.timings()["server_run_s"] >= 0
    assert log.jobs[0].logs == ["trace 1/3 done"]
    assert [s for s, _ in log.jobs[0].statuses] == ["RECEIVED", "QUEUED", "RUNNING", "COMPLETED"]
    with pytest.raises(RemoteError):  # the backend turns it into one line (test above)
        remote.note(ResponseModel(id="job", status="ERROR", description="Traceback ...\nCUDA out of memory"))


def _prompts():
    from mechkit.eval.evaluation import task_prompts

    return task_prompts(["capitalize"], 6, 2, 0)["capitalize"]  # two batches of 4


def _effects(m, prompts, step=None) -> tuple:
    return exact_effects(m, prompts, 4, step=step), attribution_effects(m, prompts, 4, step=step)


def test_a_sweep_is_one_remote_job_and_equal_to_trace_by_trace():
    """Grouped into sessions (one job per method) the sweep gives exactly the trace-by-trace results, and
    native's within float tolerance; the job streams one progress line per trace."""
    prompts = _prompts()
    base = _effects(_load("llama", "native", None), prompts)
    found = {}
    for per_job in (None, 1):
        m = _load("llama", "nnsight", "local")
        if per_job is not None:
            m.backend.traces_per_job = per_job
        found[per_job] = (*_effects(m, prompts), m.backend.log)
    exact_traces = 2 * (1 + 2)  # per batch: the clean forward and one per layer
    grouped, single = found[None], found[1]
    assert [job.traces for job in grouped[2].jobs] == [exact_traces, 2]
    assert [job.traces for job in single[2].jobs] == [1] * (exact_traces + 2)
    assert grouped[2].jobs[0].logs == [f"trace {i}/{exact_traces} done" for i in range(1, exact_traces + 1)]
    for i in (0, 1):
        assert np.array_equal(grouped[i].logprob, single[i].logprob) and grouped[i].clean_logprob == single[i].clean_logprob
        np.testing.assert_allclose(grouped[i].logprob, base[i].logprob, atol=1e-5)
    assert np.array_equal(grouped[0].accuracy, single[0].accuracy)
    assert np.array_equal(grouped[0].accuracy, base[0].accuracy)
    assert grouped[2].summary()["result_bytes"] < 20_000  # per-row metrics come back, not logits


def test_a_grouped_sweep_resumes_from_its_steps():
    """Steps keep (batch, layer) units as natively: a sweep stopped in a job runs only what is missing."""
    prompts = _prompts()
    store: dict = {}

    def step(key, compute):
        if key not in store:
            store[key] = compute()
        return store[key]

    m = _load("llama", "nnsight", "local")
    first = _effects(m, prompts, step)
    lost = ["exact|batch1|layer1", "attribution|batch1"]
    for key in lost:
        del store[key]
    jobs = len(m.backend.log.jobs)
    again = _effects(m, prompts, step)
    assert [job.traces for job in m.backend.log.jobs[jobs:]] == [1, 1]
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.logprob, b.logprob)
    jobs = len(m.backend.log.jobs)
    _effects(m, prompts, step)
    assert len(m.backend.log.jobs) == jobs  # all stored: nothing goes to the server


def test_remote_runs_report_the_server_timings():
    run = mk.run("sweep", model="tiny:llama", device="cpu", write=False, backend="nnsight", remote="local",
                 method="exact", n=4, shots=2, batch_size=4)
    timings, server = run.report["timings"], run.report["model"]["backend"]["server"]
    assert timings["server_total_s"] >= timings["server_run_s"] > 0 and timings["server_queue_s"] >= 0
    assert (server["where"], server["jobs"], server["traces"]) == ("local", 1, 3)  # the runner's probes not counted
    assert server["request_bytes"] > 0 and server["result_bytes"] > 0


def test_weight_reads_run_where_the_weights_are():
    """W_O norms, OV copying scores and a function vector: read on the (simulated) server, one job each."""
    from mechkit.actvec import function_vector
    from mechkit.heads.norms import head_out_norms
    from mechkit.heads.scores import ov_copying_scores
    from mechkit.model.headspec import Head

    native, remote = _load("llama", "native", None), _load("llama", "nnsight", "local")
    a = native.anatomy
    means = torch.randn(a.n_layers, a.n_heads, a.d_head, generator=torch.Generator().manual_seed(0))
    for fn, args in ((head_out_norms, ()), (ov_copying_scores, ()), (function_vector, (means, [Head(0, 1), Head(1, 3)]))):
        expected, got = fn(native, *args), read_weights(remote, fn, *args)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert [job.traces for job in remote.backend.log.jobs] == [0, 0, 0]


EMBEDDED = [("detect", {"n_seqs": 2, "seg_len": 6, "batch_size": 2, "top_k": 3}),
            ("ablate", {"heads": "9.3,14.1", "mode": "zero", "tasks": "capitalize", "n": 2, "shots": 1,
                        "baseline_seeds": 1, "batch_size": 2})]


def test_the_embedded_model_is_equal_on_every_backend(embedded):
    """detect and ablate on the embedded model (30 layers): native, nnsight and --remote local agree (the
    sweep and icl-vectors take minutes there: bench/nnsight.py checks them on the embedded model)."""
    handles = {RUNS[0]: embedded, **{run: mk.load_model("llama", device="cpu", backend=run[0], remote=run[1])
                                     for run in RUNS[1:]}}
    for plugin, options in EMBEDDED:
        runs = {run: mk.run(plugin, model=h, write=False, backend=run[0], **options) for run, h in handles.items()}
        for run in RUNS[1:]:
            largest, mismatches = _diffs(dict(runs[run].results), dict(runs[RUNS[0]].results))
            assert not mismatches, (plugin, run, mismatches[:5])
            assert largest <= 1e-4, (plugin, run, largest)
    assert handles[RUNS[2]].backend.log.summary()["jobs"] > 0
