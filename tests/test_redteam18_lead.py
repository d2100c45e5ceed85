"""Red-team pass 18 (find-only, issue 32): the Python API's failures it found, each fixed in general.

A hook list holding None (accepted, then a TypeError in the forward), a metric that is no function (TypeError
in patching), ``Cache.completion`` reading a string as its letters (silently nothing recorded), a
TransformerLens model= that is not one (AttributeError later), NumPy and out-of-range seeds (refused as "not a
whole number", or torch's Overflow at the first resampled forward).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.patching import attribute_patching, denoise, logit_diff, noise, normalized_recovery, scan


@pytest.fixture(scope="module")
def h():
    return mk.load_model("tiny:llama")


@pytest.mark.parametrize("fns", [[None], [lambda a, p: None, None], (None,), [3]])
def test_a_hook_list_with_something_not_callable_is_refused_before_the_forward(h, fns):
    ids = h.to_tokens("The cat sat")
    before = h(ids)
    with pytest.raises(MechkitError, match="not a function"), mk.hooks(h, {"blocks.0.hook_resid_pre": fns}):
        h(ids)
    assert torch.equal(h(ids), before)


@pytest.mark.parametrize("who", ["scan", "denoise", "noise", "attribute_patching"])
@pytest.mark.parametrize("metric", [None, 3.0, "logit_diff"])
def test_a_metric_that_is_no_function_is_one_line(h, who, metric):
    clean, corrupted = h.to_tokens("The cat sat"), h.to_tokens("The dog sat")
    call = {"scan": lambda: scan(h, corrupted, clean, "hook_resid_pre", metric),
            "denoise": lambda: denoise(h, clean, corrupted, "hook_resid_pre", metric),
            "noise": lambda: noise(h, clean, corrupted, "hook_resid_pre", metric),
            "attribute_patching": lambda: attribute_patching(h, clean, corrupted, "hook_resid_pre", metric)}[who]
    with pytest.raises(MechkitError, match="not a function of the logits"):
        call()


def test_the_metric_check_leaves_a_real_metric_alone(h):
    clean, corrupted = h.to_tokens("The cat sat"), h.to_tokens("The dog sat")
    study = denoise(h, clean, corrupted, "hook_resid_pre", lambda lg: logit_diff(lg, 5, 7))
    assert study.values.shape[0] == h.anatomy.n_layers and torch.isfinite(study.recovery).all()


@pytest.mark.parametrize("pattern", ["blocks.1.hook_resid_post", "blocks.*.hook_resid_post"])
def test_cache_completion_takes_one_pattern_as_text(h, pattern):
    with mk.record(h, "blocks.0.hook_resid_pre") as cache:
        h(h.to_tokens("The cat sat"))
    as_text, as_list = cache.completion(pattern), cache.completion([pattern])
    assert as_text.keys() == as_list.keys() and as_text
    assert all(torch.equal(as_text[k], as_list[k]) for k in as_text)


@pytest.mark.parametrize("model", ["abc", 5, object()])
def test_to_transformer_lens_refuses_a_model_that_is_not_one(h, model):
    pytest.importorskip("transformer_lens", reason="TransformerLens is an optional engine")
    with mk.record(h, "blocks.0.hook_resid_pre") as cache:
        h(h.to_tokens("The cat sat"))
    with pytest.raises(MechkitError, match="not a TransformerLens model"):
        cache.to_transformer_lens(model)


@pytest.mark.parametrize("seed", [np.int64(3), np.uint8(3), np.int32(3)])
def test_numpy_seeds_run_as_their_int(h, seed):
    ours = mk.run("detect", model=h, seed=seed, write=False, n_seqs=2, seg_len=4, top_k=2)
    plain = mk.run("detect", model=h, seed=int(seed), write=False, n_seqs=2, seg_len=4, top_k=2)
    assert ours.report["results"] == plain.report["results"]
    ids = h.to_tokens("The cat sat")
    with mk.ablate(h, "0.1", mode="resample", reference=ids, seed=seed):
        a = h(ids)
    with mk.ablate(h, "0.1", mode="resample", reference=ids, seed=int(seed)):
        b = h(ids)
    assert torch.equal(a, b)
    views = [mk.show_attention(h, "hello there", "random", top_k=2, seed=s) for s in (seed, int(seed))]
    assert views[0].patterns.heads == views[1].patterns.heads


@pytest.mark.parametrize("seed", [2**64, -1, 2**63])
def test_an_out_of_range_seed_is_one_line_before_any_forward(h, seed):
    ids = h.to_tokens("The cat sat")
    before = h(ids)
    with pytest.raises(MechkitError, match="seed .* out of range"), \
            mk.ablate(h, "0.1", mode="resample", reference=ids, seed=seed):
        h(ids)
    assert torch.equal(h(ids), before)


def test_a_gap_too_small_names_both_metrics():
    with pytest.raises(MechkitError, match=r"clean 1e-07, corrupted 0") as err:
        normalized_recovery(1.0, clean=1e-7, corrupted=0.0)
    assert "log-probabilities" in err.value.fix


# --- the unchanged check's false refusals: first use of torch.compile, importing nnsight (pass 18, class 7) ---

FIRST_USE = {
    "compile": "torch.compile(lambda x: x * 2, backend='eager')(torch.ones(2))",
    "compile_model": "torch.compile(ctx.model.model, backend='eager')(torch.tensor([[1, 2, 3]]))",
    "nnsight": "import nnsight  # noqa: F401",
}
PLUGIN = """
import torch, mechkit as mk
class P(mk.Plugin):
    name, version, summary, options = "first-use", "0", "uses a library for the first time", ()
    def run(self, ctx):
        {body}
        return mk.Result(results={{"ok": 1}}, finding="ran")
run = mk.run(P, model=mk.load_model("tiny:llama"), write=False)
print("RESULT", run.report["results"]["ok"])
"""


@pytest.mark.parametrize("what", sorted(FIRST_USE))
def test_a_plugins_first_use_of_a_library_is_not_taken_for_an_edit(what, tmp_path):
    """Each in a fresh process, as every CLI run is: the once-per-process patches were refused as the
    plugin's ("…__setstate__ was replaced", "torch.Tensor.backward was replaced"), with a fix of restarting."""
    import os
    import subprocess
    import sys

    script = tmp_path / "p.py"
    script.write_text(PLUGIN.format(body=FIRST_USE[what]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "RESULT 1" in done.stdout, done.stderr[-2000:]


def test_a_plugin_wrapping_a_torch_method_itself_is_still_caught():
    """The allowance is for the named libraries' own code: the same wrap made by a plugin is refused."""
    import functools

    original = torch.Tensor.__dict__["backward"]

    class Wraps(mk.Plugin):
        name, version, summary, options = "wraps", "0", "wraps Tensor.backward", ()

        def run(self, ctx):
            torch.Tensor.backward = functools.wraps(original)(lambda *a, **k: original(*a, **k))
            return mk.Result(results={})

    try:
        with pytest.raises(MechkitError, match="torch.Tensor.backward was replaced"):
            mk.run(Wraps, model=mk.load_model("tiny:llama"), write=False)
    finally:
        torch.Tensor.backward = original


# --- option values: a head spec given as a number; NumPy floats as typed; a peft wrapper (pass 18) ---

@pytest.mark.parametrize("heads", [1.10, np.float64(1.1), [1.10], (0.1, "1.2"), np.array([1.3], dtype=np.float32), 3])
def test_a_head_spec_given_as_a_number_is_refused(heads):
    """``heads=1.10`` ablated head 1.1: a float cannot tell 1.10 from 1.1."""
    with pytest.raises(MechkitError, match="a number cannot name a head") as err:
        mk.run("ablate", model="tiny:llama", heads=heads, write=False)
    assert "'2.10'" in err.value.fix


def test_numpy_floats_are_read_as_typed():
    from mechkit.options.option import to_number

    assert to_number(np.float32(1e-3), float) == 0.001 and to_number(np.float16(0.1), float) == 0.1
    option = next(o for o in mk.registry.get("ablate").options if o.name == "sweep")
    assert option.coerce(np.array([5, 10])) == "5,10"


def test_a_peft_wrapper_is_refused_with_a_fix_that_loads(h):
    peft = pytest.importorskip("peft", reason="peft is an optional engine")
    import copy

    wrapped = peft.get_peft_model(copy.deepcopy(h.model), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(MechkitError, match="peft wrapper") as err:
        mk.load_model(wrapped, tokenizer=h.tokenizer)
    assert "unload()" in err.value.fix  # get_base_model() keeps the LoRA layers in place (refused since pass 20)
    assert mk.load_model(copy.deepcopy(wrapped).unload(), tokenizer=h.tokenizer).anatomy.n_layers == h.anatomy.n_layers
