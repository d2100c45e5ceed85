"""Issue 32, class 9: pruned models are models.

A model saved by ``prune --save-model`` is analysed like any other, each plugin checked on a model pruned
the ways it declares it handles (:attr:`mechkit.plugin.Plugin.pruned`):

- pruned evenly (the same neurons and heads kept in every layer, and a block removed), the model is an
  ordinary smaller model: every plugin declaring neurons, heads and layers gives the same results on it as
  on its *twin*, an ordinary directory of that shape holding the same weights;
- heads pruned unevenly (layers keep different numbers of heads), the head-level core numbers each
  layer's heads as the pruned model holds them (``0.1`` is layer 0's second *kept* head), and each result
  equals the dense model's with the removed heads' output columns zeroed (the same function), kept head by
  kept head;
- the others refuse in one line that says why.

All on a 3-layer tiny Llama (and GPT-2 for fused projections), so the file runs in well under a minute.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit import registry
from mechkit.model.edit.surgery import CONFIG_KEY
from mechkit.pruning import prune_copy, save_pruned
from mechkit.pruning.plan import UnitsToRemove

EVEN = UnitsToRemove(mlp={0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}, heads={0: [0, 1], 1: [2, 3], 2: [0, 1]},
                     layers=[1])  # 2 layers × 2 heads (1 KV) × 125 neurons: a rectangular model
UNEVEN = UnitsToRemove(heads={0: [0, 1], 2: [1, 3]})  # layer 0 keeps 2 heads (1 KV group), 1 keeps 4, 2 keeps 2 (2 KV)
KEPT = {0: [2, 3], 1: [0, 1, 2, 3], 2: [0, 2]}  # UNEVEN's kept heads, in the dense model's numbering
# Small settings per plugin (a second or so each on the tiny models).
OPTIONS = {
    "detect": dict(n_seqs=3, seg_len=5, top_k=3),
    "ablate": dict(tasks="swap", n=3, shots=2, top_k=1, baseline_seeds=1, n_seqs=3, seg_len=5),
    "shuffle": dict(heads="0.0,0.1", tasks="swap", n=3, shots=2, seeds=1),
    "sweep": dict(tasks="swap", n=3, shots=2, method="both"),
    "attention": dict(prompt="abcdabcd", heads="0.1,1.0"),
    "finetune": dict(task="capitalize", steps=2, batch_size=2, eval_n=2),
    "icl-vectors": dict(tasks="swap", n=3, n_dev=2, n_contexts=2, n_cie=1, shots=2, top_k=2, fv_scales="1"),
    "compose": dict(n=2, seeds=1, shots="0,2", n_effect=2, n_dev=2, n_test=2, draws=1, top_k=1, verify=1,
                    n_seqs=3, seg_len=5),
    "patch": dict(clean="abcab", corrupted="abdab", answers="c,d"),
    "select-tasks": dict(target="past-tense", pool="capitalize,swap,opposite", n=4),
    "prune": dict(guide="magnitude", target="heads", sparsity="0.25", tasks="swap", n=2, calib=2, shots=1,
                  repeats=1, timing_batch=1),
}
# Results that measure time (and keys ending in _s, seconds), never equal between two runs of anything.
TIMED = ("latency", "speedup", "seconds", "time", "flops_measured")


def _tiny_dir(root, family: str = "llama"):
    """A 3-layer tiny model directory (seeded weights, the byte tokenizer)."""
    import transformers as T

    from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=512, **SPECIAL_TOKENS) \
        if family == "llama" else T.GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=512, **SPECIAL_TOKENS)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root, safe_serialization=True)
    byte_tokenizer().save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return _tiny_dir(tmp_path_factory.mktemp("dense"))


def _pruned(dense_dir, plan: UnitsToRemove, where):
    return save_pruned(prune_copy(mk.load_model(str(dense_dir), device="cpu"), plan), where)


def _twin(pruned_dir, where):
    """An ordinary model directory of the pruned model's (rectangular) shape holding its weights."""
    from transformers import AutoModelForCausalLM

    handle = mk.load_model(str(pruned_dir), device="cpu")
    a, config = handle.anatomy, copy.deepcopy(handle.model.config)
    config.update({"intermediate_size": a.d_mlp, "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads,
                   "head_dim": a.d_head, "num_hidden_layers": a.n_layers})
    twin = AutoModelForCausalLM.from_config(config).eval()
    twin.load_state_dict(handle.model.state_dict(), strict=True)
    twin.save_pretrained(where, safe_serialization=True)
    handle.tokenizer.save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def even(dense_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("even")
    pruned = _pruned(dense_dir, EVEN, root / "pruned" / "model")
    return pruned, _twin(pruned, root / "twin" / "model")  # the same name: reports that name the model agree


@pytest.fixture(scope="module")
def uneven_dir(dense_dir, tmp_path_factory):
    return _pruned(dense_dir, UNEVEN, tmp_path_factory.mktemp("uneven") / "m")


@pytest.fixture(scope="module")
def uneven(dense_dir, uneven_dir):
    """The unevenly head-pruned model, and a maker of the dense model with heads silenced."""
    pruned = mk.load_model(str(uneven_dir), device="cpu")
    return pruned, lambda kept=KEPT: _zeroed(mk.load_model(str(dense_dir), device="cpu"), kept)


def _zeroed(handle, kept: dict[int, list[int]]):
    """``handle`` with every head of a layer in ``kept`` but those listed silenced: its columns of the output
    projection zeroed. With UNEVEN's kept heads it computes what the pruned model computes."""
    from mechkit.model.modules.linear import weight_out_in

    a = handle.anatomy
    with torch.no_grad():
        for layer, heads in kept.items():
            for h in set(range(a.n_heads)) - set(heads):
                weight_out_in(a.attn_out(layer))[:, h * a.d_head:(h + 1) * a.d_head] = 0  # a view (GPT-2: of W.T)
    return handle


def _close(ours, theirs, path: str = "results") -> None:
    """Every number equal to float32 rounding, every other value equal, the same keys and lengths."""
    if isinstance(ours, dict):
        assert set(ours) == set(theirs), path
        for key in ours:
            if not (key.endswith("_s") or any(word in key for word in TIMED)):
                _close(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), path
        for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(ours, float) and isinstance(theirs, float):
        assert math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-5) or (math.isnan(ours) and math.isnan(theirs)), \
            f"{path}: {ours} != {theirs}"
    elif isinstance(ours, str) and isinstance(theirs, str) and ("%" in ours or any(c.isdigit() for c in ours)):
        pass  # a summary line: its numbers are the ones compared above, rounded
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def _declaring(*kinds: str) -> list[str]:
    return sorted(name for name in OPTIONS if set(kinds) <= set(registry.get(name).pruned))


# ---- pruned evenly: an ordinary smaller model -------------------------------------------------------

def test_the_even_model_is_rectangular_and_its_twin_computes_the_same(even):
    pruned, twin = (mk.load_model(str(p), device="cpu") for p in even)
    assert pruned.anatomy.as_dict() == twin.anatomy.as_dict()
    assert (pruned.anatomy.n_layers, pruned.anatomy.n_heads, pruned.anatomy.n_kv_heads, pruned.anatomy.d_mlp) == \
        (2, 2, 1, 125)
    ids = pruned.to_tokens("pruned models are models")
    assert torch.equal(pruned(ids), twin(ids))


@pytest.mark.parametrize("plugin", _declaring("neurons", "heads", "layers"))
def test_a_plugin_gives_the_same_results_on_a_pruned_model_as_on_its_twin(even, plugin):
    pruned, twin = (_results(plugin, p) for p in even)
    _close(pruned, twin)


def _results(plugin: str, path, **options) -> dict:
    """The plugin's results on the model at ``path``, the model's directory written as MODEL."""
    results = mk.run(plugin, model=str(path), write=False, device="cpu", **OPTIONS[plugin], **options).results
    return json.loads(json.dumps(results, default=str).replace(str(path), "MODEL"))


def test_prune_runs_again_on_a_model_with_layers_removed_and_saves_a_model_that_reloads(dense_dir, tmp_path):
    pruned = _pruned(dense_dir, UnitsToRemove(layers=[1]), tmp_path / "pruned" / "model")
    twin = _twin(pruned, tmp_path / "twin" / "model")
    runs = [mk.run("prune", model=str(p), out=p.parent / "run", device="cpu", save_model=True,
                   **OPTIONS["prune"]) for p in (pruned, twin)]
    _close(*(json.loads(json.dumps(r.results, default=str).replace(str(r.out_dir.parent), "DIR")) for r in runs))
    again = mk.load_model(str(runs[0].out_dir / "model"), device="cpu")
    assert again.anatomy.n_layers == 2 and again.anatomy.n_heads == 4  # 2 of 3 blocks, heads kept per layer
    ids = again.to_tokens("abc")
    assert torch.equal(again(ids), mk.load_model(str(runs[1].out_dir / "model"), device="cpu")(ids))


def _vectors(model_dir, where, tasks=("capitalize", "swap")) -> str:
    """Two task vectors of the model at ``model_dir`` (each a 2-step fine-tune of it), as --vectors."""
    from mechkit import taskarith

    paths = []
    for task in tasks:
        ft = mk.run("finetune", model=str(model_dir), out=where / f"ft-{task}", device="cpu", **OPTIONS["finetune"]
                    | {"task": task})
        paths.append(taskarith.extract(mk.load_model(str(model_dir), device="cpu"), ft.out_dir)
                     .save(where / f"{task}.safetensors"))
    return ",".join(map(str, paths))


def test_taskvec_sweep_on_a_pruned_model_equals_its_twin_and_refuses_another_models_vectors(even, uneven_dir,
                                                                                            dense_dir, tmp_path):
    """Vectors of the pruned model: the twin, holding the same weights, gives the same sweep (its vectors are
    the pruned model's, so it is told they are another base's); a differently pruned or the dense model
    refuses them in one line, and extract refuses a fine-tune of another pruning."""
    from mechkit.errors import MechkitError

    vectors = _vectors(even[0], tmp_path)
    options = dict(vectors=vectors, n=2, lambdas="0,1", shots="0", write=False, device="cpu")
    ours = mk.run("taskvec-sweep", model=str(even[0]), **options).results
    theirs = mk.run("taskvec-sweep", model=str(even[1]), allow_other_base=True, **options).results
    _close(*(json.loads(json.dumps(r, default=str).replace(str(p), "MODEL"))
             for r, p in zip((ours, theirs), even, strict=True)))
    for other, why in ((uneven_dir, "pruned differently"), (dense_dir, "one is a pruned model")):
        with pytest.raises(MechkitError) as err:
            mk.run("taskvec-sweep", model=str(other), **options)
        assert "\n" not in str(err.value) and why in str(err.value)
    from mechkit import taskarith

    with pytest.raises(MechkitError, match="not pruned alike"):
        taskarith.extract(mk.load_model(str(uneven_dir), device="cpu"), tmp_path / "ft-swap")


# ---- heads pruned unevenly: the pruned model's own numbering -----------------------------------------

def test_the_anatomy_counts_each_layers_own_heads(uneven):
    pruned, _ = uneven
    a = pruned.anatomy
    assert a.head_counts == (2, 4, 2) and [a.kv_heads_in(layer) for layer in range(3)] == [1, 2, 2]
    assert (a.n_heads, a.ragged_heads) == (4, True)
    with mk.record(pruned, ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]) as cache:
        pruned(pruned.to_tokens("abc"))
    assert cache["blocks.0.attn.hook_z"].shape[2] == 2 and cache["blocks.1.attn.hook_z"].shape[2] == 4


def test_head_specs_use_the_pruned_models_numbering(uneven):
    from mechkit.errors import HeadSpecError
    from mechkit.model.headspec import parse_heads

    a = uneven[0].anatomy
    assert [str(h) for h in parse_heads("layer:0,2.1", a.n_layers, a.head_counts)] == ["0.0", "0.1", "2.1"]
    with pytest.raises(HeadSpecError, match=r"layer 0 of this pruned model has 2 heads \(0–1\)"):
        parse_heads("0.2", a.n_layers, a.head_counts)
    assert len(parse_heads("random", a.n_layers, a.head_counts, top_k=8)) == 8  # all 8 heads, no more


def test_detect_scores_each_kept_head_as_the_dense_model_with_the_others_silenced(uneven):
    pruned, zeroed = uneven
    options = dict(n_seqs=3, seg_len=5, top_k=20)
    ours = mk.run("detect", model=pruned, write=False, **options).results
    theirs = mk.run("detect", model=zeroed(), write=False, **options).results
    for kind in ("induction", "previous-token", "duplicate-token", "ov_copying"):
        grid, dense = (r["ov_copying"] if kind == "ov_copying" else r["scores"][kind] for r in (ours, theirs))
        for layer, kept in KEPT.items():
            assert grid[layer][len(kept):] == [None] * (4 - len(kept))  # no such head: null in the report
            np.testing.assert_allclose(grid[layer][:len(kept)], [dense[layer][h] for h in kept], rtol=1e-4, atol=1e-6)
    assert len(ours["top"]["induction"]) == 8  # every head there is, no empty cell ranked


def test_ablating_a_kept_head_zeroes_exactly_its_output_and_restores_the_logits(uneven):
    pruned, zeroed = uneven
    ids = pruned.to_tokens("abcabcab")
    before = pruned(ids)
    with mk.ablate(pruned, heads="0.1,2.1"), mk.record(pruned, ["blocks.0.attn.hook_z", "blocks.2.attn.hook_z"]) as ablated:
        logits = pruned(ids)
    with mk.record(pruned, ["blocks.0.attn.hook_z", "blocks.2.attn.hook_z"]) as clean:
        after = pruned(ids)
    assert torch.equal(before, after)  # the hooks detached: bit-exact
    for name in ("blocks.0.attn.hook_z", "blocks.2.attn.hook_z"):
        z, z0 = ablated[name], clean[name]
        assert torch.count_nonzero(z[:, :, 1]) == 0 and torch.count_nonzero(z0[:, :, 1]) > 0
    assert torch.equal(ablated["blocks.0.attn.hook_z"][:, :, 0], clean["blocks.0.attn.hook_z"][:, :, 0])  # untouched
    silenced = zeroed({0: [2], 1: [0, 1, 2, 3], 2: [0]})  # pruned head 0.1 is dense 0.3, head 2.1 is dense 2.2
    torch.testing.assert_close(logits, silenced(ids), rtol=1e-4, atol=1e-5)
    options = dict(tasks="swap", n=3, shots=2, baseline="none")
    ours = mk.run("ablate", model=pruned, write=False, heads="0.1,2.1", **options).results["conditions"]
    theirs = mk.run("ablate", model=zeroed(), write=False, heads="0.3,2.2", **options).results["conditions"]
    assert ours[1]["heads"] == [{"layer": 0, "head": 1}, {"layer": 2, "head": 1}]
    for mine, dense in zip(ours, theirs, strict=True):
        assert math.isclose(mine["metrics"]["swap"]["logprob"], dense["metrics"]["swap"]["logprob"], rel_tol=1e-4)


def test_attention_patterns_of_kept_heads_are_the_dense_models(uneven):
    from mechkit.model.headspec import Head
    from mechkit.report.patterns import record_patterns

    pruned, zeroed = uneven
    ids = pruned.to_tokens("abcdabcd")
    ours = record_patterns(pruned, ids, [Head(0, 0), Head(0, 1), Head(2, 1)]).values
    theirs = record_patterns(zeroed(), ids, [Head(0, 2), Head(0, 3), Head(2, 2)]).values
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    run = mk.run("attention", model=pruned, write=False, prompt="abcdabcd", heads="layer:0,2.1")
    assert [(h["layer"], h["head"]) for h in run.results["heads"]] == [(0, 0), (0, 1), (2, 1)]


def test_sweep_effects_of_kept_heads_are_the_dense_models_with_the_others_silenced(uneven):
    pruned, zeroed = uneven
    options = dict(tasks="swap", n=3, shots=2, method="both")
    ours = mk.run("sweep", model=pruned, write=False, **options).results
    theirs = mk.run("sweep", model=zeroed(), write=False, **options).results
    for method in ("exact", "attribution"):
        grid, dense = ours[method]["logprob_effect"], theirs[method]["logprob_effect"]
        for layer, kept in KEPT.items():
            assert grid[layer][len(kept):] == [None] * (4 - len(kept))
            np.testing.assert_allclose(grid[layer][:len(kept)], [dense[layer][h] for h in kept], rtol=1e-3, atol=1e-5)
    assert ours["agreement"]["spearman"] is None or -1 <= ours["agreement"]["spearman"] <= 1


def test_sweep_on_the_nnsight_backend_gives_the_native_effects(uneven_dir):
    """nnsight runs the exact sweep as whole traced forwards (one copy of the batch per head of a layer)."""
    options = dict(tasks="swap", n=3, shots=2, method="both")
    traced, native = (mk.run("sweep", model=str(uneven_dir), write=False, backend=b, **options).results
                      for b in ("nnsight", "native"))
    _close(traced, native)


def test_shuffling_kept_heads_moves_the_same_weights_as_on_the_dense_model(uneven):
    from mechkit.interventions.shuffle import shuffle_heads
    from mechkit.model.headspec import Head

    pruned, zeroed = uneven
    dense = zeroed()
    ids = pruned.to_tokens("abcabcab")
    with shuffle_heads(pruned, {Head(0, 1): Head(2, 1), Head(2, 1): Head(0, 1)}, component="qkov"):
        ours = pruned(ids)
    with shuffle_heads(dense, {Head(0, 3): Head(2, 2), Head(2, 2): Head(0, 3)}, component="qkov"):
        theirs = dense(ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    run = mk.run("shuffle", model=pruned, write=False, heads="0.0,0.1,2.1", tasks="swap", n=3, shots=2, seeds=1)
    assert run.results is not None


def test_function_vectors_of_kept_heads_are_the_dense_models_with_the_others_silenced(uneven):
    from mechkit.actvec.function_vectors import function_vector, mean_head_outputs
    from mechkit.model.headspec import Head
    from mechkit.tasks import build_prompts

    pruned, zeroed = uneven
    dense = zeroed()
    prompts = build_prompts("swap", n=2, shots=2, seed=0)
    ours, theirs = mean_head_outputs(pruned, prompts), mean_head_outputs(dense, prompts)
    for layer, kept in KEPT.items():
        torch.testing.assert_close(ours[layer, :len(kept)], theirs[layer, kept], rtol=1e-4, atol=1e-6)
        assert not ours[layer, len(kept):].any()  # no such head: nothing averaged there
    torch.testing.assert_close(function_vector(pruned, ours, [Head(0, 1), Head(2, 1)]),
                               function_vector(dense, theirs, [Head(0, 3), Head(2, 2)]), rtol=1e-4, atol=1e-6)
    options = dict(tasks="swap", n=2, n_dev=2, n_contexts=2, n_cie=2, shots=2, top_k=2, fv_scales="1",
                   method="function-vector")
    mine, other = (mk.run("icl-vectors", model=m, write=False, **options).results["per_task"]["swap"]["methods"]
                   ["function-vector"]["aie"] for m in (pruned, dense))
    for layer, kept in KEPT.items():
        assert mine[layer][len(kept):] == [None] * (4 - len(kept))
        np.testing.assert_allclose(mine[layer][:len(kept)], [other[layer][h] for h in kept], rtol=1e-3, atol=1e-6)


def test_compose_component_effects_of_kept_heads_are_the_dense_models_with_the_others_silenced(uneven):
    pruned, zeroed = uneven
    keep = ("n_effect", "top_k", "verify", "n_seqs", "seg_len")  # those the components part reads
    options = {**{k: OPTIONS["compose"][k] for k in keep}, "shots": "2", "parts": "components", "pairs": "capitalize+swap"}
    mine, other = (mk.run("compose", model=m, write=False, **options).results["components"]["pairs"]["capitalize+swap"]
                   for m in (pruned, zeroed()))
    for layer, kept in KEPT.items():
        assert mine["composite_specific_heads"][layer][len(kept):] == [None] * (4 - len(kept))
        np.testing.assert_allclose(mine["composite_specific_heads"][layer][:len(kept)],
                                   [other["composite_specific_heads"][layer][h] for h in kept], rtol=1e-3, atol=1e-6)


def test_patch_recovery_and_dla_of_kept_heads_are_the_dense_models_with_the_others_silenced(uneven):
    pruned, zeroed = uneven
    options = {**OPTIONS["patch"], "method": "both"}
    mine, other = (mk.run("patch", model=m, write=False, **options).results for m in (pruned, zeroed()))
    for key in ("head_recovery", "dla_heads", "attribution_head_recovery"):
        for layer, kept in KEPT.items():
            assert mine[key][layer][len(kept):] == [None] * (4 - len(kept)), key
            np.testing.assert_allclose(mine[key][layer][:len(kept)], [other[key][layer][h] for h in kept],
                                       rtol=1e-3, atol=1e-5, err_msg=key)


def test_finetune_saves_a_pruned_model_that_reloads(uneven, tmp_path):
    pruned, _ = uneven
    run = mk.run("finetune", model=pruned, out=tmp_path / "ft", task="capitalize", steps=2, batch_size=2, eval_n=2)

    assert CONFIG_KEY in json.loads((run.out_dir / "config.json").read_text())
    again = mk.load_model(str(run.out_dir), device="cpu")
    assert again.anatomy.head_counts == (2, 4, 2)
    assert not torch.equal(again.model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                           pruned.model.state_dict()["model.layers.0.self_attn.q_proj.weight"])  # it trained


def test_gpt2_fused_projections_keep_their_own_heads(tmp_path):
    """GPT-2's fused c_attn: the head rows of a layer that kept one head are that head's."""
    dense = mk.load_model(str(_tiny_dir(tmp_path / "gpt2", "gpt2")), device="cpu")
    pruned = prune_copy(dense, UnitsToRemove(heads={1: [0, 2, 3]}))
    assert pruned.anatomy.head_counts == (4, 1, 4)
    options = dict(n_seqs=3, seg_len=5, top_k=3)
    ours = mk.run("detect", model=pruned, write=False, **options).results["ov_copying"]
    theirs = mk.run("detect", model=_zeroed(dense, {1: [1]}), write=False, **options).results["ov_copying"]
    assert ours[1][1:] == [None] * 3
    np.testing.assert_allclose(ours[1][0], theirs[1][1], rtol=1e-5)
    np.testing.assert_allclose(ours[0] + ours[2], theirs[0] + theirs[2], rtol=1e-5)


# ---- what cannot run says why, in one line ------------------------------------------------------------

@pytest.mark.parametrize("plugin,words", [
    ("prune", "cannot prune again"),
    ("adapt", "prunes the model again"),
])
def test_a_plugin_that_cannot_handle_uneven_heads_refuses_in_one_line(uneven, plugin, words):
    from mechkit.errors import MechkitError

    with pytest.raises(MechkitError) as err:
        mk.run(plugin, model=uneven[0], write=False)
    line = str(err.value)
    assert "\n" not in line and "pruned heads (layers keeping different numbers of them)" in line and words in line
