"""Activation patching (mechkit.patching): batched scans equal single patches, a hand-written hook and
TransformerLens' patching functions; bad input is refused in one line; hooks detach."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.patching import Patch, answer_id, denoise, logit_diff, noise, run_patched


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return mk.load_model(f"tiny:{request.param}", device="cpu")


def _pair(m):
    """Prompts differing at position 2 only; answers are single tokens of the byte tokenizer."""
    return m.to_tokens("abcab"), m.to_tokens("abdab"), answer_id(m, "c"), answer_id(m, "d")


def _no_hooks(m) -> bool:
    return all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.model.modules())


def test_a_patch_equals_a_hand_written_hook(model):
    clean, corrupt, _, _ = _pair(model)
    _, cache = mk.run_with_cache(model, clean, "blocks.1.hook_resid_pre")

    def by_hand(act, _point):  # the user's 11 lines, shortened
        act = act.clone()
        act[:, 2] = cache["blocks.1.hook_resid_pre"][:, 2]
        return act

    with torch.no_grad(), mk.hooks(model, {"blocks.1.hook_resid_pre": by_hand}):
        expected = model(corrupt)
    got = run_patched(model, corrupt, cache, Patch("blocks.1.hook_resid_pre", positions=(2,)))
    assert torch.equal(got, expected)
    # a second prompt as the source gives the same as its cache
    assert torch.equal(run_patched(model, corrupt, clean, Patch("blocks.1.hook_resid_pre", positions=(2,))), expected)


@pytest.mark.parametrize(("point", "over"), [("hook_resid_pre", "position"), ("attn.hook_z", "head"),
                                             ("attn.hook_pattern", "head"), ("hook_attn_out", "position"),
                                             ("hook_resid_mid", "position"), ("mlp.hook_post", "position")])
def test_a_batched_scan_equals_one_patch_per_forward(model, point, over):
    clean, corrupt, c, w = _pair(model)
    result = denoise(model, clean, corrupt, point, lambda logits: logit_diff(logits, c, w), over=over, batch_size=3)
    for layer in range(model.n_layers):
        for i in range(result.values.shape[1]):
            where = {"heads": (i,)} if over == "head" else {"positions": (i,)}
            logits = run_patched(model, corrupt, clean, Patch(f"blocks.{layer}.{point}", **where))
            torch.testing.assert_close(result.values[layer, i], logit_diff(logits[0, -1], c, w), atol=1e-4, rtol=0)
    assert _no_hooks(model)


def test_denoising_the_stream_where_the_prompts_differ_recovers_all(model):
    clean, corrupt, c, w = _pair(model)
    metric = lambda logits: logit_diff(logits, c, w)  # noqa: E731
    rec = denoise(model, clean, corrupt, "hook_resid_pre", metric).recovery
    assert rec[0, 2] == pytest.approx(1.0, abs=1e-4)  # the clean stream at the only differing token: all of it
    assert rec[0, [0, 1, 3, 4]].abs().max() < 1e-4  # identical activations change nothing
    back = noise(model, clean, corrupt, "hook_resid_pre", metric)
    assert back.direction == "noising" and back.values[0, 2] == pytest.approx(back.corrupted, abs=1e-4)


def test_scans_equal_transformer_lens_patching(model):
    pytest.importorskip("transformer_lens")
    from transformer_lens import patching

    clean, corrupt, c, w = _pair(model)
    bridge = mk.to_transformer_lens(model)
    _, cache = mk.run_with_cache(model, clean)
    tl_cache = cache.to_transformer_lens(bridge)
    metric = lambda logits: logit_diff(logits, c, w)  # noqa: E731
    tl_metric = lambda logits: logit_diff(logits[:, -1], c, w).mean()  # noqa: E731
    ours = denoise(model, clean, corrupt, "hook_resid_pre", metric).values
    theirs = patching.get_act_patch_resid_pre(bridge, corrupt, tl_cache, tl_metric)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=1e-4)


def test_hooks_detach_and_logits_are_unchanged(model):
    clean, corrupt, c, w = _pair(model)
    with torch.no_grad():
        before = model(corrupt)
    denoise(model, clean, corrupt, "attn.hook_z", lambda logits: logit_diff(logits, c, w), over="head")
    run_patched(model, corrupt, clean, [Patch("blocks.0.attn.hook_q", heads=(1,)), Patch("blocks.1.hook_resid_mid")])
    with torch.no_grad():
        assert torch.equal(model(corrupt), before)
    assert _no_hooks(model)


@pytest.mark.parametrize(("make", "message"), [
    (lambda m, a, b: run_patched(m, b, a, Patch("blocks.0.hook_nothing")), "no hook point matches"),
    (lambda m, a, b: run_patched(m, b, a, Patch("blocks.*.hook_resid_pre")), "names one hook point"),
    (lambda m, a, b: run_patched(m, b, a, Patch("blocks.0.hook_resid_pre", positions=(9,))), "position 9 is out of range"),
    (lambda m, a, b: run_patched(m, b, a, Patch("blocks.0.attn.hook_z", heads=(4,))), "head 4 is out of range"),
    (lambda m, a, b: run_patched(m, b, a, Patch("blocks.0.hook_resid_pre", heads=(0,))), "heads= applies to"),
    (lambda m, a, b: run_patched(m, b, a, Patch("ln_final.hook_scale")), "can be read, not patched"),
    (lambda m, a, b: run_patched(m, m.to_tokens("abdabx"), a, Patch("blocks.0.hook_resid_pre")), "has 5 tokens and the target 6"),
    (lambda m, a, b: answer_id(m, "cd"), "is 2 tokens, not one"),
])
def test_bad_input_is_refused_in_one_line(model, make, message):
    clean, corrupt, _, _ = _pair(model)
    with pytest.raises(MechkitError, match=message) as err:
        make(model, clean, corrupt)
    assert "\n" not in str(err.value)


def test_different_lengths_patch_with_source_positions(model):
    clean, _, _, _ = _pair(model)
    longer = model.to_tokens("xabdab")
    got = run_patched(model, longer, clean, Patch("blocks.0.hook_resid_pre", positions=(3,), source_positions=(2,)))
    _, cache = mk.run_with_cache(model, clean, "blocks.0.hook_resid_pre")

    def by_hand(act, _point):
        act = act.clone()
        act[:, 3] = cache["blocks.0.hook_resid_pre"][:, 2]
        return act

    with torch.no_grad(), mk.hooks(model, {"blocks.0.hook_resid_pre": by_hand}):
        assert torch.equal(got, model(longer))


def test_the_patch_plugin_reports_recovery_dla_and_a_finding(tmp_path):
    from plugins.patch import PatchPlugin

    run = mk.run(PatchPlugin, model="tiny:llama", out=tmp_path / "patch", clean="abcab", corrupted="abdab",
                 answers="c,d")
    results = run.report["results"]
    assert results["resid_recovery"][0][2] == pytest.approx(1.0, abs=1e-4)  # the only differing token, layer 0
    assert results["tokens"][2] == "c/d" and abs(results["dla_unexplained"]) < 1e-4
    assert "restores 100%" in run.report["finding"]
    assert {"resid_pre_recovery.png", "head_recovery.png", "dla_heads.png"} <= set(run.report["artifacts"])
    assert [t.title for t in PatchPlugin.tables(results)][0].startswith("Heads whose")


@pytest.mark.parametrize(("options", "message"), [
    ({"clean": "abcab"}, "go together"),
    ({"clean": "abcab", "corrupted": "abdab", "answers": "c"}, "two answers"),
])
def test_the_plugin_refuses_incomplete_pairs_before_loading(tmp_path, options, message):
    from mechkit.options import OptionError
    from plugins.patch import PatchPlugin

    with pytest.raises(OptionError, match=message):
        mk.run(PatchPlugin, model="no-such-model", out=tmp_path / "x", **options)


# --- attribution patching, prompt pairs, averaging, every backend -------------------------------------------

def test_attribution_is_exact_to_first_order(model):
    """With a source a small step ε from the target, exact patching moves the metric by (a' − a)·∇ + O(ε²):
    the attribution estimate matches it to within a tenth of the largest change (an independent check of the
    gradient bookkeeping; a wrong sign, slice or scale misses by the whole change)."""
    from mechkit.patching.attribution import attribute

    clean, _, c, w = _pair(model)
    metric = lambda logits: logit_diff(logits, c, w)  # noqa: E731
    _, cache = mk.run_with_cache(model, clean, ["blocks.*.hook_resid_pre", "blocks.*.attn.hook_z"])
    step = {k: v + 1e-3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in cache.items()}
    for point, over in (("hook_resid_pre", "position"), ("attn.hook_z", "head")):
        est, base = attribute(model, clean, step, point, metric, over=over)
        from mechkit.patching import scan

        exact = scan(model, clean, step, point, metric, over=over)
        assert (est - base).abs().max() > 1e-6  # the step moves the metric
        assert torch.allclose(est, exact, atol=2e-5 + 0.1 * float((exact - base).abs().max())), point


def test_attribution_ranks_like_exact_patching_and_says_so(model):
    from mechkit.patching.attribution import agreement, attribute_patching

    clean, corrupted = model.to_tokens("the cat sat on the mat"), model.to_tokens("the dog sat on the mat")
    metric = lambda logits: logit_diff(logits, 5, 6)  # noqa: E731
    exact = denoise(model, clean, corrupted, "attn.hook_z", metric, over="head")
    approx = attribute_patching(model, clean, corrupted, "attn.hook_z", metric, over="head")
    assert (approx.clean, approx.corrupted) == pytest.approx((exact.clean, exact.corrupted), abs=1e-5)
    assert approx.direction == "denoising (attribution)"
    found = agreement(exact.values, approx.values)
    assert found["spearman"] > 0.5 and found["top_k_overlap"] >= 0.6


def test_icl_pairs_shuffle_every_label_and_keep_the_query():
    from mechkit.patching.pairs import icl_pairs

    for pair in icl_pairs("country-capital", 5, seed=3, shots=5):
        demos = lambda text: [d.split("\noutput: ") for d in text.split("input: ")[1:-1]]  # noqa: E731
        clean, corrupted = demos(pair.clean), demos(pair.corrupted)
        assert [i for i, _ in clean] == [i for i, _ in corrupted]  # the same inputs, in order
        assert sorted(o for _, o in clean) == sorted(o for _, o in corrupted)  # the same labels ...
        assert all(a != b for (_, a), (_, b) in zip(clean, corrupted, strict=True))  # ... none in its place
        assert pair.clean.rsplit("input: ", 1)[1] == pair.corrupted.rsplit("input: ", 1)[1]


def test_icl_pairs_line_up_token_by_token(model):
    """With the model's tokenizer every label is replaced by one of the same length in tokens, so a patch
    at position p reads the same role in both prompts; the rest of the prompt is unchanged."""
    from mechkit.patching.pairs import aligned, icl_pairs

    pairs = icl_pairs("country-capital", 6, seed=1, shots=4, tokenizer=model.tokenizer)
    kept = aligned(model, pairs)
    assert len(kept) >= 4
    n_tokens = lambda text: len(model.tokenizer(" " + text, add_special_tokens=False)["input_ids"])  # noqa: E731
    for pair, (clean, corrupted, _c, _w) in kept:
        assert clean.shape == corrupted.shape
        a, b = (t.split("\n") for t in (pair.clean, pair.corrupted))
        assert [x for x in a if not x.startswith("output: ")] == [y for y in b if not y.startswith("output: ")]
        labels = [(x[8:], y[8:]) for x, y in zip(a, b, strict=True) if x.startswith("output: ") and x != "output:"]
        assert all(x != y and n_tokens(x) == n_tokens(y) for x, y in labels)


def test_averaging_pairs_averages_the_metric_then_normalizes(model):
    from mechkit.patching.pairs import PromptPair, tokens
    from mechkit.patching.study import run_study

    a = tokens(model, PromptPair("abcab", "abdab", "c", "d"))
    b = tokens(model, PromptPair("xbcab", "xbdab", "c", "d"))
    one, two = run_study(model, [a]), run_study(model, [b])
    both = run_study(model, [a, b])
    assert both.n_pairs == 2 and both.n_resid_pairs == 2
    assert torch.allclose(both.resid.values, (one.resid.values + two.resid.values) / 2)
    assert both.heads.clean == pytest.approx((one.heads.clean + two.heads.clean) / 2)
    assert torch.allclose(both.dla_heads, (one.dla_heads + two.dla_heads) / 2)
    longer = tokens(model, PromptPair("abcabz", "abdabz", "c", "d"))  # another length: heads only
    mixed = run_study(model, [a, longer])
    assert mixed.n_pairs == 2 and mixed.n_resid_pairs == 1 and torch.equal(mixed.resid.values, one.resid.values)


def test_the_plugin_patches_an_icl_task_with_attribution_and_its_agreement(tmp_path):
    run = mk.run("patch", model="tiny:llama", out=tmp_path / "icl", task="capitalize", pairs=2, shots=3, method="both")
    results = run.report["results"]
    assert results["n_pairs"] == 2 and results["pairs"][0]["first_token"]
    assert set(results["agreement"]) == {"resid", "heads"}
    assert "Attribution patching ranks the heads" in run.report["finding"] and "mean of 2 pairs" in run.report["finding"]
    assert "attribution_head_recovery.png" in run.report["artifacts"]


@pytest.mark.parametrize(("options", "message"), [
    ({"task": "repeat-tokens"}, "no prompt pairs"),
    ({"task": "capitalise"}, "unknown task"),
    ({"method": "fast"}, "fast"),
])
def test_the_plugin_refuses_bad_tasks_before_loading(tmp_path, options, message):
    with pytest.raises(MechkitError, match=message):
        mk.run("patch", model="no-such-model", out=tmp_path / "x", **options)
    assert not (tmp_path / "x").exists()


RUNS = [("native", None), ("nnsight", None), ("nnsight", "local")]


def test_the_same_numbers_on_every_backend_and_a_device_map(tmp_path):
    """native, nnsight in process, nnsight --remote local (the strict NDIF simulation) and a model with a
    layer offloaded to disk give bit-identical patching, attribution, DLA and lens results."""
    options = {"clean": "abcab xy", "corrupted": "abdab xy", "answers": "c,d", "method": "both", "write": False}
    runs = [mk.run("patch", model="tiny:llama", device="cpu", backend=b, remote=r, **options).results for b, r in RUNS]
    disk = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
            "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
    offloaded = mk.load_model("tiny:llama", device_map=disk, offload_folder=tmp_path / "off")
    runs.append(mk.run("patch", model=offloaded, **options).results)
    keys = ("resid_recovery", "head_recovery", "attribution_resid_recovery", "attribution_head_recovery", "dla_heads",
            "dla_attn", "dla_mlp", "lens_logit_diff", "clean", "corrupted")
    for other in runs[1:]:
        for key in keys:
            assert torch.allclose(torch.tensor(other[key]), torch.tensor(runs[0][key]), atol=1e-6), key
