"""Red-team pass 19 (b1): edits of the code a model runs that the unchanged check passed, and a NaN buffer.

A function's code, defaults or attributes replaced while the function object stays (``f.__code__ = g.__code__``);
a decorator's closure cell swapped (the function it wraps); a method of a class the forward runs but no module
of the model names (``DynamicLayer.update``); a wrapper that only claimed to be nnsight's (``__wrapped__`` and a
file name under nnsight's folder). Each passed as "model unchanged" while later forwards computed differently.
And a model object with NaN in a buffer loaded, to fail every run as "the plugin left the model changed".
"""

from __future__ import annotations

import importlib

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError

ml = importlib.import_module("transformers.models.llama.modeling_llama")


def _long_only(call):
    """``call`` doubled on inputs longer than the probe's 16 tokens: what the logits probe cannot see."""
    def wrapped(*args, **kwargs):
        out = call(*args, **kwargs)
        return out * 2 if isinstance(out, torch.Tensor) and out.dim() > 1 and out.shape[1] > 20 else out
    return wrapped


def _set(obj, attr, value):
    """Set ``obj.attr`` and return the undo."""
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    return lambda: setattr(obj, attr, old)


def _mlp_code():
    def forward(self, x):
        out = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return out * 2 if x.shape[1] > 20 else out
    return _set(ml.LlamaMLP.forward, "__code__", forward.__code__)


def _rotate_half_code():
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1) * (2 if x.shape[-2] > 20 else 1)
    return _set(ml.rotate_half, "__code__", rotate_half.__code__)


def _defaults():
    return _set(ml.apply_rotary_pos_emb, "__defaults__", (1,))  # an equal value, but another object


def _kwdefaults():
    fn = torch.nn.functional.grouped_mm  # keyword-only defaults, changed in place
    old = dict(fn.__kwdefaults__)
    fn.__kwdefaults__["out_dtype"] = torch.float64

    def undo():
        fn.__kwdefaults__.clear()
        fn.__kwdefaults__.update(old)
    return undo


def _function_dict():
    fn = torch.nn.functional._check_unpool_output_size  # an attribute torch.jit reads of the function
    return _set(fn, "_torchscript_modifier", object())


def _cell(fn, var):
    cell = fn.__closure__[fn.__code__.co_freevars.index(var)]
    old = cell.cell_contents
    cell.cell_contents = _long_only(old)

    def undo():
        cell.cell_contents = old
    return undo


def _attention_cell():
    return _cell(ml.LlamaAttention.forward, "func")


def _rope_cell():
    return _cell(ml.LlamaRotaryEmbedding.forward, "rope_forward")


def _dynamic_layer():
    from transformers.cache_utils import DynamicLayer

    return _set(DynamicLayer, "update", _long_only(DynamicLayer.update))


def _dynamic_cache():
    from transformers.cache_utils import DynamicCache

    return _set(DynamicCache, "get_seq_length", _long_only(DynamicCache.get_seq_length))


def _import_utils():
    from transformers.utils import import_utils

    return _set(import_utils, "is_torchdynamo_compiling", lambda: False)


def _output_capturing():
    from transformers.utils import output_capturing

    name = next(n for n in ("selected_hidden_states", "capture_outputs") if hasattr(output_capturing, n))
    return _set(output_capturing, name, _long_only(getattr(output_capturing, name)))


EDITS = {
    "code": (_mlp_code, "LlamaMLP.forward.__code__"),
    "code_of_a_function": (_rotate_half_code, "rotate_half.__code__"),
    "defaults": (_defaults, "apply_rotary_pos_emb.__defaults__"),
    "kwdefaults": (_kwdefaults, "grouped_mm.__kwdefaults__"),
    "function_dict": (_function_dict, "_check_unpool_output_size.__dict__['_torchscript_modifier']"),
    "closure_attention": (_attention_cell, "__closure__['func']"),
    "closure_rope": (_rope_cell, "__closure__['rope_forward']"),
    "dynamic_layer": (_dynamic_layer, "DynamicLayer.update"),
    "dynamic_cache": (_dynamic_cache, "DynamicCache.get_seq_length"),
    "import_utils": (_import_utils, "is_torchdynamo_compiling"),
    "output_capturing": (_output_capturing, "transformers.utils.output_capturing."),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_an_edit_inside_the_code_the_model_runs_is_caught(what):
    edit, said = EDITS[what]
    undo = []

    class P(mk.Plugin):
        name, version, summary, options = "p7", "0", "x", ()

        def run(self, ctx):
            undo.append(edit())
            return mk.Result(results={"ok": 1})

    model = mk.load_model("tiny:llama")
    try:
        with pytest.raises(MechkitError, match="left the code the model runs changed") as err:
            mk.run(P, model=model, write=False)
        assert said in str(err.value), str(err.value)
    finally:
        for u in undo:
            u()


def test_the_edits_undone_pass():
    """Each edit, put back before the run ends, is no change: the check compares, it does not forbid."""
    class P(mk.Plugin):
        name, version, summary, options = "p7", "0", "x", ()

        def run(self, ctx):
            for edit, _ in EDITS.values():
                edit()()
            return mk.Result(results={"ok": 1})

    run = mk.run(P, model=mk.load_model("tiny:llama"), write=False)
    assert all(run.report["checks"].values())


def _fake_wrapper(old):
    """A wrapper that says it is nnsight's: ``__wrapped__`` the old function, code compiled under nnsight's
    folder. It is not nnsight's object."""
    import functools
    from pathlib import Path

    import nnsight

    where = str(Path(nnsight.__file__).parent / "intervention" / "backward.py")
    space = {"old": old}
    exec(compile("def wrapper(*a, **k):\n    return old(*a, **k)\n", where, "exec"), space)  # noqa: S102
    return functools.wraps(old)(space["wrapper"])


@pytest.mark.parametrize(("owner", "attr"), [("torch.nn.functional", "silu"), ("torch.nn.functional", "softmax"),
                                             ("torch.Tensor", "backward")])
def test_a_wrapper_only_claiming_to_be_nnsights_is_caught(owner, attr):
    pytest.importorskip("nnsight")
    target = torch.Tensor if owner == "torch.Tensor" else torch.nn.functional
    had = attr in vars(target)
    original = vars(target).get(attr)

    class P(mk.Plugin):
        name, version, summary, options = "p7", "0", "x", ()

        def run(self, ctx):
            setattr(target, attr, _fake_wrapper(getattr(target, attr)))
            return mk.Result(results={"ok": 1})

    try:
        with pytest.raises(MechkitError, match=f"{owner}.{attr} was replaced"):
            mk.run(P, model=mk.load_model("tiny:llama"), write=False)
    finally:
        if had:
            setattr(target, attr, original)
        else:
            delattr(target, attr)


# --- a NaN in a buffer refused at load, naming the buffer ---

def _nan_buffer(family):
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model(family)[:2]
    name, buf = next((n, b) for n, b in model.named_buffers() if b.is_floating_point())
    buf.view(-1)[0] = float("nan")
    return model, tok, name


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_a_nan_in_a_buffer_is_refused_at_load(family):
    model, tok, name = _nan_buffer(family)
    with pytest.raises(ModelLoadError, match=f"NaN values in its buffer {name}"):
        mk.load_model(model, tokenizer=tok)


def test_a_minus_inf_mask_buffer_still_loads():
    from mechkit.model.sources.tiny import tiny_model

    model, tok = tiny_model("llama")[:2]
    model.model.register_buffer("kept_mask", torch.full((2, 2), float("-inf")), persistent=False)
    h = mk.load_model(model, tokenizer=tok)
    assert mk.run("inspect", model=h, write=False).report["checks"]["logits_unchanged"]
