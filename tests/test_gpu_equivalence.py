"""On CUDA, mechkit computes what it computes on CPU: every tiny family and two mixture-of-experts models,
in float32, through the hooks, ablation, patching (exact and attribution), the logit lens, DLA, scoring,
the exact head sweep and whole plugin runs. Run where a GPU is lent: ``pytest -m gpu``.

CPU and GPU kernels sum in different orders, so values agree to a tolerance (1e-4 absolute on logits),
not bit for bit; what must be equal (token choices, shapes, the weights) is compared exactly.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import mechkit as mk
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer, tiny_families
from mechkit.patching import (
    answer_id,
    attribute_patching,
    denoise,
    direct_logit_attribution,
    dla_names,
    lens_names,
    logit_diff,
    logit_lens,
)

# MECHKIT_TEST_OTHER_DEVICE=cpu runs these on a machine without a GPU, comparing CPU with CPU (a check of
# the tests themselves, not of CUDA).
OTHER = os.environ.get("MECHKIT_TEST_OTHER_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(OTHER == "cuda" and not torch.cuda.is_available(),
                                 reason="needs CUDA: compares a CUDA run with the CPU run")]
MOE = ("mixtral", "olmoe")
TOL = dict(atol=1e-4, rtol=1e-4)


def _load(family: str, device: str) -> mk.ModelHandle:
    if family not in MOE:
        return mk.load_model(f"tiny:{family}", device=device, dtype="float32")
    import transformers as T

    small = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, num_experts_per_tok=2, **SPECIAL_TOKENS)
    config = {"mixtral": lambda: T.MixtralConfig(**small, num_local_experts=4),
              "olmoe": lambda: T.OlmoeConfig(**small, num_experts=4)}[family]()
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    return mk.load_model(model, tokenizer=byte_tokenizer(), device=device, dtype="float32")


@pytest.fixture(scope="module", params=[*tiny_families(), *MOE])
def pair(request) -> tuple[mk.ModelHandle, mk.ModelHandle]:
    cpu, other = _load(request.param, "cpu"), _load(request.param, OTHER)
    assert other.device.type == OTHER
    assert cpu.weights_sha256() == other.weights_sha256()
    return cpu, other


def _close(a: torch.Tensor, b: torch.Tensor, **tol) -> None:
    torch.testing.assert_close(a.detach().float().cpu(), b.detach().float().cpu(), **(tol or TOL))


def _ids(m: mk.ModelHandle) -> torch.Tensor:
    return m.to_tokens("The cat sat on the mat. The cat sat")


def test_logits_and_every_hook_point_agree(pair):
    cpu, other = pair
    a, cache_a = mk.run_with_cache(cpu, _ids(cpu))
    b, cache_b = mk.run_with_cache(other, _ids(other))
    _close(a, b)
    assert set(cache_a) == set(cache_b)
    for name in cache_a:
        _close(cache_a[name], cache_b[name], atol=2e-4, rtol=2e-4)


def test_ablation_agrees_and_restores(pair):
    cpu, other = pair
    out = []
    for m in pair:
        ids = _ids(m)
        with torch.no_grad():
            clean = m(ids)
            for mode in ("zero", "mean"):
                with mk.ablate(m, heads="0.1,1.2", mode=mode, reference=ids):
                    out.append(m(ids))
            assert torch.equal(m(ids), clean)  # hooks detached on the GPU too
    _close(out[0], out[2])
    _close(out[1], out[3])


def _patch_pair(m):
    clean, corrupt = m.to_tokens("abcab"), m.to_tokens("abdab")
    c, w = answer_id(m, "c"), answer_id(m, "d")
    return clean, corrupt, (lambda logits: logit_diff(logits, c, w))


def test_exact_and_attribution_patching_agree(pair):
    scans = []
    for m in pair:
        clean, corrupt, metric = _patch_pair(m)
        scans.append((denoise(m, clean, corrupt, "hook_resid_pre", metric, batch_size=3),
                      denoise(m, clean, corrupt, "attn.hook_z", metric, over="head"),
                      attribute_patching(m, clean, corrupt, "attn.hook_z", metric, over="head")))
    for a, b in zip(*scans, strict=True):
        _close(a.values, b.values, atol=2e-4, rtol=2e-4)
        assert math.isclose(a.clean, b.clean, abs_tol=1e-4) and math.isclose(a.corrupted, b.corrupted, abs_tol=1e-4)


def test_logit_lens_and_dla_agree(pair):
    got = []
    for m in pair:
        ids = _ids(m)
        _, cache = mk.run_with_cache(m, ids, sorted({*lens_names(m), *dla_names(m)}))
        dla = direct_logit_attribution(m, cache, 5, 7)
        got.append((logit_lens(m, cache), dla.heads, dla.total, dla.actual))
    for a, b in zip(*got, strict=True):
        _close(a, b, atol=2e-4, rtol=2e-4)


def test_scoring_and_the_exact_head_sweep_agree(pair):
    from mechkit.heads.effects import exact_effects

    prompts = mk.build_prompts("capitalize", n=6, shots=2, seed=0)
    scores = [mk.score_prompts(m, prompts, batch_size=4) for m in pair]
    assert scores[0].correct == scores[1].correct
    _close(torch.tensor(scores[0].logprobs), torch.tensor(scores[1].logprobs))
    a, b = (exact_effects(m, prompts, batch_size=4) for m in pair)
    _close(torch.as_tensor(a.logprob), torch.as_tensor(b.logprob), atol=2e-4, rtol=2e-4)


RUNS = {
    "detect": {},
    "ablate": {"tasks": "capitalize", "n": 6, "shots": 1, "heads": "0.1,1.2", "mode": "mean"},
    "sweep": {"tasks": "capitalize", "n": 6, "shots": 1, "batch_size": 2},
    "patch": {},
    "attention": {},
}


def _numbers_close(a, b, path="results") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for key in a:
            _numbers_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _numbers_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3) or (math.isnan(a) and math.isnan(b)), f"{path}: {a} != {b}"
    elif not isinstance(a, str | bool | int | type(None)):
        raise AssertionError(f"{path}: a {type(a).__name__} the comparison does not know")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"  # head names, token choices, counts


@pytest.mark.parametrize("plugin", list(RUNS))
def test_a_plugin_run_on_the_gpu_reports_what_the_cpu_run_reports(plugin, tmp_path):
    cpu = mk.run(plugin, model="tiny:llama", device="cpu", dtype="float32", **RUNS[plugin], write=False)
    run = mk.run(plugin, model="tiny:llama", device=OTHER, dtype="float32", **RUNS[plugin], out=tmp_path / plugin)
    assert (tmp_path / plugin / "report.json").is_file() and (tmp_path / plugin / "report.html").is_file()
    assert run.report["finding"]
    _numbers_close(cpu.results, run.results)


def _flags(options: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in options.items()]


# Every built-in plugin, with bench/memory.py's short options (and its tiny-model changes); patch twice
# (exact and attribution: a backward on the GPU). taskvec-sweep reads two vector files made on the CPU.
CLI = {"inspect": [], "detect": [], "attention": [], "patch": [], "patch-attribution": ["--method=attribution"],
       "ablate": _flags(dict(heads="induction", tasks="capitalize", n=6, sweep="2", baseline_seeds=2)),
       "shuffle": _flags(dict(heads="0.0,0.1", tasks="capitalize", n=6, seeds=1)),
       "sweep": _flags(dict(tasks="capitalize", n=6, method="attribution")),
       "icl-vectors": _flags(dict(tasks="capitalize", n=6, n_dev=3, n_contexts=2, n_cie=2)),
       "prune": _flags(dict(guide="attribution", target="neurons", sparsity="0.2", tasks="capitalize", n=4,
                            calib=4, repeats=1)),
       "compose": _flags(dict(parts="study", pairs="capitalize+swap", n=4, seeds=1, shots="0,4")),
       "adapt": _flags(dict(tasks="capitalize,past-tense", budgets="0.7", calib=4, n=4, repeats=1,
                            prune_budgets="", signal_layer=0, token_layers="0", margin=0.5)),
       "finetune": _flags(dict(task="capitalize", steps=2, batch_size=4, eval_n=4)),
       "select-tasks": _flags(dict(target="past-tense", pool="capitalize,swap,opposite,negation", n=4,
                                   validate=True, seeds="0", steps=1, budget=8, batch_size=4, eval_n=2,
                                   eval_shots="0,1", draws=3, transfer_seeds=1)),
       "taskvec-sweep": _flags(dict(lambdas="-1:1:1", n=3))}


@pytest.mark.parametrize("name", list(CLI))
def test_every_plugin_runs_on_the_gpu_from_the_cli_in_a_fresh_process(name, tmp_path):
    """A fresh process has not touched CUDA when the run starts: resetting the peak-memory counters then
    made torch raise "Invalid device argument" before any work, and patch's answer tokens were built on
    the CPU (seen on an H200, 2026-11-27)."""
    import json
    import subprocess
    import sys

    args = [name.split("-attribution")[0], *CLI[name]]
    if name == "taskvec-sweep":
        from mechkit.taskarith import extract
        from tests.conftest import noisy_model_dir

        base = mk.load_model("tiny:llama", device="cpu")
        files = [extract(base, noisy_model_dir(tmp_path / f"ft{i}", seed=i + 1), tasks=[task]).save(tmp_path / f"{task}.st")
                 for i, task in enumerate(("capitalize", "lowercase"))]
        args.append("--vectors=" + ",".join(map(str, files)))
    code = "import sys; from mechkit.cli.main import main; main(sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", code, *args, "--model", "tiny:llama", "--device", OTHER,
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["finding"] and (tmp_path / "run" / "report.html").is_file()
    assert OTHER == "cpu" or report["timings"]["peak_cuda0_mb"] > 0
