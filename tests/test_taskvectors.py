"""ICL task vectors: extraction reads the right positions, batched patching equals one-by-one,
edits detach, saved vectors round-trip, and the icl-vectors plugin runs end to end."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.tasks import build_prompts
from mechkit.taskvectors import (
    ActivationVector,
    ResidEdit,
    apply_vector,
    choose_layer,
    icl_task_vectors,
    patch_last_token,
    patched_accuracy,
    score_edited,
)


def _logits(handle, ids):
    with torch.no_grad():
        return handle(ids)


def test_vectors_are_means_of_last_token_residuals(tiny_llama):
    vectors = icl_task_vectors(tiny_llama, "swap", n_contexts=5, shots=2, seed=0, batch_size=2)
    assert vectors.shape == (tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model)
    prompts = build_prompts("swap", n=5, shots=2, seed=0)
    manual = torch.zeros(tiny_llama.anatomy.d_model, dtype=torch.float64)
    for p in prompts:  # one prompt at a time: no padding at all
        with mk.record(tiny_llama, "blocks.1.hook_resid_post") as cache, torch.no_grad():
            tiny_llama(tiny_llama.to_tokens(p.text))
        manual += cache["blocks.1.hook_resid_post"][0, -1].double()
    torch.testing.assert_close(vectors[1], (manual / 5).float(), rtol=1e-5, atol=1e-5)


def test_patch_replaces_one_position_only(tiny_llama):
    ids = tiny_llama.to_tokens("input: a b\noutput:")
    position = ids.shape[1] - 1
    vector = torch.randn(tiny_llama.anatomy.d_model)
    with mk.hooks(tiny_llama, patch_last_token(0, position, vector)), \
            mk.record(tiny_llama, "blocks.0.hook_resid_post") as patched, torch.no_grad():
        tiny_llama(ids)
    with mk.record(tiny_llama, "blocks.0.hook_resid_post") as clean, torch.no_grad():
        tiny_llama(ids)
    got, ref = patched["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"]
    torch.testing.assert_close(got[0, position], vector)
    assert torch.equal(got[0, :position], ref[0, :position])


def test_patching_with_the_clean_value_changes_nothing(tiny_llama):
    prompts = build_prompts("swap", n=3, shots=0, seed=1)
    baseline = mk.score_prompts(tiny_llama, prompts).correct
    p = prompts[0]
    ids = tiny_llama.to_tokens(p.text)
    with mk.record(tiny_llama, "blocks.0.hook_resid_post") as cache, torch.no_grad():
        tiny_llama(ids)
    own = torch.zeros(tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model)
    own[0] = cache["blocks.0.hook_resid_post"][0, -1]
    assert patched_accuracy(tiny_llama, [p], own, layers=[0]) == {0: float(baseline[0])}


def _one_by_one(handle, prompt, edit: ResidEdit | None) -> float:
    """Reference: one prompt, one edit, plain hooks at its own last position."""
    if edit is None:
        return mk.score_prompts(handle, [prompt], batch_size=1).logprob
    position = len(handle.tokenizer(prompt.text)["input_ids"]) - 1

    def fn(x, _point):
        if x.shape[1] <= position:
            return None
        x = x.clone()
        x[:, position] = edit.vector if edit.mode == "replace" else x[:, position] + edit.vector
        return x

    with mk.hooks(handle, {f"blocks.{edit.layer}.hook_resid_post": fn}):
        return mk.score_prompts(handle, [prompt], batch_size=1).logprob


def test_batched_edits_equal_one_by_one(tiny_llama):
    # Prompts of different lengths (different last positions) and edits at different layers and modes,
    # all mixed in padded batches.
    prompts = build_prompts("swap", n=3, shots=0, seed=4) + build_prompts("plus-one", n=3, shots=1, seed=4)
    gen = torch.Generator().manual_seed(0)
    d = tiny_llama.anatomy.d_model
    edits = [None, ResidEdit(0, torch.randn(d, generator=gen)), ResidEdit(1, torch.randn(d, generator=gen), "add"),
             (ResidEdit(0, torch.randn(d, generator=gen), "add"), ResidEdit(1, torch.randn(d, generator=gen)))]
    scores = score_edited(tiny_llama, prompts, edits[:3], batch_size=4)
    for score, edit in zip(scores, edits[:3], strict=True):
        ref = [_one_by_one(tiny_llama, p, edit) for p in prompts]
        torch.testing.assert_close(torch.tensor(score.logprobs), torch.tensor(ref), rtol=1e-4, atol=1e-4)
    # Two edits in one condition compose like one edit after the other.
    both = score_edited(tiny_llama, prompts, [edits[3]], batch_size=5)[0]
    assert both.logprobs != scores[0].logprobs


def test_edits_and_applied_vectors_detach(tiny_llama, ids):
    before = _logits(tiny_llama, ids)
    vec = torch.randn(tiny_llama.anatomy.d_model)
    score_edited(tiny_llama, build_prompts("swap", n=2, shots=0, seed=0), [ResidEdit(1, vec, "add")])
    with apply_vector(tiny_llama, ResidEdit(1, vec, "add")):
        during = _logits(tiny_llama, ids)
    after = _logits(tiny_llama, ids)
    assert torch.equal(before, after)
    assert not torch.equal(during[:, -1], before[:, -1])
    assert torch.equal(during[:, :-1], before[:, :-1])  # only the last position (and nothing before it) moves


def test_span_spreads_a_function_vector_and_replaces_each_layers_theta(tiny_llama, ids):
    n, d = tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model
    fv = ActivationVector(torch.randn(d), "function-vector", "swap", 0, "add", scale=4.0, span=2)
    first, second = fv.edits()
    assert (first.layer, second.layer) == (0, 1) and first.mode == second.mode == "add"
    torch.testing.assert_close(first.vector, 2.0 * fv.vector)  # scale 4 spread over 2 layers
    torch.testing.assert_close(second.vector, first.vector)
    tv = ActivationVector(torch.randn(n, d), "task-vector", "swap", 0, "replace", span=2)
    assert [torch.equal(e.vector, tv.vector[e.layer]) for e in tv.edits()] == [True, True]
    # Applying the span equals the same edits written by score_edited, and detaches afterwards.
    before = _logits(tiny_llama, ids)
    with apply_vector(tiny_llama, fv), mk.record(tiny_llama, "blocks.1.hook_resid_post") as spanned, torch.no_grad():
        tiny_llama(ids)
    with mk.record(tiny_llama, "blocks.1.hook_resid_post") as clean, torch.no_grad():
        tiny_llama(ids)
    got, ref = spanned["blocks.1.hook_resid_post"][0], clean["blocks.1.hook_resid_post"][0]
    assert torch.equal(got[:-1], ref[:-1]) and not torch.equal(got[-1], ref[-1])
    assert torch.equal(before, _logits(tiny_llama, ids))
    prompts = build_prompts("swap", n=2, shots=0, seed=3)
    manual, spread = score_edited(tiny_llama, prompts, [(first, second), fv.edits()])
    assert manual.logprobs == spread.logprobs
    with pytest.raises(MechkitError, match="do not all exist"):
        ActivationVector(fv.vector, "function-vector", "swap", 1, "add", span=2).check(tiny_llama)


def test_choose_layer_breaks_ties_by_logprob_then_earliest():
    assert choose_layer({3: 0.5, 7: 0.5, 9: 0.2}, {3: -2.0, 7: -1.0, 9: 0.0}) == 7
    assert choose_layer({3: 0.5, 7: 0.5}) == 3


def test_saved_vector_round_trip(tiny_llama, tmp_path):
    vec = ActivationVector(torch.randn(tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model), "task-vector",
                           "swap", 1, "replace", tiny_llama.weights_sha256(), [], {"n_contexts": 5})
    path = vec.save(tmp_path / "v.safetensors")
    back = ActivationVector.load(path, tiny_llama)
    assert torch.equal(back.vector, vec.vector)
    assert back.metadata() == vec.metadata()
    torch.testing.assert_close(back.edit(scale=2.0).vector, 2 * vec.vector[1])
    other = ActivationVector(vec.vector, "task-vector", "swap", 1, "replace", "0" * 64)
    other.save(tmp_path / "o.safetensors")
    with pytest.raises(MechkitError, match="other model weights"):
        ActivationVector.load(tmp_path / "o.safetensors", tiny_llama)
    with pytest.raises(MechkitError, match="no vector file"):
        ActivationVector.load(tmp_path / "missing.safetensors")


def test_plugin_runs_and_reloads_its_vectors(tmp_path):
    small = dict(model="tiny:llama", tasks="swap", n=3, n_dev=2, n_contexts=2, n_cie=1, shots=2, top_k=2, spans="1,2")
    run = mk.run("icl-vectors", out=tmp_path / "a", **small)
    res = run.results
    assert set(res["accuracy_table"]) == {"zero-shot", "zero-shot + TV", "zero-shot + FV", "shuffled ICL",
                                          "shuffled ICL + TV", "shuffled ICL + FV", "ICL"}
    assert len(res["per_task"]["swap"]["methods"]["task-vector"]["test"]["accuracy"]) == 2  # tiny: 2 layers
    assert (tmp_path / "a" / "aie_swap.png").exists()
    fv = ActivationVector.load(tmp_path / "a" / "swap.function-vector.safetensors")
    assert fv.layer == res["chosen_layer"]["function-vector"]["swap"] and len(fv.heads) == 2
    assert fv.span == res["chosen_span"]["function-vector"]["swap"] and fv.layer + fv.span <= 2
    dev = res["per_task"]["swap"]["methods"]["task-vector"]["dev"]
    assert dev["spans"] == [1, 2] and dev["accuracy"][1][1] is None  # a 2-layer span cannot start at the last layer
    again = mk.run("icl-vectors", out=tmp_path / "b", model="tiny:llama", n=3, shots=2,
                   load_vector=str(tmp_path / "a" / "swap.function-vector.safetensors"))
    assert again.results["methods"] == ["function-vector"]
    assert again.results["chosen_layer"]["function-vector"]["swap"] == fv.layer


def test_plugin_rejects_bad_layers_before_work(tmp_path):
    with pytest.raises(MechkitError, match="--layers"):
        mk.run("icl-vectors", model="tiny:llama", out=tmp_path / "x", tasks="swap", layers="0-9")
    assert not (tmp_path / "x").exists()


def test_dev_choice_of_layer_and_scale():
    from mechkit.plugins.icl_vectors import choose, parse_scales, parse_spans

    dev = {"scales": [1.0, 4.0], "accuracy": [[0.1, 0.5], [0.5, 0.2]], "logprob": [[-3, -1], [-2, -1]]}
    assert choose(dev, [10, 20]) == (20, 1.0, 1)  # equal accuracy: the better log-prob wins
    spans = {"scales": [1.0, 1.0], "spans": [1, 2], "accuracy": [[0.1, 0.5], [0.6, None]], "logprob": [[0, 0], [0, None]]}
    assert choose(spans, [10, 20]) == (10, 1.0, 2)
    assert parse_spans("2,1", 30) == [1, 2]
    with pytest.raises(MechkitError, match="--spans"):
        parse_spans("0", 30)
    assert parse_scales("1, 2,4") == [1.0, 2.0, 4.0]
    with pytest.raises(MechkitError, match="fv-scales"):
        parse_scales("0,x")
