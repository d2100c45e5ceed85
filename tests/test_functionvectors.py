"""Function vectors: shuffled-label prompts, head means, indirect effects and the projected sum."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.actvec import function_vector, head_contributions, indirect_effects, mean_head_outputs
from mechkit.errors import MechkitError
from mechkit.eval.scoring import encode
from mechkit.model.headspec import Head, top_heads
from mechkit.tasks import build_prompts
from mechkit.tasks.shuffled import shuffle_labels, shuffled_label_prompts, split_demos


def test_shuffled_labels_keep_query_and_permute_outputs():
    clean = build_prompts("capitalize", n=4, shots=5, seed=3)
    shuffled = shuffled_label_prompts("capitalize", n=4, shots=5, seed=3)
    for c, s in zip(clean, shuffled, strict=True):
        assert (s.query, s.answer, s.accepted) == (c.query, c.answer, c.accepted)
        assert s.text.endswith(f"input: {c.query}\noutput:")
        (c_pairs, _), (s_pairs, _) = split_demos(c.text), split_demos(s.text)
        assert [x for x, _ in s_pairs] == [x for x, _ in c_pairs]
        assert sorted(y for _, y in s_pairs) == sorted(y for _, y in c_pairs)
        assert all(sy != cy for (_, sy), (_, cy) in zip(s_pairs, c_pairs, strict=True))
    assert shuffled == shuffled_label_prompts("capitalize", n=4, shots=5, seed=3)  # seeded


@pytest.mark.parametrize(("task", "shots"), [("capitalize", 1), ("capitalize", 0), ("ioi", 5)])
def test_too_few_demonstrations_cannot_be_shuffled(task, shots):
    # Nothing to permute: a "shuffled" prompt would silently be the clean one.
    with pytest.raises(MechkitError, match="too few to shuffle"):
        shuffled_label_prompts(task, n=2, shots=shots, seed=0)
    import random

    two = build_prompts("capitalize", n=1, shots=2, seed=0)[0]
    assert split_demos(shuffle_labels(two, random.Random(0)).text)[0] != split_demos(two.text)[0]


def test_mean_head_outputs_read_each_rows_last_token(tiny_llama):
    prompts = build_prompts("swap", n=3, shots=1, seed=0) + build_prompts("swap", n=2, shots=0, seed=0)
    means = mean_head_outputs(tiny_llama, prompts, batch_size=5)
    manual = 0
    for p in prompts:
        with mk.record(tiny_llama, "blocks.1.attn.hook_z") as cache, torch.no_grad():
            tiny_llama(tiny_llama.to_tokens(p.text))
        manual = manual + cache["blocks.1.attn.hook_z"][0, -1]
    torch.testing.assert_close(means[1], manual / len(prompts), rtol=1e-5, atol=1e-5)


def test_indirect_effect_is_zero_when_the_patch_is_the_heads_own_output(tiny_llama):
    prompt = build_prompts("swap", n=1, shots=2, seed=5)[:1]
    own = mean_head_outputs(tiny_llama, prompt)
    effects = indirect_effects(tiny_llama, prompt, own, heads_per_forward=3)
    assert effects.shape == (1, tiny_llama.anatomy.n_layers, tiny_llama.anatomy.n_heads)
    assert effects.abs().max() < 1e-6


def test_indirect_effect_matches_a_plain_patched_forward(tiny_llama):
    prompt = build_prompts("swap", n=1, shots=2, seed=6)[0]
    means = mean_head_outputs(tiny_llama, build_prompts("plus-one", n=3, shots=2, seed=0))
    effects = indirect_effects(tiny_llama, [prompt], means, heads_per_forward=5)[0]
    ids, start = encode(tiny_llama.tokenizer, prompt.text, prompt.answer)
    x, target = torch.tensor([ids[:start]]), ids[start]

    def prob(hook=None):
        with torch.no_grad(), mk.hooks(tiny_llama, hook or {}):
            return tiny_llama(x)[0, -1].softmax(-1)[target]

    base = prob()
    for layer, head in [(0, 1), (1, 3)]:
        def patch(z, _point, head=head, layer=layer):
            z = z.clone()
            z[:, -1, head] = means[layer, head]
            return z

        ref = prob({f"blocks.{layer}.attn.hook_z": patch}) - base
        torch.testing.assert_close(effects[layer, head], ref, rtol=1e-4, atol=1e-6)
    assert top_heads(effects, 1)[0] == Head(*divmod(int(effects.flatten().argmax()), effects.shape[1]))


def test_function_vector_is_the_sum_of_projected_head_means(tiny):
    a = tiny.anatomy
    gen = torch.Generator().manual_seed(0)
    means = torch.randn(a.n_layers, a.n_heads, a.d_head, generator=gen)
    heads = [Head(0, 1), Head(a.n_layers - 1, 0)]
    manual = 0
    with torch.no_grad():
        for h in heads:  # run the real output projection on one head's mean, the other heads zero
            z = torch.zeros(1, a.n_heads, a.d_head)
            z[0, h.head] = means[h.layer, h.head]
            proj = a.attn_out(h.layer)
            zero = proj(torch.zeros(1, a.n_heads * a.d_head))  # the bias, shared by all heads
            manual = manual + (proj(z.reshape(1, -1)) - zero)[0]
    torch.testing.assert_close(function_vector(tiny, means, heads), manual, rtol=1e-4, atol=1e-5)
    assert head_contributions(tiny, means).shape == (a.n_layers, a.n_heads, a.d_model)


def test_function_vector_example_on_tiny_model(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples/function_vectors.py"
    out = tmp_path / "fv.safetensors"
    result = subprocess.run([sys.executable, str(script), "--model", "tiny:llama", "--task", "swap", "--shots", "2",
                             "--n", "3", "--top-k", "2", "--out", str(out)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "zero-shot + FV at layer" in result.stdout and out.exists()
