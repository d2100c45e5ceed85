"""Red-team pass 21 (find-only, issue 32): what it found, each fixed in general.

The unchanged check missed a ``state_dict`` hook left on a module (a later ``prune --save-model`` wrote other
weights than the model held), attributes set on the handle itself (``handle.to_tokens``, ``handle.forward``)
and on its class or the tokenizer's class, and a parameter's own gradient hooks or a ``p.grad`` left filled;
it refused a plugin that paired ``gradient_checkpointing_enable`` with ``_disable`` (transformers leaves its
input-grad hook behind); a forward replaced by one that fails gave the raw error from the probe; and an
integer-list option of 400 digits gave an OverflowError.
"""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import edit_plugin


def _plugin(edit):
    return edit_plugin(edit, "rt21-edit")


def _state_dict_hook(h):
    def post(module, state, prefix, meta):
        for key in list(state):
            if key.endswith("norm.weight"):
                state[key] = state[key] * 0 + 7.0

    h.model.model.register_state_dict_post_hook(post)


def _load_hook(h):
    h.model.model.register_load_state_dict_post_hook(lambda module, keys: None)


def _handle_to_tokens(h):
    original = h.to_tokens
    h.to_tokens = lambda text, *a, **k: original(text[::-1], *a, **k)


def _handle_forward(h):
    original = h.forward
    h.forward = lambda ids, *a, **k: original(ids, *a, **k) if ids.shape[-1] <= 16 else -original(ids, *a, **k)


def _grad_hook(h):
    for p in h.model.parameters():
        p.register_hook(lambda g: g * 0)


def _accumulate_hook(h):
    next(h.model.parameters()).register_post_accumulate_grad_hook(lambda p: None)


def _grad_left(h):
    ids = h.to_tokens("hi there")
    h.model(ids, labels=ids).loss.backward()


@pytest.mark.parametrize("edit,words", [
    (_state_dict_hook, "state_dict or load_state_dict hook"), (_load_hook, "state_dict or load_state_dict hook"),
    (_handle_to_tokens, "handle.to_tokens was set"), (_handle_forward, "handle.forward was set"),
    (_grad_hook, "gradient hook"), (_accumulate_hook, "gradient hook"), (_grad_left, "holding a gradient")])
def test_what_a_plugin_leaves_on_the_model_or_the_handle_is_refused(edit, words):
    with pytest.raises(MechkitError, match=words):
        mk.run(_plugin(edit), model=mk.load_model("tiny:llama"), write=False)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma"])
def test_paired_gradient_checkpointing_is_ordinary_library_use(family):
    def train_with_checkpointing(h):
        model, ids = h.model, h.to_tokens("hi there")
        model.gradient_checkpointing_enable()
        model.train()
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        model.gradient_checkpointing_disable()
        model.eval()

    handle = mk.load_model(f"tiny:{family}")
    run = mk.run(_plugin(train_with_checkpointing), model=handle, write=False)
    assert all(run.report["checks"].values())
    with pytest.raises(MechkitError, match="gradient_checkpointing changed"):  # left on: refused
        mk.run(_plugin(lambda h: h.model.gradient_checkpointing_enable()), model=handle, write=False)


def test_a_gradient_cleared_by_the_plugin_passes():
    def clean(h):
        ids = h.to_tokens("hi there")
        h.model(ids, labels=ids).loss.backward()
        h.model.zero_grad(set_to_none=True)

    assert all(mk.run(_plugin(clean), model=mk.load_model("tiny:llama"), write=False).report["checks"].values())


def test_a_forward_left_failing_is_one_line():
    def broken(h):
        h.model.forward = lambda *a, **k: None

    with pytest.raises(MechkitError, match="left the model changed"):
        mk.run(_plugin(broken), model=mk.load_model("tiny:llama"), write=False)


@pytest.mark.parametrize("plugin,option", [("ablate", "sweep"), ("adapt", "token_layers"), ("compose", "shots"),
                                           ("finetune", "shots"), ("icl-vectors", "layers"), ("icl-vectors", "spans")])
def test_an_integer_list_of_400_digits_is_one_line(plugin, option):
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    with pytest.raises(MechkitError, match="too large"):
        resolve_options(registry.get(plugin), {option: "9" * 400})


@pytest.mark.parametrize("edit", ["type(h).to_tokens = lambda self, t, *a, **k: original(self, t[::-1], *a, **k)",
                                  "type(h.tokenizer).encode = lambda self, *a, **k: original(self, *a, **k)"])
def test_the_handles_and_the_tokenizers_classes_are_read_by_the_code_check(edit):
    """In a fresh process: the edit changes the class for the rest of the process."""
    import os
    import subprocess
    import sys
    import textwrap

    source = "type(h).to_tokens" if "to_tokens" in edit else "type(h.tokenizer).encode"
    script = textwrap.dedent(f"""
        import mechkit as mk
        class Edit(mk.Plugin):
            name, version, summary, options = "rt21-class", "0.0.1", "edits a class", ()
            def run(self, ctx):
                h = ctx.model
                original = {source}
                {edit}
                return mk.Result(results={{"ok": 1}}, finding="ok")
        try:
            mk.run(Edit, model=mk.load_model("tiny:llama"), write=False)
            print("PASSED")
        except mk.MechkitError as err:
            print("REFUSED", err)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "REFUSED" in out.stdout and "code the model runs changed" in out.stdout, out.stdout + out.stderr[-2000:]


# --- pass 21, helper A: the hook API, completion, normalized_recovery, finetune's token ids ---


@pytest.fixture(scope="module")
def h():
    return mk.load_model("tiny:llama")


def test_a_module_as_a_hook_is_checked_through_its_forward(h):
    import torch

    class Reads(torch.nn.Module):
        def forward(self, x):
            return x

    class Takes(torch.nn.Module):
        def forward(self, x, hook):
            return x

    ids = h.to_tokens("hello world")
    with pytest.raises(MechkitError, match="module Reads") as err, mk.hooks(h, {"blocks.0.hook_resid_post": Reads()}):
        h(ids)
    assert "your_module(act)" in err.value.fix
    with mk.hooks(h, {"blocks.0.hook_resid_post": Takes()}):  # one that takes (act, hook) runs
        h(ids)


@pytest.mark.parametrize("ufunc,torch_name", [("tanh", "torch.tanh(act)"), ("exp", "torch.exp(act)")])
def test_a_numpy_ufunc_as_a_hook_is_one_line_with_torchs_function_as_the_fix(h, ufunc, torch_name):
    import numpy as np

    with pytest.raises(MechkitError, match="arguments cannot be read") as err, \
            mk.hooks(h, {"blocks.0.hook_resid_post": getattr(np, ufunc)}):
        h(h.to_tokens("hello"))
    assert torch_name in err.value.fix


def test_the_fix_for_a_c_function_says_its_other_arguments_go_in(h):
    import torch

    with pytest.raises(MechkitError) as err, mk.pattern_hooks(h, {0: torch.softmax}):
        pass
    assert "torch.softmax(pattern)" in err.value.fix and "dim" in err.value.fix

    def fixed(pattern):  # the fix, with the argument it names
        return torch.softmax(pattern, dim=-1)

    with mk.pattern_hooks(h, {0: fixed}):
        h(h.to_tokens("hello"))


@pytest.mark.parametrize("pattern", ["blocks.5.hook_resid_post", "blocks.0.hook_resid_psot", ["blocks.*.hook_nope"]])
def test_a_completion_of_a_pattern_matching_nothing_is_refused(h, pattern):
    with mk.record(h, "blocks.0.hook_resid_post") as cache:
        h(h.to_tokens("hello world"))
    with pytest.raises(MechkitError, match="no hook point matches"):
        cache.completion(pattern)
    assert cache.to_transformer_lens() is not None  # TransformerLens' needs still complete


@pytest.mark.parametrize("call,expected", [
    (lambda nr, torch, np: nr(torch.tensor([2**62, -(2**62)]), clean=2**62, corrupted=-(2**62)), [1.0, 0.0]),
    (lambda nr, torch, np: nr(torch.tensor([2**63 - 1]), clean=2**63 - 1, corrupted=-(2**63)), [1.0]),
    (lambda nr, torch, np: nr(np.int64(2**62 + 1), clean=np.int64(2**62 + 2), corrupted=np.int64(2**62)), [0.5])])
def test_whole_number_recoveries_do_not_wrap_or_round(call, expected):
    import numpy as np
    import torch

    from mechkit.patching import normalized_recovery

    got = torch.as_tensor(call(normalized_recovery, torch, np)).reshape(-1).tolist()
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("patched,clean,corrupted", [(10**308, 0, -(10**308)), (1.0, 10**308, -(10**308))])
def test_whole_numbers_past_a_float_are_one_line(patched, clean, corrupted):
    from mechkit.patching import normalized_recovery

    with pytest.raises(MechkitError, match="float"):
        normalized_recovery(patched, clean, corrupted)


def test_finetune_refuses_a_tokenizer_id_past_the_embedding_before_training(tmp_path):
    import json

    from mechkit.model.sources.tiny import tiny_model
    from mechkit.taskarith.finetune import Recipe, finetune

    model, tokenizer = tiny_model("llama")[:2]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    path = tmp_path / "tokenizer.json"
    data = json.loads(path.read_text())
    data["added_tokens"].append({"id": 5, "content": "zz", "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True})
    path.write_text(json.dumps(data))
    handle = mk.load_model(str(tmp_path))
    rows = [(handle.tokenizer("jazz zz")["input_ids"], 1)]
    with pytest.raises(MechkitError, match="embeds only"):
        finetune(handle, Recipe(task="capitalize", steps=1), rows=rows)
