"""The gradient promise (:mod:`mechkit.model.backends.grad`): forwards build no graph unless asked inside
``mk.enable_grad()``; code that needs gradients or trains turns grad on itself, so it also works under
a caller's global ``torch.no_grad()``. Both directions, and torch's grad mode left as found."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import mechkit as mk


@pytest.fixture
def tokens(tiny_llama):
    return tiny_llama.to_tokens(["the cat sat", "a b c"])


@pytest.fixture(autouse=True)
def grad_mode_restored():
    before = torch.is_grad_enabled()
    yield
    assert torch.is_grad_enabled() == before


def test_a_forward_builds_no_graph_by_default(tiny_llama, tokens):
    logits = tiny_llama(tokens)
    assert not logits.requires_grad and logits.grad_fn is None
    assert logits[0].numpy().shape == logits.shape[1:]  # what plt.imshow does to it
    assert not tiny_llama.forward(tokens, use_cache=False).logits.requires_grad


def test_enable_grad_asks_for_a_graph_even_under_no_grad(tiny_llama, tokens):
    for outer in (torch.enable_grad, torch.no_grad):
        with outer(), mk.enable_grad():
            logits = tiny_llama(tokens)
        assert logits.requires_grad
    logits.sum().backward()
    grads = [p.grad for p in tiny_llama.model.parameters()]
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)
    tiny_llama.model.zero_grad(set_to_none=True)


def test_torch_no_grad_inside_enable_grad_still_turns_it_off(tiny_llama, tokens):
    with mk.enable_grad(), torch.no_grad():
        assert not tiny_llama(tokens).requires_grad


def test_enable_grad_works_as_a_decorator(tiny_llama, tokens):
    @mk.enable_grad()
    def loss():
        return tiny_llama(tokens).logsumexp(-1).mean()

    assert loss().requires_grad and not tiny_llama(tokens).requires_grad


def test_recordings_and_ablations_keep_no_graph(tiny_llama, tokens):
    logits, cache = mk.run_with_cache(tiny_llama, tokens, "blocks.*.attn.hook_z")
    assert not logits.requires_grad and not any(v.requires_grad for v in cache.values())
    with mk.record(tiny_llama, "blocks.*.hook_resid_post") as rec, mk.ablate(tiny_llama, heads="0.1"):
        logits = tiny_llama(tokens)
    assert not logits.requires_grad and not any(v.requires_grad for v in rec.values())


@pytest.mark.parametrize("outer", [torch.enable_grad, torch.no_grad])
def test_gradients_turns_grad_on_itself(tiny_llama, tokens, outer):
    with outer():
        value, grads = mk.gradients(tiny_llama, "blocks.1.attn.hook_z", tokens, lambda lg: lg[:, -1].sum())
    z, g = grads["blocks.1.attn.hook_z"]
    assert z.shape == g.shape and bool(g.abs().sum() > 0)
    assert not value.requires_grad and all(p.grad is None for p in tiny_llama.model.parameters())


def test_an_analysis_returns_tensors_without_a_graph(tiny_llama):
    from mechkit.actvec.task_vectors import icl_task_vectors

    vectors = icl_task_vectors(tiny_llama, "capitalize", n_contexts=2, shots=2)
    assert vectors.shape[0] == tiny_llama.n_layers and not vectors.requires_grad


def test_finetune_trains_under_a_global_no_grad():
    with torch.no_grad():
        run = mk.run("finetune", model="tiny:llama", task="lowercase", steps=2, batch_size=2, eval_n=2,
                     write=False, console=Console(file=io.StringIO()))
    losses = run.results["losses"]
    assert len(losses) == 2 and all(isinstance(x, float) for x in losses)


def test_the_finetune_function_trains_under_no_grad(tiny_llama):
    from mechkit.taskarith.finetune import Recipe, finetune

    with torch.no_grad():
        out = finetune(tiny_llama, Recipe(task="capitalize", steps=2, batch_size=2))
    assert len(out.losses) == 2 and all(p.grad is None for p in tiny_llama.model.parameters())
