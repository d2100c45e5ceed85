"""Least-squares reconstruction, sequential calibration and mixed calibration text, on tiny models."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.model.anatomy import discover_anatomy
from mechkit.model.modules.linear import weight_out_in
from mechkit.pruning import UnitsToRemove, calibrate, prune_copy, reconstruct, save_pruned
from mechkit.pruning.cost import calibration_text, heldout_text
from mechkit.pruning.reconstruct import Moments, solve


@pytest.fixture(scope="module")
def llama64():
    m = mk.load_model("tiny:llama", device="cpu")
    m.model.double()
    return m


@pytest.fixture(scope="module")
def calib64(llama64):
    return calibrate(llama64, ["capitalize", "swap"], n=4, shots=2, text_weight=0.3, n_text=4)


def _logits(handle, ids):
    with torch.no_grad():
        return handle(ids)


def _down_inputs(handle, layer, batches):
    """Per batch, the real tokens' inputs of ``layer``'s MLP down projection."""
    module, out = handle.anatomy.mlp_out(layer), []
    remove = module.register_forward_pre_hook(lambda _m, args: out.append(args[0]))
    try:
        with torch.no_grad():
            for b in batches:
                handle(b.ids, attention_mask=b.mask)
    finally:
        remove.remove()
    return [x[b.mask.bool()] for x, b in zip(out, batches, strict=True)]


def test_keeping_every_input_is_the_identity():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(200, 12, generator=gen, dtype=torch.float64), torch.randn(5, 12, generator=gen)
    mom = Moments(12)
    mom.add(x, torch.full((200,), 1 / 200, dtype=torch.float64))
    a, b = solve(w, torch.arange(12), mom, ridge=0.0)
    torch.testing.assert_close(a, w.double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(b, torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-12)


def test_an_infinite_ridge_is_mean_compensation():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(300, 10, generator=gen, dtype=torch.float64) + 2, torch.randn(4, 10, generator=gen)
    mom = Moments(10)
    mom.add(x, torch.full((300,), 1 / 300, dtype=torch.float64))
    keep, gone = torch.arange(6), torch.arange(6, 10)
    a, b = solve(w, keep, mom, ridge=1e12)
    torch.testing.assert_close(a, w[:, keep].double(), rtol=0, atol=1e-9)
    torch.testing.assert_close(b, w[:, gone].double() @ x[:, gone].mean(0), rtol=0, atol=1e-9)


@pytest.mark.parametrize("sequential", [False, True])
def test_dependent_channels_are_reconstructed_exactly(llama64, calib64, sequential):
    """Channels that are affine in kept ones (here: copies, one scaled) lose nothing: the fitted model
    is the dense one, where mean compensation is not."""
    model = copy.deepcopy(llama64.model)
    m = dataclasses.replace(llama64, model=model, anatomy=discover_anatomy(model))
    with torch.no_grad():
        for layer in (0, 1):
            mlp = m.anatomy.mlp(layer)
            mlp.gate_proj.weight[5:10] = mlp.gate_proj.weight[0:5]
            mlp.up_proj.weight[5:10] = 2 * mlp.up_proj.weight[0:5]  # x_{5+i} = 2·x_i
    plan = UnitsToRemove(mlp={0: list(range(5, 10)), 1: list(range(5, 10))}, compensate=True)
    ids = m.to_tokens(calib64.texts[:3])
    dense = _logits(m, ids)
    fits = reconstruct(m, plan, calib64.token_batches(m), ridge=0.0, sequential=sequential)
    torch.testing.assert_close(_logits(prune_copy(m, plan, calib64.stats, fits), ids), dense, rtol=0, atol=1e-9)
    assert not torch.allclose(_logits(prune_copy(m, plan, calib64.stats), ids), dense, atol=1e-4)


def test_lsq_beats_mean_compensation_on_the_calibration_objective(llama64, calib64):
    a = llama64.anatomy
    plan = UnitsToRemove(mlp={layer: list(range(0, a.d_mlp, 3)) for layer in (0, 1)}, compensate=True)
    batches = calib64.token_batches(llama64)
    fits = reconstruct(llama64, plan, batches, ridge=1e-3)
    for layer in (0, 1):
        fit = fits[f"model.layers.{layer}.mlp.down_proj"]
        w = weight_out_in(a.mlp_out(layer)).detach()
        gone = torch.tensor(plan.mlp[layer])
        xs = _down_inputs(llama64, layer, batches)
        mean = sum((x[:, gone] * b.weight[:, None]).sum(0) for x, b in zip(xs, batches, strict=True))
        keep_w, mean_bias = w[:, fit.keep], w[:, gone] @ mean

        def mse(weight, bias, xs=xs, w=w, fit=fit):
            return sum(float((((x @ w.T) - (x[:, fit.keep] @ weight.T + bias)) ** 2).sum(1) @ b.weight)
                       for x, b in zip(xs, batches, strict=True))

        assert mse(fit.weight, fit.bias) < 0.7 * mse(keep_w, mean_bias)


def test_sequential_fits_the_inputs_the_pruned_model_sees(llama64, calib64):
    """Layer 1's sequential fit is the least-squares fit of the dense layer-1 output on the inputs that
    the pruned, refitted model feeds its layer-1 down projection; the one-shot fit is not."""
    a = llama64.anatomy
    plan = UnitsToRemove(mlp={0: list(range(0, a.d_mlp, 2)), 1: list(range(1, a.d_mlp, 4))},
                     heads={0: [1, 3]}, compensate=True)
    batches = calib64.token_batches(llama64)
    name = "model.layers.1.mlp.down_proj"
    seq = reconstruct(llama64, plan, batches, ridge=1e-3, sequential=True)
    pruned = prune_copy(llama64, plan, calib64.stats, seq)
    w = weight_out_in(a.mlp_out(1)).detach()
    keep = seq[name].keep
    mom = Moments(len(keep), w.shape[0])
    for x_p, x_d, b in zip(_down_inputs(pruned, 1, batches), _down_inputs(llama64, 1, batches), batches,
                           strict=True):
        mom.add(x_p, b.weight, x_d @ w.T)
    want, want_bias = solve(w[:, keep], torch.arange(len(keep)), mom, ridge=1e-3)
    torch.testing.assert_close(seq[name].weight, want, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(seq[name].bias, want_bias, rtol=1e-6, atol=1e-8)
    once = reconstruct(llama64, plan, batches, ridge=1e-3)
    assert not torch.allclose(once[name].weight, seq[name].weight, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_reconstructed_model_saves_and_reloads_with_the_same_logits(family, tmp_path):
    m = mk.load_model(f"tiny:{family}", device="cpu")
    a = m.anatomy
    ids = m.to_tokens(["input: cat\noutput: Cat\n", "hello world"])
    before = _logits(m, ids)
    calib = calibrate(m, ["capitalize"], n=3, shots=2, text_weight=0.5)
    heads = [0, 2] if a.n_groups == 1 else [k * a.n_groups for k in range(a.n_kv_heads)]
    plan = UnitsToRemove(mlp={0: list(range(0, a.d_mlp, 4))}, heads={1: heads}, layers=[], compensate=True)
    fits = reconstruct(m, plan, calib.token_batches(m), ridge=1e-2, sequential=True)
    assert set(fits) == {f"{a.family.layers}.0.{a.family.mlp}.{a.family.mlp_out}",
                         f"{a.family.layers}.1.{a.family.attn}.{a.family.attn_out}"}
    pruned = prune_copy(m, plan, calib.stats, fits)
    again = mk.load_model(str(save_pruned(pruned, tmp_path / "pruned")), device="cpu")
    assert torch.equal(_logits(again, ids), _logits(pruned, ids))
    with torch.no_grad():  # greedy decoding with a KV cache, as a user would measure it
        assert torch.equal(again.model.generate(ids[:1], max_new_tokens=4, do_sample=False),
                           pruned.model.generate(ids[:1], max_new_tokens=4, do_sample=False))
    assert torch.equal(_logits(m, ids), before)  # the dense model is untouched, no hook left behind
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.model.modules())


def test_removed_layers_are_skipped_and_later_fits_land_on_renumbered_blocks(tiny_llama):
    calib = calibrate(tiny_llama, ["capitalize"], n=3, shots=2)
    plan = UnitsToRemove(mlp={0: [1, 2, 3], 1: [4, 5]}, layers=[0], compensate=True)
    fits = reconstruct(tiny_llama, plan, calib.token_batches(tiny_llama), sequential=True)
    assert list(fits) == ["model.layers.1.mlp.down_proj"]
    pruned = prune_copy(tiny_llama, plan, calib.stats, fits)
    assert torch.equal(pruned.model.model.layers[0].mlp.down_proj.weight, fits["model.layers.1.mlp.down_proj"].weight)


def test_calibration_text_is_mixed_by_weight_and_never_the_heldout_text(tiny_llama):
    held = heldout_text()[0]
    chunks = calibration_text(12)
    assert len(chunks) == 12 and not any(c[:200] in held for c in chunks)
    calib = calibrate(tiny_llama, ["capitalize"], n=3, shots=2, text_weight=0.25, n_text=5)
    assert calib.generic == calibration_text(5)
    batches = calib.token_batches(tiny_llama, batch_size=2)
    total = sum(float(b.weight.sum()) for b in batches)
    assert total == pytest.approx(1.0)
    task_only = calibrate(tiny_llama, ["capitalize"], n=3, shots=2)  # text weight 0: the prompts' tokens only
    assert sum(len(b.weight) for b in task_only.token_batches(tiny_llama)) == \
        sum(len(b.weight) for b in task_only.token_batches(tiny_llama, batch_size=100)) < \
        sum(len(b.weight) for b in batches)
    text_only = mk.pruning.collect_stats(tiny_llama, calib.generic)
    want = 0.75 * task_only.stats.mlp_mean + 0.25 * text_only.mlp_mean
    torch.testing.assert_close(calib.stats.mlp_mean, want)


def test_task_guides_mix_in_the_generic_texts_language_modelling_scores(tiny_llama):
    from mechkit.pruning.guides import gradient_scores, text_gradient_scores
    from mechkit.pruning.pipeline import guide_scores

    calib = calibrate(tiny_llama, ["capitalize"], n=3, shots=2, text_weight=0.4, n_text=3)
    task = gradient_scores(tiny_llama, calib.prompts, calib.stats)
    text = text_gradient_scores(tiny_llama, calib.generic, calib.stats)
    mixed = guide_scores(tiny_llama, "attribution", calib, text_weight=0.4)
    np.testing.assert_allclose(mixed.mlp, 0.6 * task.mlp + 0.4 * text.mlp, rtol=1e-12)
    np.testing.assert_array_equal(guide_scores(tiny_llama, "attribution", calib).mlp, task.mlp)  # weight 0
    assert (text.mlp > 0).all() and not np.allclose(text.mlp, task.mlp)


def test_moments_keep_the_variance_of_inputs_whose_mean_dwarfs_it():
    """float32 products over inputs near 3·10⁴ with unit spread: summed about the first batch's mean,
    the covariance (and so the fit) matches float64; raw second moments would lose it to rounding."""
    gen = torch.Generator().manual_seed(2)
    x = 3e4 + torch.randn(4000, 6, generator=gen, dtype=torch.float64)
    x[:, 5] = x[:, 4] - x[:, 3] + 3e4  # an affine dependency for the fit to find
    w = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    weight = torch.full((1000,), 1 / 4000, dtype=torch.float64)
    mom32, mom64 = Moments(6), Moments(6)
    for chunk in x.split(1000):
        mom32.add(chunk.float(), weight)
        mom64.add(chunk, weight)
    torch.testing.assert_close(mom32.stats()[1], torch.cov(x.T, correction=0), rtol=0, atol=2e-3)
    a, b = solve(w, torch.arange(5), mom32, ridge=0.0)
    torch.testing.assert_close(x[:, :5] @ a.T + b, x @ w.T, rtol=0, atol=1e-3 * float(w.abs().sum()))


def _kl_to_dense(dense, pruned, batches) -> float:
    """Token-weighted KL(dense ‖ pruned) of the next-token distributions."""
    total = 0.0
    with torch.no_grad():
        for b in batches:
            d = dense(b.ids, attention_mask=b.mask)[b.mask.bool()].double().log_softmax(-1)
            p = pruned(b.ids, attention_mask=b.mask)[b.mask.bool()].double().log_softmax(-1)
            total += float(((d.exp() * (d - p)).sum(-1) * b.weight).sum())
    return total


def test_one_shot_and_sequential_fits_both_cut_the_output_error(tiny_llama):
    """Half the channels of every layer and two heads gone: each lsq variant leaves the model's
    next-token distributions far closer to the dense ones than mean compensation does (which beats
    zeroing), on the calibration tokens and on held-out text."""
    from mechkit.pruning.reconstruct import token_batches

    m, a = tiny_llama, tiny_llama.anatomy
    calib = calibrate(m, ["capitalize", "swap"], n=4, shots=2, text_weight=0.5, n_text=4)
    batches = calib.token_batches(m)
    held = token_batches(m, [([heldout_text()[0][i:i + 500] for i in range(0, 3000, 500)], 1.0)])
    plan = UnitsToRemove(mlp={layer: list(range(0, a.d_mlp, 2)) for layer in range(a.n_layers)}, heads={1: [0, 2]},
                     compensate=True)
    zero = prune_copy(m, dataclasses.replace(plan, compensate=False))
    mean = prune_copy(m, plan, calib.stats)
    for on in (batches, held):
        err_mean = _kl_to_dense(m, mean, on)
        assert err_mean < _kl_to_dense(m, zero, on)
        for sequential in (False, True):
            fits = reconstruct(m, plan, batches, ridge=1e-2, sequential=sequential)
            assert _kl_to_dense(m, prune_copy(m, plan, calib.stats, fits), on) < 0.3 * err_mean


def test_fits_replace_mean_compensation_and_need_no_statistics(tiny_llama):
    calib = calibrate(tiny_llama, ["capitalize"], n=3, shots=2)
    plan = UnitsToRemove(mlp={0: [1, 2, 3]}, heads={1: [0, 2]}, compensate=True)
    fits = reconstruct(tiny_llama, plan, calib.token_batches(tiny_llama))
    ids = tiny_llama.to_tokens(["input: cat\noutput: Cat\n"])
    torch.testing.assert_close(_logits(prune_copy(tiny_llama, plan, None, fits), ids),
                               _logits(prune_copy(tiny_llama, plan, calib.stats, fits), ids), rtol=0, atol=0)
    with pytest.raises(ValueError, match="statistics"):
        prune_copy(tiny_llama, plan, None, {})
