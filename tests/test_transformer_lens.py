"""TransformerLens interop: a TransformerBridge in, a bridge out, recordings as ActivationCache."""

from __future__ import annotations

import json

import pytest
import torch

import mechkit as mk
from mechkit.errors import ModelLoadError

pytest.importorskip("transformer_lens")

NAMES = ["blocks.*.hook_resid_pre", "blocks.*.hook_resid_post", "blocks.*.attn.hook_z", "blocks.*.attn.hook_pattern",
         "blocks.*.hook_attn_out", "blocks.*.mlp.hook_post", "blocks.*.hook_mlp_out"]


def _ids(m):
    return m.to_tokens(["hello world", "abc defg hi"])


@pytest.fixture(params=["llama", "gpt2"])
def model(request):
    return mk.load_model(f"tiny:{request.param}", device="cpu")


def _state(m) -> tuple:
    return (m.model.config._attn_implementation, [type(x).__name__ for x in m.model.modules()],
            [p.detach().clone() for p in m.model.parameters()])


def test_to_transformer_lens_leaves_the_mechkit_model_as_it_was(model):
    before = _state(model)
    with torch.no_grad():
        logits = model(_ids(model))
        bridge = mk.to_transformer_lens(model)
        theirs = bridge(_ids(model))
    after = _state(model)
    assert before[:2] == after[:2]  # attention implementation and module types: TL's boot touched a copy
    assert all(torch.equal(a, b) for a, b in zip(before[2], after[2], strict=True))
    torch.testing.assert_close(theirs, logits, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert torch.equal(model(_ids(model)), logits)


def test_a_recording_is_an_activation_cache_with_tl_names(model):
    with torch.no_grad(), mk.record(model, NAMES) as cache:
        model(_ids(model))
    tl = cache.to_transformer_lens()
    assert type(tl).__name__ == "ActivationCache"
    with torch.no_grad():
        _, theirs = tl.model.run_with_cache(_ids(model))
    completed = set(tl.keys()) - set(cache)  # what TL's tools need and the recording lacked, recorded again
    assert set(cache) <= set(tl.keys())
    assert completed <= {"hook_embed", "ln_final.hook_scale"} | {
        f"blocks.{i}.{s}" for i in range(model.anatomy.n_layers) for s in ("hook_resid_pre", "hook_resid_mid",
                                                                            "hook_resid_post", "attn.hook_z",
                                                                            "hook_attn_out", "hook_mlp_out")}
    for name in cache:  # the same activation under the same name
        torch.testing.assert_close(tl[name], theirs[name], atol=1e-5, rtol=1e-5, msg=name)
    n = model.anatomy.n_layers
    # TransformerLens' own tools on the mechkit recording: logit lens and direct logit attribution
    assert tl.accumulated_resid(layer=n, incl_mid=False, apply_ln=True).shape[0] == n + 1
    assert tl.decompose_resid(layer=n, apply_ln=False, return_labels=True)[1][-1] == f"{n - 1}_mlp_out"
    assert tl.stack_head_results(layer=n).shape[0] == n * model.anatomy.n_heads
    assert tl["pattern", 0].shape[1] == model.anatomy.n_heads  # query heads, also under GQA


def test_bridge_names_are_aliases(model):
    pairs = [("blocks.0.hook_in", "blocks.0.hook_resid_pre"), ("blocks.1.hook_out", "blocks.1.hook_resid_post"),
             ("blocks.0.attn.hook_out", "blocks.0.hook_attn_out"), ("blocks.1.mlp.out.hook_in", "blocks.1.mlp.hook_post"),
             ("blocks.*.mlp.hook_out", "blocks.*.hook_mlp_out")]
    for alias, name in pairs:
        with torch.no_grad(), mk.record(model, alias) as a, mk.record(model, name) as b:
            model(_ids(model))
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_load_model_accepts_a_bridge(model):
    bridge = mk.to_transformer_lens(model)
    handle = mk.load_model(bridge)
    assert "TransformerBridge" in handle.spec and type(handle.anatomy.attn(0)).__module__.startswith("transformers")
    ids = _ids(model)
    with torch.no_grad():
        torch.testing.assert_close(handle(ids), model(ids), atol=1e-5, rtol=1e-5)
        with mk.ablate(handle, "0.1,1.2"), mk.ablate(model, "0.1,1.2"):
            torch.testing.assert_close(handle(ids), model(ids), atol=1e-5, rtol=1e-5)
        with mk.record(handle, "blocks.*.attn.hook_pattern") as ours:
            handle(ids)
        _, theirs = bridge.run_with_cache(ids)
        torch.testing.assert_close(ours["blocks.1.attn.hook_pattern"], theirs["blocks.1.attn.hook_pattern"])
    # the bridge still runs on its own model (mechkit worked on an unwrapped copy)
    assert any(type(m).__module__.startswith("transformer_lens") for m in bridge.original_model.modules())


def test_tl_objects_it_cannot_use_are_one_line(monkeypatch):
    from transformer_lens.ActivationCache import ActivationCache

    with pytest.raises(ModelLoadError, match="not a TransformerBridge"):
        mk.load_model(ActivationCache({}, None))

    monkeypatch.setattr("importlib.metadata.version", lambda _name: "3.5.0")
    with pytest.raises(ModelLoadError, match="TransformerLens 3.5.0 is not supported") as err:
        mk.load_model(ActivationCache({}, None))
    assert "\n" not in str(err.value)


def test_detect_records_agreement_with_transformer_lens(tmp_path):
    run = mk.run("detect", model="tiny:llama", device="cpu", out=tmp_path / "run", n_seqs=6, seg_len=8, top_k=3,
                 reference="transformer_lens")
    ref = json.loads((tmp_path / "run" / "report.json").read_text())["results"]["reference"]
    assert ref == run.results["reference"]
    for kind in ("induction", "previous-token", "duplicate-token"):
        agree = ref["agreement"][kind]
        assert agree["top_k"] == 3 and 0.0 <= agree["top_k_overlap"] <= 1.0
        assert agree["spearman"] is None or -1.0 <= agree["spearman"] <= 1.0
        assert len(ref["scores"][kind]) == 2
    assert any(key.startswith("vs TransformerLens") for key in run.results["summary"])
