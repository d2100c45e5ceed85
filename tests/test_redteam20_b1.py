"""Red-team pass 20 (b1): what the "model unchanged" check missed or misjudged.

A ``TorchFunctionMode`` entered and never exited (or another of torch's process-wide numeric settings left
changed) rewrote every later forward where the 16-token probe cannot see; a submodule's ``config`` replaced
by an edited copy, ``_loss_function`` or ``loss_type`` set, or a plain attribute a forward reads
(``self_attn.scaling``) changed passed, since only ``model.config`` was read. transformers' own
output-capturing hooks (``output_hidden_states=True``) were refused as the plugin's. A model that computes
NaN from finite weights ran the plugin to the end, to be refused as "the plugin left the model changed".
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError


def _plugin(edit, called=None):
    class X(mk.Plugin):
        name, version, summary, options = "rt-edit", "0.0.1", "x", ()

        def run(self, ctx):
            if called is not None:
                called.append(True)
            edit(ctx.model)
            return mk.Result(results={"ok": 1}, finding="ok")
    return X


# --- torch's global state: modes and numeric settings left changed ---

class _LongSdpa(torch.overrides.TorchFunctionMode):
    """Scales SDPA's output past 16 tokens: what the probe cannot see."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.nn.functional.scaled_dot_product_attention and out.shape[-2] > 16:
            out = out * 2
        return out


class _Dispatch(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _enter(mode):
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


def _setting(get, put, value):
    old = get()
    put(value)
    return lambda: put(old)


GLOBAL = {
    "function_mode": (lambda: _enter(_LongSdpa()), "torch function mode"),
    "dispatch_mode": (lambda: _enter(_Dispatch()), "torch dispatch mode"),
    "default_dtype": (lambda: _setting(torch.get_default_dtype, torch.set_default_dtype, torch.float64),
                      "torch.get_default_dtype()"),
    "flush_denormal": (lambda: _setting(lambda: False, torch.set_flush_denormal, True), "torch.set_flush_denormal"),
    "matmul_precision": (lambda: _setting(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision,
                                          "medium"), "torch.get_float32_matmul_precision()"),
    "mha_fastpath": (lambda: _setting(torch.backends.mha.get_fastpath_enabled, torch.backends.mha.set_fastpath_enabled,
                                      False), "torch.backends.mha.get_fastpath_enabled()"),
    "math_sdp": (lambda: _setting(torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.enable_math_sdp, False),
                 "torch.backends.cuda.math_sdp_enabled()"),
    "autocast": (lambda: _enter(torch.autocast("cpu", dtype=torch.bfloat16)), "autocast on cpu"),
    "default_device": (lambda: _setting(lambda: None, torch.set_default_device, "cpu"), "torch function mode"),
}


@pytest.mark.parametrize("what", sorted(GLOBAL))
def test_torch_global_state_left_changed_is_refused(what):
    edit, said = GLOBAL[what]
    undo = []
    try:
        with pytest.raises(MechkitError, match="left torch's global settings changed") as err:
            mk.run(_plugin(lambda h: undo.append(edit())), model=mk.load_model("tiny:llama"), write=False)
        assert said in str(err.value), str(err.value)
    finally:
        for u in undo:
            u()


def test_the_function_mode_changed_long_logits():
    """Why F1 matters: the probe's 16 tokens agree, 40 tokens do not."""
    h = mk.load_model("tiny:llama")
    ids = torch.randint(0, 100, (1, 40))
    with torch.no_grad():
        ref = h(ids)
        with _LongSdpa():
            assert not torch.equal(h(ids), ref)
            assert torch.equal(h(ids[:, :16]), h.model(ids[:, :16]).logits)


def test_torch_settings_changed_and_restored_pass():
    def edit(h):
        for make, _ in GLOBAL.values():
            make()()
        with _LongSdpa():
            h(torch.ones((1, 20), dtype=torch.long))

    run = mk.run(_plugin(edit), model=mk.load_model("tiny:llama"), write=False)
    assert all(run.report["checks"].values())


# --- a module's own instance attributes: configs of submodules, the loss, plain values ---

def _sub_config(path, field, value):
    def edit(h):
        inner = h.model.get_submodule(path)
        config = copy.deepcopy(inner.config)
        setattr(config, field, value)
        inner.config = config
    return edit


def _in_place_sub_config(h):
    layer = h.model.model.layers[0].self_attn
    layer.config = copy.deepcopy(layer.config)  # replaced now, then its content changed below: still a change
    layer.config.rope_theta = 1.0


def _loss_function(h):
    from transformers.loss.loss_utils import ForCausalLMLoss

    h.model.loss_function = lambda *a, **k: 2 * ForCausalLMLoss(*a, **k)


ATTRS = {
    "mistral_sub_config": ("mistral", _sub_config("model", "sliding_window", 20), "model.config was replaced"),
    "qwen2_layer_config": ("qwen2", _sub_config("model.layers.0.self_attn", "sliding_window", 4),
                           "model.layers.0.self_attn.config was replaced"),
    "llama_attn_config": ("llama", _in_place_sub_config, "model.layers.0.self_attn.config"),
    "loss_function": ("llama", _loss_function, "_loss_function"),
    "loss_type": ("llama", lambda h: setattr(h.model, "loss_type", "ForMaskedLM"), "loss_type"),
    "gpt2_loss_type": ("gpt2", lambda h: setattr(h.model, "loss_type", "ForMaskedLM"), "loss_type"),
    "scaling": ("llama", lambda h: setattr(h.model.model.layers[1].self_attn, "scaling", 0.5),
                "model.layers.1.self_attn.scaling changed"),
    "is_causal": ("gemma", lambda h: setattr(h.model.model.layers[0].self_attn, "is_causal", False),
                  "model.layers.0.self_attn.is_causal changed (True -> False)"),
    "attr_set": ("gpt2", lambda h: setattr(h.model.transformer.h[0].attn, "extra_scale", 2.0),
                 "transformer.h.0.attn.extra_scale was set"),
}


@pytest.mark.parametrize("what", sorted(ATTRS))
def test_a_module_attribute_left_changed_is_refused(what):
    family, edit, said = ATTRS[what]
    with pytest.raises(MechkitError, match="left the model changed") as err:
        mk.run(_plugin(edit), model=mk.load_model(f"tiny:{family}"), write=False)
    assert said in str(err.value), str(err.value)


def test_module_attributes_changed_and_restored_pass():
    def edit(h):
        attn = h.model.model.layers[0].self_attn
        config, scaling, loss = attn.config, attn.scaling, h.model.loss_type
        attn.config, attn.scaling, h.model.loss_type = copy.deepcopy(config), 2.0, "ForMaskedLM"
        attn.config, attn.scaling, h.model.loss_type = config, scaling, loss

    run = mk.run(_plugin(edit), model=mk.load_model("tiny:llama"), write=False)
    assert all(run.report["checks"].values())


# --- transformers' own output-capturing hooks are no change; a look-alike is ---

@pytest.mark.parametrize(("family", "flag"), [("gpt2", "output_hidden_states"), ("llama", "output_hidden_states"),
                                              ("qwen2", "output_hidden_states")])
def test_output_capturing_hooks_are_no_change(family, flag):
    from mechkit.model.checks.state import hooked, model_state

    h = mk.load_model(f"tiny:{family}")
    run = mk.run(_plugin(lambda m: m.forward(m.to_tokens("hi there"), **{flag: True})), model=h, write=False)
    assert all(run.report["checks"].values())
    assert any(getattr(m, "_forward_hooks", None) for m in h.model.modules())  # they are there, and kept
    assert hooked(model_state(h.model)) is None
    assert mk.run(_plugin(lambda m: None), model=h, write=False).report["checks"]["modules_unchanged"]


def _look_alike(h):
    """A hook that only looks like transformers': its name, or its globals, but not its code."""
    import transformers.utils.output_capturing as oc

    def output_capturing_hook(module, args, output):
        return output * 2 if output.shape[1] > 20 else None

    output_capturing_hook.__module__ = oc.__name__
    output_capturing_hook.__qualname__ = "install_output_capuring_hook.<locals>.output_capturing_hook"
    h.model.model.layers[0].register_forward_hook(output_capturing_hook)


def _same_globals(h):
    import types

    import transformers.utils.output_capturing as oc

    def hook(module, args, output):
        return None

    h.model.model.layers[0].register_forward_hook(types.FunctionType(hook.__code__, vars(oc), "output_capturing_hook"))


@pytest.mark.parametrize("edit", [_look_alike, _same_globals])
def test_a_hook_only_looking_like_transformers_is_refused(edit):
    with pytest.raises(MechkitError, match="a hook was left on model.layers.0"):
        mk.run(_plugin(edit), model=mk.load_model("tiny:llama"), write=False)


# --- a model computing NaN from finite weights: refused before the plugin runs ---

def _saved(tmp_path, change_config=None, scale=None):
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model("llama")[:2]
    if scale is not None:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.up_proj.weight.mul_(scale)
                layer.mlp.gate_proj.weight.mul_(scale)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    if change_config is not None:
        config = json.loads((tmp_path / "config.json").read_text())
        config.update(change_config)
        (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(("case", "dtype", "said"), [
    ({"rms_norm_eps": -1.0}, None, "rms_norm_eps"),
    ({"rms_norm_eps": -0.5}, None, "rms_norm_eps"),
    (3000.0, "float16", "--dtype float32"),
])
def test_a_model_computing_nan_is_refused_before_the_plugin_runs(tmp_path, case, dtype, said):
    path = _saved(tmp_path, change_config=case if isinstance(case, dict) else None,
                  scale=case if isinstance(case, float) else None)
    called = []
    with pytest.raises(MechkitError, match="computes (NaN|inf) logits on 16 probe tokens") as err:
        mk.run(_plugin(lambda h: None, called), model=str(path), dtype=dtype, write=False)
    assert said in str(err.value) and not called, str(err.value)
    assert "left the model changed" not in str(err.value)


def test_a_vocabulary_masked_to_minus_inf_still_runs():
    """-inf logits (a vocabulary mask) are no NaN: the model runs, and is unchanged after."""
    h = mk.load_model("tiny:llama")

    def mask(module, args, output):
        output[..., 0] = float("-inf")
        return output

    handle = h.model.lm_head.register_forward_hook(mask)
    try:
        assert mk.run(_plugin(lambda m: None), model=h, write=False).report["checks"]["logits_unchanged"]
    finally:
        handle.remove()
