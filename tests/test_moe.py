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
