"""Ground truth on the toy induction model: the circuit it must have, measured from scratch here.

On ``[BOS] + seg + seg`` the second copy is predictable only by induction, so a trained toy model
must (1) predict the second copy far better than the first, (2) have a layer-1 head attending from
each second-copy token to the token after its earlier occurrence, and (3) have a layer-0 head
attending to the previous position, the other half of the circuit. Scores are computed here from
recorded patterns, independently of any scoring code in mechkit. Training runs once per machine
(the weights are cached), so later sessions take seconds.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import mechkit as mk
import mechkit.model.sources.toy as toy
from mechkit.tasks import repeated_random_tokens

pytestmark = pytest.mark.slow

SEG = 20
N_SEQS = 32
EVAL_SEED = 2024  # not a training seed: training draws its data from torch.Generator(seed)


@pytest.fixture(scope="module")
def trained():
    """The default toy model (trained on the first use on this machine, else loaded from the cache)."""
    model, tok = toy.toy_model()
    return model, tok


@pytest.fixture(scope="module")
def handle(trained):
    model, tok = trained
    return mk.load_model(model, tokenizer=tok, device="cpu")


@pytest.fixture(scope="module")
def measured(handle):
    """Per-position loss and the pattern of every layer on fresh repeated random tokens."""
    tok = handle.tokenizer
    ids = torch.as_tensor(repeated_random_tokens(
        handle.model.config.vocab_size, n_seqs=N_SEQS, seg_len=SEG, seed=EVAL_SEED,
        bos_id=tok.bos_token_id, exclude_ids=(tok.eos_token_id, tok.pad_token_id)))
    assert ids.shape == (N_SEQS, 1 + 2 * SEG) and int(ids[:, 1:].max()) < 256
    with torch.no_grad(), mk.record(handle, "blocks.*.attn.hook_pattern") as cache:
        logits = handle(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    patterns = [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(handle.n_layers)]
    return ids, loss, patterns


def induction_scores(pattern: torch.Tensor) -> torch.Tensor:
    """[heads]: attention from second-copy position t to the position after t's earlier occurrence."""
    queries = torch.arange(1 + SEG, 1 + 2 * SEG)  # the second copy
    keys = queries - SEG + 1  # earlier occurrence is t - SEG; the token after it is one further
    return pattern[:, :, queries, keys].mean(dim=(0, 2))


def previous_token_scores(pattern: torch.Tensor) -> torch.Tensor:
    """[heads]: attention from every position t >= 1 to t - 1."""
    queries = torch.arange(1, pattern.shape[-2])
    return pattern[:, :, queries, queries - 1].mean(dim=(0, 2))


def test_toy_model_shape(handle):
    a = handle.anatomy
    assert (a.n_layers, a.n_heads, a.n_kv_heads) == (2, 4, toy.CONFIG["num_key_value_heads"])
    assert handle.model.config.vocab_size == len(handle.tokenizer) == 259
    assert handle.tokenizer.bos_token_id == toy.BOS_ID


def test_second_copy_is_predicted_by_induction(measured):
    _, loss, _ = measured
    first = loss[:, :SEG].mean().item()  # predicting the first copy (from BOS on): unpredictable
    second = loss[:, SEG + 1:].mean().item()  # second copy after its first token (unpredictable too)
    assert abs(first - math.log(256)) < 0.5, f"first-copy loss {first:.3f} should be near ln 256"
    assert second < 0.3 * first, f"second-copy loss {second:.3f} vs first-copy {first:.3f}"
    assert second < 0.5


def test_layer1_has_an_induction_head_layer0_has_none(measured):
    _, _, (p0, p1) = measured
    ind0, ind1 = induction_scores(p0), induction_scores(p1)
    best = ind1.max().item()
    assert best > 0.5, f"best layer-1 induction score {best:.3f} (scores {ind1.tolist()})"
    # layer 0 cannot compose with anything: its heads see only token identity and position
    assert (ind0 < best).all() and (ind0 < 0.2).all(), ind0.tolist()


def test_layer0_has_a_previous_token_head(measured):
    _, _, (p0, p1) = measured
    prev0 = previous_token_scores(p0)
    assert prev0.max().item() > 0.5, prev0.tolist()
    assert prev0.max() > previous_token_scores(p1).max()


def test_patterns_are_causal_distributions(measured):
    ids, _, patterns = measured
    for p in patterns:
        assert p.shape == (N_SEQS, 4, ids.shape[1], ids.shape[1])
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        assert p.triu(diagonal=1).abs().max() == 0


def test_cached_load_is_identical_and_fast(trained):
    model, _ = trained
    target = toy.cache_dir()
    assert (target / "model.safetensors").is_file() and (target / "config.json").is_file()
    assert not [f.name for f in target.iterdir() if f.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt")]
    start = time.perf_counter()
    again, tok = toy.toy_model()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.5, f"cached load took {elapsed:.2f} s"
    assert tok.bos_token_id == toy.BOS_ID
    mine, theirs = dict(model.named_parameters()), dict(again.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, p in mine.items():
        assert torch.equal(p, theirs[name]), name


def test_cache_round_trip_saves_what_was_trained(tmp_path, monkeypatch, trained):
    """In a fresh cache: the first call trains (stubbed) and writes; the second loads bit-identical weights."""
    model, tok = trained
    calls = []

    def fake_train(seed, steps, **_):
        calls.append((seed, steps))
        return model, tok

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(toy, "train_induction_model", fake_train)
    toy.toy_model(seed=3, steps=7)
    loaded, _ = toy.toy_model(seed=3, steps=7)
    assert calls == [(3, 7)]
    target = tmp_path / "toy" / f"induction-{toy.recipe_hash(3, 7)}"
    assert toy.cache_dir(3, 7) == target and (target / "mechkit-toy.json").is_file()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp dir left behind
    for name, p in model.state_dict().items():
        assert torch.equal(p, loaded.state_dict()[name]), name
    assert toy.recipe_hash(3, 7) not in (toy.recipe_hash(3, 8), toy.recipe_hash(4, 7))


def test_training_is_deterministic_given_the_seed():
    a, _ = toy.train_induction_model(seed=1, steps=5)
    b, _ = toy.train_induction_model(seed=1, steps=5)
    c, _ = toy.train_induction_model(seed=2, steps=5)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


# --- mechkit's analyses recover the known circuit -------------------------------------------


@pytest.mark.slow
def test_detect_plugin_recovers_the_known_circuit():
    run = mk.run("detect", model="toy:induction", write=False, n_seqs=16, seg_len=15, top_k=2)
    top_induction = run.results["top"]["induction"][0]
    top_previous = run.results["top"]["previous-token"][0]
    assert top_induction["layer"] == 1 and top_induction["score"] > 0.5
    assert top_previous["layer"] == 0 and top_previous["score"] > 0.5
    assert run.results["loss_second_copy"] < 0.3 * run.results["loss_first_copy"]


@pytest.mark.slow
def test_ablating_the_circuit_breaks_copying_and_random_heads_do_not():
    from mechkit.heads.scores import copy_loss, head_scores, repeated_tokens, token_loss
    from mechkit.model.headspec import Head, top_heads

    handle = mk.load_model("toy:induction", device="cpu")
    scores = head_scores(handle, repeated_tokens(handle, 16, 15, seed=0), 15).scores
    tokens = repeated_tokens(handle, 16, 15, seed=1)  # held out
    clean = copy_loss(token_loss(handle, tokens), 15)[1]
    induction = top_heads(scores["induction"], 2)
    previous = top_heads(scores["previous-token"], 1)
    with mk.ablate(handle, induction + previous):
        broken = copy_loss(token_loss(handle, tokens), 15)[1]
    with mk.ablate(handle, [Head(0, h) for h in range(4) if Head(0, h) not in previous][:1]):
        other = copy_loss(token_loss(handle, tokens), 15)[1]
    assert broken > clean + 2.0  # copying is gone
    assert other < broken / 2    # an unrelated head matters far less
