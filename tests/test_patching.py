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
