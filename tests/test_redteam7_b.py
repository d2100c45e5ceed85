"""Red-team pass 7 (issue 32), classes 2, 4, 5, 7, 8, 9 and 11: what still failed, fixed as a class.

Each test names the case that failed before its fix. Tiny models only.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import types

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from mechkit.model.sources.tiny import tiny_model
from mechkit.plugin import Plugin, Result

# ---- class 8: token ids in every public entry, scores in every form --------------------------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int8])
def test_small_integer_ids_compute_like_long_ids(llama, dtype):
    """uint8 ids raised the embedding's RuntimeError."""
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(llama(ids.to(dtype)), llama(ids))


@pytest.mark.parametrize(("ids", "said"), [(5, "not int"), (torch.tensor([-1]), "token id -1"),
                                           (torch.tensor([10**9]), "token id 1000000000")])
def test_to_str_tokens_checks_ids_like_the_model(llama, ids, said):
    """to_str_tokens(5) raised TypeError, a negative id OverflowError, and an id past the vocabulary gave ['']."""
    with pytest.raises(MechkitError, match=said):
        llama.to_str_tokens(ids)
    assert llama.to_str_tokens(llama.to_tokens("hi")) == llama.to_str_tokens("hi") == ["h", "i"]


def test_head_scores_may_be_a_detect_run_and_must_be_finite(llama):
    """The fix the 'needs scores' message names (scores=mk.run("detect", ...)) raised TypeError; NaN scores
    selected no heads, so an ablation ablated nothing."""
    run = mk.run("detect", model=llama, write=False, n_seqs=2, seg_len=4)
    assert mk.parse_heads("induction", 2, 4, scores=run, top_k=2) == \
        mk.parse_heads("induction", 2, 4, scores=run.results["scores"], top_k=2)
    with pytest.raises(MechkitError, match="not int"):
        mk.parse_heads("induction", 2, 4, scores=5, top_k=2)
    nan = {"induction": [[float("nan")] * 4] * 2}
    with pytest.raises(MechkitError, match="NaN or inf"), mk.ablate(llama, "induction", scores=nan, top_k=2):
        pass


def test_adaptive_refuses_a_non_bool_switch_and_a_scheduler_that_names_no_model(llama, tmp_path, monkeypatch):
    from mechkit.adapt.scheduler import Scheduler

    with pytest.raises(MechkitError, match="input_adaptive must be True or False"), \
            mk.adaptive(llama, 0.9, scheduler=tmp_path / "none.json", input_adaptive="no"):
        pass
    (tmp_path / "scheduler.json").write_text(json.dumps({"schema": "mechkit.adapt.scheduler/v1"}))
    monkeypatch.setattr(Scheduler, "from_dict", classmethod(lambda cls, d: types.SimpleNamespace(model=d.get("model"))))
    with pytest.raises(MechkitError, match="records no model"):  # its plans would run on any model unchecked
        Scheduler.load(tmp_path)


# ---- class 7: the unchanged check compares references, not names --------------------------------------

def _leaving(name: str, leave) -> type[Plugin]:
    def run(self, ctx):
        leave(ctx.model)
        return Result(results={"x": 1})

    return type(name, (Plugin,), {"name": name, "version": "0.0.1", "summary": "leaves something", "run": run})


def _swap_class(handle):
    mlp = handle.model.model.layers[1].mlp

    class LongOnly(type(mlp)):  # acts only past the probe's 16 tokens
        def forward(self, x):
            y = super().forward(x)
            return y * 0 if x.shape[1] > 16 else y

    mlp.__class__ = LongOnly


def _swap_module(handle):
    act = handle.model.model.layers[0].mlp.act_fn
    handle.model.model.layers[0].mlp.act_fn = type(act)().eval()


def _swap_hook_fn(handle):
    hooks = handle.model.model.layers[0]._forward_hooks
    for key in list(hooks):
        hooks[key] = lambda module, args, output: None


def _flip_padding(handle):
    tok = handle.tokenizer
    tok.padding_side = "left" if tok.padding_side == "right" else "right"


def _untie(handle):
    head = handle.model.lm_head
    head.weight = torch.nn.Parameter(head.weight.detach().clone())


@pytest.mark.parametrize(("leave", "said"), [
    (_swap_class, "model.layers.1.mlp was replaced"),
    (_swap_module, "model.layers.0.mlp.act_fn was replaced"),
    (_swap_hook_fn, "a hook was left on model.layers.0"),
    (_flip_padding, "its tokenizer was changed"),
    (lambda h: h.tokenizer.add_tokens(["zzqq"]), "its tokenizer was changed"),
    (lambda h: [p.requires_grad_(False) for p in h.model.parameters()], "requires_grad changed"),
    (_untie, "the parameter lm_head.weight was replaced"),
    (lambda h: setattr(h.model.config, "_attn_implementation", "eager"), "_attn_implementation"),
])
def test_a_run_that_swaps_what_names_cannot_show_is_refused(leave, said):
    handle = mk.load_model("tiny:llama")
    user_hook = handle.model.model.layers[0].register_forward_hook(lambda module, args, output: None)
    try:
        with pytest.raises(PluginError, match=said):
            mk.run(_leaving("leaves_refs", leave), model=handle, write=False)
    finally:
        user_hook.remove()


def test_a_padded_batch_is_not_a_tokenizer_change():
    """A fast tokenizer records its last call's padding in its JSON: the check must not call that a change."""
    handle = mk.load_model("tiny:llama")
    mk.run(_leaving("pads_a_batch", lambda h: h.to_tokens(["a", "bcd"])), model=handle, write=False)


def test_a_users_hook_or_train_mode_is_not_a_change():
    handle = mk.load_model("tiny:llama")
    handle.model.train()
    user_hook = handle.model.model.layers[0].register_forward_hook(lambda module, args, output: None)
    try:
        assert mk.run("inspect", model=handle, write=False, seq_len=8).report["checks"]["modules_unchanged"]
    finally:
        user_hook.remove()


# ---- class 4: resume keys cover hooks in place, weights edited in place, the plugin's package ---------

def _stepper(calls: list):
    def run(self, ctx):
        value = ctx.step("a", lambda: (calls.append(1), float(ctx.model(torch.tensor([[1, 2, 3]]))[0, -1].sum()))[1])
        if os.environ.get("MECHKIT_TEST_KILL"):
            raise KeyboardInterrupt
        return Result(results={"a": value})

    return type("stepper7b", (Plugin,), {"name": "stepper7b", "version": "0.0.1", "summary": "s", "run": run})


def test_a_run_killed_under_hooks_is_not_resumed_without_them(tmp_path, monkeypatch):
    """Killed inside mk.ablate, the rerun without it resumed the ablated step: a silently wrong result."""
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    handle, calls = mk.load_model("tiny:llama"), []
    plugin = _stepper(calls)
    monkeypatch.setenv("MECHKIT_TEST_KILL", "1")
    with pytest.raises(KeyboardInterrupt), mk.ablate(handle, heads="layer:0,layer:1"):
        mk.run(plugin, model=handle, write=False)
    monkeypatch.delenv("MECHKIT_TEST_KILL")
    clean = float(handle(torch.tensor([[1, 2, 3]]))[0, -1].sum())
    assert mk.run(plugin, model=handle, write=False).results["a"] == clean
    assert len(calls) == 2


def test_weights_edited_in_place_get_their_own_hash(llama):
    """The handle remembered its first hash: a run inside mk.edit_weights (or after a torch edit) recorded,
    and keyed its steps on, the unedited weights."""
    first = llama.weights_sha256()
    with mk.edit_weights(llama) as edits:
        edits.named("model.norm.weight").mul_(3)
        inside = mk.run("inspect", model=llama, write=False, seq_len=8).report["model"]["weights_sha256"]
    assert inside != first
    assert llama.weights_sha256() == first
    with torch.no_grad():
        llama.model.model.norm.weight.mul_(2)
    try:
        assert mk.run("inspect", model=llama, write=False, seq_len=8).report["model"]["weights_sha256"] != first
    finally:
        with torch.no_grad():
            llama.model.model.norm.weight.div_(2)
    llama.forget_sha256()
    assert llama.weights_sha256() == first


def test_the_resume_key_covers_a_plugins_helper_module(tmp_path, monkeypatch):
    """A third-party plugin's helper module edited between a kill and the rerun resumed the old code's step."""
    from mechkit.plugin_key import package_code, plugin_code

    pkg = tmp_path / "helperplug7b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 1\n")
    (pkg / "plugin.py").write_text(textwrap.dedent("""
        from mechkit.plugin import Plugin
        class P(Plugin):
            name = "helperplug7b"
            version = "0.0.1"
            summary = "s"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from helperplug7b.plugin import P

    before = plugin_code(P)
    (pkg / "helper.py").write_text("VALUE = 2\n")
    package_code.cache_clear()  # a new process reads the files again
    try:
        assert plugin_code(P) != before
    finally:
        for name in [n for n in sys.modules if n.startswith("helperplug7b")]:
            del sys.modules[name]


# ---- class 2 and 11: sharded directories --------------------------------------------------------------

def test_a_missing_shard_is_named_not_blamed_on_the_layer_count(sharded):
    """The fix was 'set num_hidden_layers to 1': computing on half the model."""
    d, _, _ = sharded
    assert mk.load_model(str(d)).n_layers == 2
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(MechkitError, match="lacks 1 of the 2 shard files") as err:
        mk.load_model(str(d))
    assert "num_hidden_layers" not in str(err.value)


def test_a_single_file_beside_shards_is_two_weight_sets(sharded):
    from safetensors.torch import save_file

    d, tensors, _ = sharded
    save_file({k: v * 2 for k, v in tensors.items()}, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MechkitError, match="two sets of weights"):
        mk.load_model(str(d))


# ---- class 11: fixes that lead somewhere --------------------------------------------------------------

def test_shuffle_on_too_few_heads_says_so_instead_of_two_contradicting_top_ks(tmp_path):
    from mechkit.model.edit.surgery import Structure, apply_structure

    model, tok = tiny_model("llama")
    structure = Structure(2, head_keep={0: [0], 1: [1, 2]})
    apply_structure(model, structure)
    model._mechkit_structure = structure
    handle = mk.load_model(model, tokenizer=tok)
    for top_k in (None, 2):
        with pytest.raises(MechkitError, match="needs at least 4 heads"):
            mk.run("shuffle", model=handle, write=False, n=1, shots=1, **({"top_k": top_k} if top_k else {}))


def test_a_plain_sparsity_is_not_named_for_neurons():
    from mechkit.pruning.select import parse_sparsity

    with pytest.raises(MechkitError) as err:
        parse_sparsity("1.5", ["heads"])
    assert "neurons" not in str(err.value)


def test_the_conformal_refusal_names_the_python_settings(llama):
    from mechkit.adapt import calibrate

    with pytest.raises(MechkitError, match="margin_prompts="):
        calibrate(llama, ["capitalize"], margin_prompts=2)  # the default (None) grows the prompts instead

