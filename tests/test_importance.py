"""The exact sweep equals brute-force ablation; attribution tracks it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.eval.scoring import score_prompts
from mechkit.heads.effects import attribution_effects, exact_effects, spearman
from mechkit.model.headspec import Head
from mechkit.tasks import build_prompts


def test_exact_sweep_equals_full_forward_ablation(tiny):
    prompts = build_prompts("swap", n=6, shots=2, seed=0)
    effects = exact_effects(tiny, prompts, batch_size=4)
    clean = score_prompts(tiny, prompts).logprob
    assert abs(effects.clean_logprob - clean) < 1e-4
    for head in (Head(0, 1), Head(1, 3)):
        with mk.ablate(tiny, [head]):
            ablated = score_prompts(tiny, prompts).logprob
        assert abs(effects.logprob[head.layer, head.head] - (ablated - clean)) < 1e-4


def test_attribution_tracks_exact(tiny_llama):
    prompts = build_prompts("plus-one", n=6, shots=2, seed=1)
    exact = exact_effects(tiny_llama, prompts)
    attr = attribution_effects(tiny_llama, prompts)
    assert attr.logprob.shape == exact.logprob.shape
    assert abs(attr.clean_logprob - exact.clean_logprob) < 1e-4
    assert spearman(exact.logprob, attr.logprob) > 0.5
    assert np.isfinite(attr.logprob).all()
    ids = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        before = tiny_llama(ids)
    attribution_effects(tiny_llama, prompts[:2])
    with torch.no_grad():
        assert torch.equal(tiny_llama(ids), before)


def test_exact_effects_resume_from_finished_layers_with_identical_sums(tiny_llama):
    prompts = mk.build_prompts("capitalize", n=6, shots=1, seed=3)
    full = exact_effects(tiny_llama, prompts, batch_size=4)
    kept: dict = {}
    computed: list[str] = []

    class Interrupt(Exception):
        pass

    def step(key, compute, limit=[3]):  # noqa: B006 - a counter shared across calls
        if key in kept:
            return kept[key]
        if limit[0] == 0:
            raise Interrupt
        limit[0] -= 1
        computed.append(key)
        kept[key] = compute()
        return kept[key]

    with pytest.raises(Interrupt):
        exact_effects(tiny_llama, prompts, batch_size=4, step=step)
    assert computed == ["exact|batch0|clean", "exact|batch0|layer0", "exact|batch0|layer1"]
    computed.clear()

    def resume(key, compute):
        if key in kept:
            return kept[key]
        computed.append(key)
        kept[key] = compute()
        return kept[key]

    again = exact_effects(tiny_llama, prompts, batch_size=4, step=resume)
    assert computed == ["exact|batch1|clean", "exact|batch1|layer0", "exact|batch1|layer1"]  # nothing redone
    np.testing.assert_array_equal(again.logprob, full.logprob)
    np.testing.assert_array_equal(again.accuracy, full.accuracy)
    assert again.clean_logprob == full.clean_logprob
