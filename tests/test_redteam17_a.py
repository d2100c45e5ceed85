"""Red-team pass 17 (helper a): option values from NumPy through ``mk.run`` (a NumPy integer for a count was
refused as "not a whole number", a NumPy array or NumPy items for a comma list "not text"), finetune's
``--data-seed`` below 0 (refused after the model loaded, with a fix naming ``seed``), and ablate's ``--sweep``
too large for a random baseline (a fix naming ``--top-k``, which beside ``--sweep`` is refused) (issue 32,
option fuzz and class 11)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.options.resolve import resolve_options
from mechkit.registry import get


def _resolved(plugin: str, **options):
    return resolve_options(get(plugin), options)[0]


@pytest.mark.parametrize(("plugin", "name", "value", "expected"), [
    ("detect", "top_k", np.int64(3), 3),
    ("detect", "top_k", np.uint8(4), 4),
    ("detect", "top_k", Fraction(6, 2), 3),
    ("prune", "ridge", np.float32(0.5), 0.5),
    ("prune", "sparsity", np.float32(0.2), "0.2"),
    ("prune", "sparsity", [np.float32(0.1), 0.3], "0.1,0.3"),
    ("ablate", "sweep", [np.int64(5), 10], "5,10"),
    ("ablate", "sweep", np.array([5, 10]), "5,10"),
    ("ablate", "heads", [mk.Head(0, 1), "1.2"], "0.1,1.2"),
])
def test_numpy_numbers_are_taken_as_the_numbers_they_are(plugin, name, value, expected):
    got = _resolved(plugin, **{name: value})[name]
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("name", "value"), [("top_k", np.bool_(True)), ("top_k", 1 + 0j)])
def test_booleans_and_complex_numbers_stay_refused(name, value):
    with pytest.raises(MechkitError, match="is not a whole number"):
        _resolved("detect", **{name: value})


def test_a_nested_array_or_numpy_booleans_stay_refused():
    for value in (np.array([[5]]), [np.bool_(True)]):
        with pytest.raises(MechkitError, match="is not text"):
            _resolved("ablate", sweep=value)


def test_a_negative_data_seed_is_refused_as_that_option_before_the_model_loads(tmp_path):
    with pytest.raises(MechkitError, match="--data-seed -5 is below 0") as err:
        mk.run("finetune", model=str(tmp_path / "no-such-model"), task="capitalize", data_seed=-5, write=False)
    assert "--data-seed" in err.value.fix
    assert _resolved("finetune", data_seed=10**7)["data_seed"] == 10**7  # large seeds still run


def test_a_sweep_too_large_for_its_baseline_gets_a_fix_that_runs(tmp_path):
    common = dict(model="tiny:llama", tasks="capitalize", n=2, shots=1, baseline_seeds=1, write=False)
    with pytest.raises(MechkitError) as err:
        mk.run("ablate", sweep="3,100", **common)
    fix = err.value.fix
    assert "--top-k" not in fix and "--sweep 3" in fix, fix
    run = mk.run("ablate", sweep="3", **common)  # the fix, applied
    assert run.report["params"]["sweep"] == "3"


# --- class 7: a call replaced on a module instance, a Tensor method set over its base ---


def _long_only(call):
    """``call`` doubled on inputs longer than the probe's 16 tokens: what the logits probe cannot see."""
    def wrapped(*args, **kwargs):
        out = call(*args, **kwargs)
        return out * 2 if args and args[0].shape[1] > 20 else out
    return wrapped


def _own_call_impl(model):
    mlp = model.model.layers[0].mlp
    mlp._call_impl = _long_only(type(mlp)._call_impl.__get__(mlp))


def _compiled_call_impl(model):
    mlp = model.model.layers[0].mlp
    mlp._compiled_call_impl = _long_only(mlp._call_impl)


@pytest.mark.parametrize(("edit", "name"), [(_own_call_impl, "_call_impl"), (_compiled_call_impl, "_compiled_call_impl")])
def test_a_call_replaced_on_a_module_instance_is_caught(edit, name):
    class Evil(mk.Plugin):
        name, version, summary, options = "evil", "0.0.1", "leaves a module's call replaced", ()

        def run(self, ctx):
            edit(ctx.model.model)
            return mk.Result(results={})

    handle = mk.load_model("tiny:llama")
    with pytest.raises(MechkitError, match=f"mlp.{name} was replaced"):
        mk.run(Evil, model=handle, write=False)


def test_a_tensor_method_set_over_its_base_is_caught():
    original = torch.Tensor.__dict__.get("pow")

    class Evil(mk.Plugin):
        name, version, summary, options = "evil", "0.0.1", "shadows Tensor.pow", ()

        def run(self, ctx):
            torch.Tensor.pow = _long_only(torch._C.TensorBase.pow)
            return mk.Result(results={})

    try:
        with pytest.raises(MechkitError, match="torch.Tensor.pow was replaced"):
            mk.run(Evil, model=mk.load_model("tiny:llama"), write=False)
    finally:
        if original is None:
            del torch.Tensor.pow
        else:
            torch.Tensor.pow = original
