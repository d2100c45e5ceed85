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
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.hooking import gradients
from mechkit.interventions import ablate
from mechkit.model.backend import BackendError, NnsightBackend, refusal
from mechkit.model.tiny import tiny_families

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
PLUGINS = [
    ("inspect", "tiny:gpt2", {"repeats": 1, "seq_len": 16}),
    ("detect", "tiny:llama", {"n_seqs": 6, "seg_len": 8, "batch_size": 4}),
    ("detect", "tiny:gpt2", {"n_seqs": 6, "seg_len": 8, "batch_size": 4}),
    ("ablate", "tiny:llama", {**SMALL, "heads": "0.1,1.2", "mode": "zero", "baseline_seeds": 2,
                              "tasks": "capitalize,past-tense"}),
    ("ablate", "tiny:qwen2", {**SMALL, "heads": "induction", "top_k": 2, "mode": "mean", "baseline_seeds": 2,
                              "tasks": "capitalize", "n_seqs": 4, "seg_len": 6}),
    ("ablate", "tiny:gpt2", {**SMALL, "heads": "random", "top_k": 2, "mode": "resample", "baseline_seeds": 2,
                             "tasks": "capitalize"}),
    ("sweep", "tiny:llama", {**SMALL, "method": "both"}),
    ("icl-vectors", "tiny:llama", {"tasks": "capitalize", "n": 4, "n_dev": 3, "n_contexts": 3, "n_cie": 2,
                                   "shots": 2, "top_k": 2, "fv_scales": "1,2", "batch_size": 8}),
]


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


def test_the_simulation_is_strict(monkeypatch):
    """Without mechkit shipped by value the simulated server cannot even read the request."""
    import contextlib

    m = _load("llama", "nnsight", "local")
    monkeypatch.setattr(NnsightBackend, "_shipping", lambda self, plan: contextlib.nullcontext())
    with pytest.raises(ModuleNotFoundError, match="mechkit"), torch.no_grad(), ablate(m, "0.1", mode="zero"):
        m(torch.tensor([[256, 1, 2]]))
    assert "mechkit.hooking" in sys.modules  # hidden only while the request was on the "server"


def test_refusals_name_what_is_missing():
    assert refusal({"patterns", "gradients"}, "nnsight", "local", "detect") is None
    assert refusal({"weight_writes"}, "nnsight", None, "shuffle") is None
    line = refusal({"weight_writes", "module_calls"}, "nnsight", "local", "prune")
    assert "weight writes" in line and "partial forwards" in line and "--backend native" in line
    assert "\n" not in line
    with pytest.raises(BackendError, match="unknown backend 'jax'"):
        mk.load_model("tiny:llama", backend="jax")
    from mechkit.model.tiny import tiny_model

    model, tok = tiny_model("llama")
    with pytest.raises(BackendError, match="model object"):
        mk.run("detect", model=model, write=False, backend="nnsight", remote="local")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mechkit.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "message"), [
    (["detect", "--model", "tiny:llama", "--backend", "jax"], "'jax' is not one of"),
    (["detect", "--model", "tiny:llama", "--remote", "local"], "needs the nnsight backend"),
    (["detect", "--model", "{dir}", "--backend", "nnsight", "--remote", "local"], "local directory"),
    (["prune", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local"], "needs partial forwards"),
    (["shuffle", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local"], "needs weight writes"),
    (["finetune", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "local"], "weights live on the server"),
    (["detect", "--model", "tiny:llama", "--backend", "nnsight", "--remote", "ndif"], "not hosted on NDIF"),
    (["detect", "--model", "org/model", "--backend", "nnsight", "--remote"], "no NDIF API key"),
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
    from mechkit.model.linear import weight_out_in
    from mechkit.model.tiny import tiny_model

    config = tiny_model("llama")[0].config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    for module in model.modules():  # as connect_ndif marks the client's copy
        module.__dict__["_mechkit_remote"] = "org/model"
    with pytest.raises(BackendError, match="stay on the NDIF server"):
        weight_out_in(discover_anatomy(model).attn_out(0))


def test_an_unhosted_model_names_what_the_server_hosts(monkeypatch):
    import nnsight
    import nnsight.ndif

    from mechkit.errors import ModelLoadError

    monkeypatch.setattr(nnsight.CONFIG.API, "APIKEY", "not-a-key")
    hosted = {"deployments": {"a": {"repo_id": "org/hosted", "application_state": "RUNNING"},
                              "b": {"repo_id": "org/cold", "application_state": "DEPLOYING"}}}
    monkeypatch.setattr(nnsight.ndif, "status", lambda raw=False: hosted)
    with pytest.raises(BackendError, match="NDIF does not host org/other right now — use one it hosts: org/hosted$"):
        mk.load_model("org/other", backend="nnsight", remote="ndif")
    # hosted, but the client cannot read its config from the hub (offline here): one line too
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot build org/hosted for NDIF") as err:
        mk.load_model("org/hosted", backend="nnsight", remote="ndif")
    assert "\n" not in str(err.value)
