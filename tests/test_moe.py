"""Mixture-of-experts models: experts are the MLP's units. The router's logits and the routing each expert's
output gets are hook points; zeroing an expert's routing removes exactly its output; analyses that need
dense MLP neurons refuse before any work."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

SMALL = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, num_experts_per_tok=2, **SPECIAL_TOKENS)


def _model(family: str):
    import transformers as T

    config = {"mixtral": lambda: T.MixtralConfig(**SMALL, num_local_experts=4),
              "olmoe": lambda: T.OlmoeConfig(**SMALL, num_experts=4)}[family]()
    torch.manual_seed(0)
    return mk.load_model(T.AutoModelForCausalLM.from_config(config).eval(), tokenizer=byte_tokenizer())


IDS = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_router_and_routing_are_recorded_per_token(family):
    m = _model(family)
    a = m.anatomy
    assert a.is_moe and a.n_experts == 4 and a.d_mlp == 0
    with torch.no_grad(), mk.record(m, ["blocks.*.mlp.hook_router", "blocks.*.mlp.hook_routing"]) as cache:
        m(IDS)
    logits, routing = cache["blocks.1.mlp.hook_router"], cache["blocks.1.mlp.hook_routing"]
    assert logits.shape == routing.shape == (2, 7, 4)
    assert ((routing != 0).sum(-1) == 2).all()  # top-2: two experts per token
    chosen = routing.topk(2, dim=-1).indices.sort(-1).values
    assert torch.equal(chosen, logits.topk(2, dim=-1).indices.sort(-1).values)  # the router's top logits


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_zeroing_every_experts_routing_empties_the_mlp_and_restores(family):
    m = _model(family)
    with torch.no_grad():
        clean = m(IDS)
        with mk.hooks(m, {"blocks.1.mlp.hook_routing": lambda w, _p: torch.zeros_like(w)}), \
                mk.record(m, "blocks.1.hook_mlp_out") as cache:
            cut = m(IDS)
        assert cache["blocks.1.hook_mlp_out"].abs().max() == 0
        assert not torch.equal(cut, clean)
        with mk.hooks(m, {"blocks.1.mlp.hook_routing": lambda w, _p: w.index_fill(-1, torch.tensor([2]), 0)}):
            one = m(IDS)  # expert 2 ablated: it changes only the tokens that had chosen it
        assert not torch.equal(one, clean)
        assert torch.equal(m(IDS), clean)


def test_attention_side_analyses_run_unchanged_and_neuron_ones_refuse():
    m = _model("mixtral")
    with torch.no_grad(), mk.ablate(m, "0.1,1.2"):
        m(IDS)
    with pytest.raises(MechkitError, match="mixture of 4 experts"):
        m.anatomy.mlp_out(0)
    with pytest.raises(MechkitError, match="no hook point"):
        mk.record(m, "blocks.0.mlp.hook_post").__enter__()
    with pytest.raises(MechkitError, match="mixture of 4 experts.*--target heads,layers"):
        mk.run("prune", model=m, write=False, target="neurons")


def _mlp_input_and_routing(m, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE block's input ``[tokens, d_model]`` and, by hand from the router's weight, the dense routing
    ``[tokens, n_experts]`` (softmax, top-k, renormalised where the config says so)."""
    seen = []
    remover = m.anatomy.mlp(layer).register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            m(ids)
    finally:
        remover.remove()
    x = seen[0].reshape(-1, seen[0].shape[-1])
    config = m.model.config
    probs = torch.softmax(x @ m.anatomy.router(layer).weight.T, dim=-1)
    top = probs.topk(config.num_experts_per_tok, dim=-1)
    weights = top.values
    if getattr(config, "norm_topk_prob", True):  # Mixtral always renormalises; OLMoE's config says
        weights = weights / weights.sum(-1, keepdim=True)
    return x, torch.zeros_like(probs).scatter(-1, top.indices, weights)


def _by_hand(m, layer: int, expert: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``expert``'s unweighted output on ``x`` from its fused weights: down(silu(gate) * up)."""
    bank = m.anatomy.experts(layer)
    gate, up = (x @ bank.gate_up_proj[expert].T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ bank.down_proj[expert].T


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_expert_out_is_each_experts_weighted_output(family):
    m = _model(family)
    with torch.no_grad(), mk.record(m, ["blocks.1.mlp.hook_expert_out", "blocks.1.hook_mlp_out"]) as cache:
        clean = m(IDS)
    out = cache["blocks.1.mlp.hook_expert_out"]
    assert out.shape == (2, 7, 4, 64)
    x, routing = _mlp_input_and_routing(m, 1, IDS)
    with torch.no_grad():
        for e in range(4):
            want = (_by_hand(m, 1, e, x) * routing[:, e:e + 1]).reshape(2, 7, 64)
            torch.testing.assert_close(out[:, :, e], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.sum(-2), cache["blocks.1.hook_mlp_out"], rtol=1e-5, atol=1e-6)
        with mk.hooks(m, {"blocks.1.mlp.hook_expert_out": lambda o, _p: o.index_fill(2, torch.tensor([1]), 0)}):
            cut = m(IDS)  # a replacement: the bank's output is its sum over experts
        with mk.hooks(m, {"blocks.1.mlp.hook_routing": lambda w, _p: w.index_fill(-1, torch.tensor([1]), 0)}):
            zeroed = m(IDS)
        torch.testing.assert_close(cut, zeroed, rtol=1e-5, atol=1e-5)
        assert torch.equal(m(IDS), clean)


REF = torch.randint(0, 256, (3, 5), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_zero_and_mean_ablation_of_an_expert_match_a_hand_computation(family):
    m = _model(family)
    with torch.no_grad(), mk.record(m, "blocks.1.hook_resid_post") as cache:
        clean = m(IDS)
    x, routing = _mlp_input_and_routing(m, 1, IDS)
    rx, rrouting = _mlp_input_and_routing(m, 1, REF)
    with torch.no_grad():
        own = (_by_hand(m, 1, 3, x) * routing[:, 3:4]).reshape(2, 7, 64)  # expert 3's part of the stream
        mean = (_by_hand(m, 1, 3, rx) * rrouting[:, 3:4]).mean(0)  # over every reference token, chosen or not
        resid = cache["blocks.1.hook_resid_post"]
        unembed = m.model.get_output_embeddings()
        want = {"zero": unembed(m.anatomy.final_norm(resid - own)),
                "mean": unembed(m.anatomy.final_norm(resid - own + mean))}
        for mode, logits in want.items():
            with mk.ablate(m, experts="1.e3", mode=mode, reference=REF) as chosen:
                got = m(IDS)
            assert [str(e) for e in chosen] == ["1.e3"]
            torch.testing.assert_close(got, logits, rtol=1e-4, atol=1e-5)
            assert not torch.allclose(got, clean, atol=1e-4)
        with mk.ablate(m, "0.1", "resample", experts="*.e1", reference=REF) as chosen:
            m(IDS)
        assert [str(u) for u in chosen] == ["0.1", "0.e1", "1.e1"]
        assert torch.equal(m(IDS), clean)  # every hook detached: logits bit-exact


def test_expert_specs_are_checked_and_stay_apart_from_head_specs():
    m = _model("mixtral")
    for spec, problem in [("1.2", "malformed expert spec"), ("2.e0", "out of range"), ("1.e4", "out of range"),
                          ("", "empty expert spec")]:
        with pytest.raises(MechkitError, match=problem):
            mk.ablate(m, experts=spec).__enter__()
    with pytest.raises(MechkitError, match="malformed head spec"):
        mk.ablate(m, heads="1.e2").__enter__()
    with pytest.raises(MechkitError, match="no expert bank"):
        mk.ablate(mk.load_model("tiny:llama"), experts="0.e0").__enter__()


def test_head_pruning_works_on_mixtral_and_is_refused_where_heads_share_a_norm(tmp_path):
    """Head pruning is attention-side: it runs unchanged on Mixtral (the neuron statistics a dense MLP would
    add are skipped). OLMoE's q_norm normalises all heads together, so slicing one out would change the
    others: refused in one line before any work, with a target that works."""
    run = mk.run("prune", model=_model("mixtral"), write=False, target="heads", sparsity="0.25", n=2, shots=1,
                 tasks="capitalize")
    assert run.report["checks"]["logits_unchanged"] and "heads=0.25" in run.report["finding"]
    olmoe = _model("olmoe")
    with pytest.raises(MechkitError, match=r"normalises all heads together \(q_norm.*--target layers"):
        mk.run("prune", model=olmoe, write=False, target="heads", sparsity="0.25", n=2, shots=1, tasks="capitalize")
    assert mk.run("prune", model=olmoe, write=False, target="layers", sparsity="0.5", n=2, shots=1,
                  tasks="capitalize").report["checks"]["logits_unchanged"]


ATTENTION_SIDE = [("detect", dict(n_seqs=4, seg_len=5, batch_size=2)),
                  ("shuffle", dict(heads="0.1,1.2", n_seqs=4, seg_len=5, tasks="capitalize", n=2, shots=1)),
                  ("sweep", dict(method="both", tasks="capitalize", n=2, shots=1)),
                  ("patch", dict(clean="abcab", corrupted="abdab", answers="c,d", method="both")),
                  ("attention", dict(prompt="abc abc abc", heads="0.1,layer:1"))]


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_attention_side_plugins_run_on_a_mixture_of_experts(family):
    m = _model(family)
    for plugin, options in ATTENTION_SIDE:
        run = mk.run(plugin, model=m, write=False, **options)
        assert run.report["checks"]["logits_unchanged"] and run.report["finding"], plugin
