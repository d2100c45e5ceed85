"""Physical pruning computes exactly what the masked dense model computes, per family, and reloads."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.edit.surgery import slice_heads
from mechkit.model.sources.tiny import tiny_families
from mechkit.pruning.masking import masked
from mechkit.pruning.plan import UnitsToRemove
from mechkit.pruning.slicing import prune_copy, save_pruned
from mechkit.pruning.stats import collect_stats

TEXTS = ["input: cat\noutput: Cat\n", "input: walk\noutput: walked\ninput: go\noutput:", "hello world"]


def _heads_plan(a) -> dict[int, list[int]]:
    """Layer 0: one query head from every KV group; layer 1: a whole KV group (or any heads for MHA)."""
    g = a.n_groups
    per_group = [k * g + g - 1 for k in range(a.n_kv_heads)] if g > 1 else [0, 2]
    whole_group = list(range(g)) if g > 1 else [1]
    return {0: per_group, 1: whole_group}


def _plans(a) -> list[UnitsToRemove]:
    mlp = {0: list(range(0, a.d_mlp, 3)), 1: list(range(5, a.d_mlp, 4))}
    return [UnitsToRemove(mlp=mlp, heads=_heads_plan(a)),
            UnitsToRemove(mlp=mlp, heads=_heads_plan(a), compensate=True),
            UnitsToRemove(mlp={1: [1, 2]}, layers=[0])]


def _double(family: str):
    m = mk.load_model(f"tiny:{family}", device="cpu")
    m.model.double()
    return m


@pytest.mark.parametrize("family", tiny_families())
def test_sliced_equals_masked(family):
    m = _double(family)
    ids = m.to_tokens(TEXTS)
    mask = (ids != m.tokenizer.pad_token_id).long()
    stats = collect_stats(m, TEXTS)
    with torch.no_grad():
        dense = m(ids, attention_mask=mask)
    for plan in _plans(m.anatomy):
        with masked(m, plan, stats), torch.no_grad():
            want = m(ids, attention_mask=mask)
        pruned = prune_copy(m, plan, stats)
        with torch.no_grad():
            got = pruned(ids, attention_mask=mask)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        assert not torch.allclose(got, dense)  # the plan really changed the function
        n_dense = sum(p.numel() for p in m.model.parameters())
        assert sum(p.numel() for p in pruned.model.parameters()) < n_dense
    with torch.no_grad():  # the dense model is untouched
        assert torch.equal(m(ids, attention_mask=mask), dense)


@pytest.mark.parametrize("family", tiny_families())
def test_saved_pruned_model_reloads_with_the_same_logits(family, tmp_path):
    m = mk.load_model(f"tiny:{family}", device="cpu")  # float32 end to end: the saved dtype
    plan = UnitsToRemove(mlp={0: [1, 4, 9]}, heads=_heads_plan(m.anatomy), layers=[1], compensate=True)
    pruned = prune_copy(m, plan, collect_stats(m, TEXTS))
    out = save_pruned(pruned, tmp_path / "pruned")
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".pruned.tmp-*"))
    again = mk.load_model(str(out), device="cpu")
    ids = m.to_tokens(TEXTS)
    with torch.no_grad():
        assert torch.equal(again(ids), pruned(ids))
    assert len(again.anatomy.layers) == m.anatomy.n_layers - 1


def test_save_pruned_refuses_a_non_empty_directory_unless_forced(tiny_llama, tmp_path):
    pruned = prune_copy(tiny_llama, UnitsToRemove(mlp={0: [1, 2]}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(MechkitError, match="not an empty directory") as err:
        save_pruned(pruned, out)
    assert "\n" not in str(err.value) and "force" in str(err.value)
    assert (out / "keep.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(MechkitError):
        save_pruned(pruned, tmp_path / "file")
    save_pruned(pruned, out, force=True)
    assert (out / "keep.txt").read_text() == "mine" and (out / "model.safetensors").is_file()  # --force: ours only
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (save_pruned(pruned, empty) / "model.safetensors").is_file()  # an empty directory is fine


def test_saved_pruned_directory_follows_the_umask(tiny_llama, tmp_path):
    import os
    import stat

    pruned = prune_copy(tiny_llama, UnitsToRemove(mlp={0: [1, 2]}))
    old = os.umask(0o022)
    try:
        out = save_pruned(pruned, tmp_path / "pruned")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # not mkdtemp's private 0700


def test_pruned_model_generates_with_a_kv_cache(tiny_llama):
    plan = UnitsToRemove(mlp={0: list(range(40))}, heads={1: [0, 1]}, layers=[0])
    pruned = prune_copy(tiny_llama, plan)
    ids = pruned.to_tokens("input: ab\noutput:")
    with torch.no_grad():
        out = pruned.model.generate(ids, max_new_tokens=5, do_sample=False)
        # greedy decoding with the cache equals argmax of full forwards
        seq = ids
        for _ in range(5):
            seq = torch.cat([seq, pruned(seq)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq)


def test_uneven_gqa_head_selection_is_refused(tiny_llama):
    import copy

    model = copy.deepcopy(tiny_llama.model)
    from mechkit.model.anatomy import discover_anatomy

    with pytest.raises(MechkitError, match="same number of query heads"):
        slice_heads(discover_anatomy(model), 0, [0, 1, 2])  # groups {0,1} and {2,3}: 2 vs 1


def test_hooks_read_a_pruned_layers_remaining_heads(tiny_llama):
    pruned = prune_copy(tiny_llama, UnitsToRemove(heads={0: [1, 3]}))
    with mk.record(pruned, "blocks.*.attn.hook_z") as cache, torch.no_grad():
        pruned(pruned.to_tokens("input: ab\noutput:"))
    assert cache["blocks.0.attn.hook_z"].shape[-2] == 2 and cache["blocks.1.attn.hook_z"].shape[-2] == 4
