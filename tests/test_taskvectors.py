"""ICL task vectors: extraction reads the right positions, batched patching equals one-by-one,
edits detach, saved vectors round-trip, and the icl-vectors plugin runs end to end."""

from __future__ import annotations

import functools
import json

import pytest
import torch

import mechkit as mk
from mechkit.actvec import (
    ActivationVector,
    ResidEdit,
    VectorStudy,
    apply_vector,
    choose,
    choose_layer,
    held_out_prompts,
    icl_task_vectors,
    parse_layers,
    parse_scales,
    parse_spans,
    patch_last_token,
    patched_accuracy,
    score_edited,
)
from mechkit.errors import MechkitError
from mechkit.tasks import build_prompts


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
    p = build_prompts("swap", n=3, shots=0, seed=1)[0]
    baseline = mk.score_prompts(tiny_llama, [p])
    ids = tiny_llama.to_tokens(p.text)
    with mk.record(tiny_llama, "blocks.0.hook_resid_post") as cache, torch.no_grad():
        tiny_llama(ids)
    own = torch.zeros(tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model)
    own[0] = cache["blocks.0.hook_resid_post"][0, -1]
    own[1] = torch.randn(tiny_llama.anatomy.d_model, generator=torch.Generator().manual_seed(0))  # not own: layer 0 gets it
    same, other = score_edited(tiny_llama, [p], [ResidEdit(0, own[0]), ResidEdit(0, own[1])])
    torch.testing.assert_close(torch.tensor(same.logprobs), torch.tensor(baseline.logprobs), rtol=1e-5, atol=1e-5)
    assert abs(other.logprobs[0] - baseline.logprobs[0]) > 1e-3  # the comparison can tell a real patch apart
    assert patched_accuracy(tiny_llama, [p], own, layers=[0]) == {0: baseline.accuracy}


def _one_by_one(handle, prompt, edit: ResidEdit | tuple[ResidEdit, ...] | None) -> float:
    """Reference: one prompt, its edits applied one after the other (layer order) by plain hooks at
    its own last position."""
    edits = () if edit is None else (edit,) if isinstance(edit, ResidEdit) else edit
    position = len(handle.tokenizer(prompt.text)["input_ids"]) - 1

    def hook(e: ResidEdit):
        def fn(x, _point):
            if x.shape[1] <= position:
                return None
            x = x.clone()
            x[:, position] = e.vector if e.mode == "replace" else x[:, position] + e.vector
            return x

        return fn

    with mk.hooks(handle, {f"blocks.{e.layer}.hook_resid_post": hook(e) for e in edits}):
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
    ref = [_one_by_one(tiny_llama, p, edits[3]) for p in prompts]
    torch.testing.assert_close(torch.tensor(both.logprobs), torch.tensor(ref), rtol=1e-4, atol=1e-4)
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
    with pytest.raises(MechkitError, match="does not exist"):
        ActivationVector.load(tmp_path / "missing.safetensors")


def _saved(tmp_path, name, vector, **meta):
    from safetensors.torch import save_file

    path = tmp_path / name
    save_file({"vector": vector}, str(path), metadata={"mechkit": json.dumps(meta)})
    return path


def test_loading_a_bad_vector_file_is_one_clear_error(tiny_llama, tmp_path):
    n, d = tiny_llama.anatomy.n_layers, tiny_llama.anatomy.d_model
    good = ActivationVector(torch.randn(n, d), "task-vector", "swap", 1, "replace")
    data = good.to_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) // 2])  # truncated mid-tensor
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    for name in ("cut.safetensors", "junk.safetensors"):
        with pytest.raises(MechkitError, match="cannot read activation vector"):
            ActivationVector.load(tmp_path / name, tiny_llama)
    meta = good.metadata()
    extra = _saved(tmp_path, "extra.safetensors", good.vector, **meta, colour="red")
    with pytest.raises(MechkitError, match="colour"):
        ActivationVector.load(extra)
    cases = {  # metadata or shapes that load but do not fit the model
        "method": (good.vector, {**meta, "method": "steering"}, "unknown vector method"),
        "negative": (good.vector, {**meta, "layer": -1}, "not a layer choice"),
        "span0": (good.vector, {**meta, "span": 0}, "not a layer choice"),
        "layers": (torch.randn(n + 3, d), meta, "neither"),  # a task vector from a deeper model
        "width": (torch.randn(n, d + 1), meta, "d_model"),
    }
    for name, (vector, m, match) in cases.items():
        path = _saved(tmp_path, f"{name}.safetensors", vector, **m)
        ActivationVector.load(path)  # readable; only the model check refuses it
        with pytest.raises(MechkitError, match=match):
            ActivationVector.load(path, tiny_llama)


def test_save_replaces_atomically_and_cleans_up_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "v.safetensors"
    first = ActivationVector(torch.ones(4), "function-vector", "swap", 0, "add")
    first.save(path)
    second = ActivationVector(torch.zeros(4), "function-vector", "swap", 1, "add")
    second.save(path)
    assert ActivationVector.load(path).layer == 1 and [p.name for p in tmp_path.iterdir()] == ["v.safetensors"]

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr("mechkit.io.atomic.os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        first.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["v.safetensors"]  # no temporary file left behind
    assert ActivationVector.load(path).layer == 1  # the previous file is intact


def test_extraction_unembeds_only_the_last_position_without_changing_results(tiny_llama, monkeypatch):
    from mechkit.actvec.function_vectors import mean_head_outputs

    prompts = build_prompts("swap", n=3, shots=1, seed=2) + build_prompts("swap", n=2, shots=0, seed=2)
    calls = []
    forward = tiny_llama.model.forward

    @functools.wraps(forward)  # keeps forward's signature, which supports_logits_to_keep reads
    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(tiny_llama.model, "forward", spy)
    kept = icl_task_vectors(tiny_llama, "swap", prompts=prompts, batch_size=5), mean_head_outputs(tiny_llama, prompts)
    assert calls == [1, 1]
    monkeypatch.setattr("mechkit.eval.scoring.supports_logits_to_keep", lambda _model: False)
    full = icl_task_vectors(tiny_llama, "swap", prompts=prompts, batch_size=5), mean_head_outputs(tiny_llama, prompts)
    assert calls[2:] != [1, 1]
    assert all(torch.equal(k, f) for k, f in zip(kept, full, strict=True))


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


@pytest.mark.parametrize(("options", "match"), [
    ({"tasks": "swap", "top_k": 0}, "--top-k"),
    ({"tasks": "swap", "top_k": -1}, "--top-k"),
    ({"tasks": "swap", "shots": 1}, "--shots 1 is below 2"),  # one demonstration: nothing to permute
    ({"tasks": "swap", "spans": "1,3"}, "--spans '1,3' is out of range: the model has 2 layers"),
    ({"tasks": "swap", "layers": "1-2"}, "--layers '1-2' is out of range"),
    ({"tasks": "swap,ioi", "shots": 2}, "too few to shuffle"),  # ioi has no input:/output: demonstrations
])
def test_plugin_rejects_bad_options_before_work(tmp_path, monkeypatch, options, match):
    import mechkit.actvec.edits as edits
    import mechkit.actvec.function_vectors as fvs
    import mechkit.actvec.study as study
    import mechkit.actvec.task_vectors as tvs

    def no_work(*_args, **_kwargs):
        raise AssertionError("extraction started before the options were checked")

    # The study binds these names at import: patch them where it looks them up (and at their homes).
    for module, name in ((edits, "score_edited"), (tvs, "icl_task_vectors"), (fvs, "mean_head_outputs")):
        assert getattr(study, name) is getattr(module, name)
        monkeypatch.setattr(module, name, no_work)
        monkeypatch.setattr(study, name, no_work)
    with pytest.raises(MechkitError, match=match):
        mk.run("icl-vectors", model="tiny:llama", out=tmp_path / "x", n=2, n_dev=2, **{"top_k": 2, **options})
    assert not (tmp_path / "x").exists()


def test_dev_choice_of_layer_and_scale():
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


def test_choose_breaks_full_ties_by_earliest_layer_smallest_scale_shortest_span():
    same = {"scales": [4.0, 1.0, 1.0], "spans": [1, 2, 1], "accuracy": [[0.5, 0.5]] * 3,
            "logprob": [[-1, -1]] * 3}
    assert choose(same, [3, 7]) == (3, 1.0, 1)
    assert choose({**same, "spans": [1, 2, 3]}, [3, 7]) == (3, 1.0, 2)


def test_choose_layer_is_choose_at_one_scale_and_span():
    import random

    rng = random.Random(0)
    for _ in range(200):
        layers = sorted(rng.sample(range(30), rng.randint(1, 8)))
        curve = {L: rng.choice([0.0, 0.25, 0.5]) for L in layers}  # coarse accuracies: ties are common
        lps = {L: rng.choice([-2.0, -1.0]) for L in layers if rng.random() < 0.8}  # some layers missing
        dev = {"scales": [1.0], "spans": [1], "accuracy": [[curve[L] for L in layers]],
               "logprob": [[lps.get(L, 0.0) for L in layers]]}
        ref = max(layers, key=lambda L: (curve[L], lps.get(L, 0.0), -L))  # the rule, written out
        assert choose_layer(curve, lps) == choose(dev, layers)[0] == ref
        assert choose_layer(curve) == max(layers, key=lambda L: (curve[L], -L))


def test_layers_grammar():
    assert parse_layers("all", 3) == [0, 1, 2]
    assert parse_layers("4-5, 1", 6) == [1, 4, 5]
    for bad, match in (("0-9", "out of range"), ("a", "malformed"), ("", "out of range")):
        with pytest.raises(MechkitError, match=match):
            parse_layers(bad, 6)


def test_held_out_prompts_ask_the_same_queries_avoiding_dev():
    dev = build_prompts("capitalize", n=5, shots=0, seed=2)
    sets = held_out_prompts("capitalize", n=6, shots=3, seed=3, avoid={q.query for q in dev})
    queries = [q.query for q in sets["zero-shot"]]
    assert len(queries) == 6 and not set(queries) & {q.query for q in dev}
    assert [q.query for q in sets["icl"]] == [q.query for q in sets["shuffled"]] == queries
    assert sets["icl"][0].text != sets["shuffled"][0].text  # the same demonstrations, labels shuffled


def test_study_steps_carry_the_task_and_resume(tiny_llama):
    stored: dict = {}

    def step(key, compute):
        if key not in stored:
            stored[key] = json.loads(json.dumps(compute()))  # what a resumed run reads back
        return stored[key]

    sizes = dict(n=2, n_dev=2, n_contexts=2, n_cie=1, shots=2, top_k=2, fv_scales=[1, 2], spans=[1, 2])
    vec, first = VectorStudy(tiny_llama, "swap", step=step, **sizes).run("function-vector")
    assert sorted(stored) == ["swap|function-vector|conditions|" + f"L={vec.layer}|x{vec.scale}" +
                              (f"|span={vec.span}" if vec.span != 1 else ""),
                              "swap|function-vector|dev|[1.0, 2.0]|spans=[1, 2]",
                              "swap|function-vector|extract",
                              "swap|function-vector|test|" + f"x{vec.scale}" +
                              (f"|span={vec.span}" if vec.span != 1 else "")]
    assert first["dev"] == stored["swap|function-vector|dev|[1.0, 2.0]|spans=[1, 2]"]
    assert (first["layer"], first["scale"], first["span"]) == choose(first["dev"], [0, 1])
    again = VectorStudy(tiny_llama, "swap", step=step, **sizes).run("function-vector")[1]
    assert again == first
