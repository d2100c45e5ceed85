"""Red-team pass 19 (find-only, issue 32): what it found, each fixed in general; and three small items the
last note left open.

The small items: the runner's ``--seed`` check and the API's ``mk.ablate`` seed check were two copies of one
range check (now one, :func:`mechkit.model.headspec.checked_seed`); ``prune --target heads,heads`` listed
each row twice; ``ablate --sweep ''`` (no sweep) refused ``--top-k`` as ignored, though it is then the one k.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mechkit.errors import MechkitError, PluginError
from mechkit.model.headspec import MAX_SEED, checked_seed
from mechkit.options.resolve import check_seed
from mechkit.pruning import parse_targets
from tests.conftest import cli_in_process


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 10**30, 1.5, "x", None, True, np.float64(2.0)])
def test_the_runner_and_the_api_refuse_the_same_seeds(seed):
    with pytest.raises(PluginError) as runner:
        check_seed(seed)
    with pytest.raises(MechkitError) as api:
        checked_seed(seed, "mk.ablate")
    assert runner.value.problem.split("seed", 1)[1] == api.value.problem.split("seed", 1)[1]
    assert str(MAX_SEED) in str(runner.value) and "seed=" not in str(runner.value)


@pytest.mark.parametrize("seed,expected", [(0, 0), (MAX_SEED, MAX_SEED), (np.int64(3), 3), ("7", 7), (" 8 ", 8)])
def test_the_runner_takes_seeds_as_before(seed, expected):
    assert check_seed(seed) == expected and type(check_seed(seed)) is int


def test_a_repeated_prune_target_is_read_once():
    assert parse_targets("heads,heads") == ["heads"]
    assert parse_targets("neurons, heads, neurons, layers, heads") == ["neurons", "heads", "layers"]


def test_an_empty_sweep_is_no_sweep_and_top_k_is_read(tmp_path):
    out = tmp_path / "run"
    result = cli_in_process("ablate", "--model", "tiny:llama", "--heads", "random", "--top-k", "2", "--tasks",
                            "capitalize", "--n", "2", "--shots", "2", "--sweep", "", "--baseline-seeds", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert "2 random heads" in report["finding"]


# --- pass 19, helper A's Python-API failures (hooking, patching, show_attention) ---

@pytest.fixture(scope="module")
def h():
    import mechkit as mk

    return mk.load_model("tiny:llama")


@pytest.mark.parametrize("under", ["ablate", "hooks", "edit"])
def test_a_completion_of_a_recording_made_under_an_intervention_is_refused_outside_it(h, under):
    import contextlib

    import torch

    import mechkit as mk

    ids = h.to_tokens("hello world")

    def altered():
        if under == "ablate":
            return mk.ablate(h, "0.1")
        if under == "hooks":
            return mk.hooks(h, {"blocks.0.attn.hook_z": lambda z, hook: z * 0})
        stack = contextlib.ExitStack()
        stack.enter_context(mk.edit_weights(h)).zero_head_output(mk.Head(0, 1))
        return stack

    before = h(ids)
    with altered():
        with mk.record(h, ["blocks.1.hook_resid_post"]) as cache:
            h(ids)
        changed = not torch.equal(h(ids), before)
    if not changed:
        pytest.skip(f"{under}: this context left the logits as they were, so there is nothing to tell apart")
    with pytest.raises(MechkitError, match="other logits"):
        cache.to_transformer_lens()
    with pytest.raises(MechkitError, match="other logits"):
        cache.completion("blocks.*.attn.hook_z")
    assert torch.equal(h(ids), before)


def test_a_completion_inside_the_same_intervention_or_of_a_plain_recording_is_taken(h):
    import torch

    import mechkit as mk

    ids = h.to_tokens("hello world")
    with mk.ablate(h, "0.1"):
        with mk.record(h, ["blocks.1.hook_resid_post"]) as cache:
            h(ids)
        with mk.record(h, "*") as full:
            h(ids)
        done = cache.completion("blocks.*.attn.hook_z")
        assert torch.allclose(done["blocks.0.attn.hook_z"], full["blocks.0.attn.hook_z"], atol=1e-5)  # "*": eager attention
        assert not done["blocks.0.attn.hook_z"][0, :, 1].any()  # the ablated head, as recorded
    with mk.record(h, ["blocks.1.hook_resid_post"]) as plain:
        h(ids)
    assert sorted(plain.completion("blocks.*.attn.hook_z")) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]


@pytest.mark.parametrize("pattern", [None, 5, [None], b"blocks.*", ["blocks.0.hook_resid_pre", 3]])
def test_a_completion_of_no_pattern_is_one_line(h, pattern):
    import mechkit as mk

    with mk.record(h, ["blocks.1.hook_resid_post"]) as cache:
        h(h.to_tokens("hello world"))
    with pytest.raises(MechkitError, match="Cache.completion takes a hook name pattern"):
        cache.completion(pattern)


@pytest.mark.parametrize("fn_name", ["relu", "add", "max"])
def test_a_hook_function_whose_arguments_cannot_be_read_is_one_line(h, fn_name):
    import builtins

    import torch

    import mechkit as mk

    fn = getattr(torch, fn_name) if fn_name != "max" else builtins.max
    ids = h.to_tokens("hello world")
    before = h(ids)
    with pytest.raises(MechkitError, match="arguments cannot be read.*wrap it"), \
            mk.hooks(h, {"blocks.0.hook_resid_post": fn}):
        h(ids)
    assert torch.equal(h(ids), before)


@pytest.mark.parametrize("layer", [np.int64(0), np.int32(1), np.uint8(0)])
def test_pattern_hooks_take_numpy_layer_numbers(h, layer):
    import mechkit as mk

    seen = []
    with mk.pattern_hooks(h, {layer: [lambda p: seen.append(p.shape)]}):
        h(h.to_tokens("hello world"))
    assert len(seen) == 1


@pytest.mark.parametrize("seed", [-1, -5, 2**64, 1.0, "1"])
def test_show_attention_refuses_the_seeds_ablate_refuses(h, seed):
    import mechkit as mk

    with pytest.raises(MechkitError, match="seed"):
        mk.show_attention(h, "hello world", heads="random", top_k=3, seed=seed)
    with pytest.raises(MechkitError, match="seed"):
        mk.parse_heads("random", 2, 4, top_k=2, seed=-1)


def test_a_negative_seed_no_longer_draws_what_its_absolute_value_draws(h):
    import mechkit as mk

    assert mk.show_attention(h, "hello world", heads="random", top_k=3, seed=1).patterns.heads


@pytest.mark.parametrize("kind", ["float8", "sparse", "nested"])
def test_normalized_recovery_refuses_tensors_that_are_no_real_grid(kind):
    import torch

    from mechkit.patching import normalized_recovery

    grid = torch.tensor([1.0, 2.0])
    odd = {"float8": lambda: grid.to(torch.float8_e4m3fn), "sparse": grid.to_sparse,
           "nested": lambda: torch.nested.nested_tensor([grid, grid[:1]])}[kind]()
    with pytest.raises(MechkitError, match="not real numbers"):
        normalized_recovery(odd, 3.0, 0.0)


@pytest.mark.parametrize("clean", [lambda t: t.to(__import__("torch").float8_e5m2), lambda t: t.to_sparse()])
def test_normalized_recovery_refuses_one_number_of_an_odd_kind(clean):
    import torch

    from mechkit.patching import normalized_recovery

    with pytest.raises(MechkitError, match="tensor, not a number"):
        normalized_recovery(torch.tensor([1.0, 2.0]), clean(torch.tensor([3.0])), 0.0)


@pytest.mark.parametrize("clean", [10**400, -(10**400)])
def test_normalized_recovery_refuses_a_number_no_float_holds(clean):
    from mechkit.patching import normalized_recovery

    with pytest.raises(MechkitError, match="not a number a float holds"):
        normalized_recovery(1.0, clean, 0.0)


def test_a_task_vector_saved_past_a_file_size_limit_is_one_line(tmp_path):
    import torch

    from mechkit.taskarith.vector import TaskVector
    from tests.conftest import file_size_limit

    vector = TaskVector({"w": torch.randn(64, 64)}, {"base": "tiny:llama"})
    with file_size_limit(4096), pytest.raises(MechkitError, match="cannot write|file-size limit|too large"):
        vector.save(tmp_path / "v.safetensors")
    assert not (tmp_path / "v.safetensors").exists()


def test_a_marked_run_folder_holding_a_users_file_is_named_for_what_it_is(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import FOREIGN, RUN_MARKER, clear_cache, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = tmp_path / "runs" / "0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / RUN_MARKER).write_text('{"mechkit": "run steps"}\n')
    (folder / "mine.txt").write_text("notes")
    assert [e.name for e in list_cache(tmp_path)] == [FOREIGN]
    with pytest.raises(MechkitError, match="hold files no run writes there") as err:
        clear_cache(["runs/0123456789abcdef"], root=tmp_path)
    assert "did not mark" not in str(err.value)
    assert (folder / "mine.txt").read_text() == "notes"


def test_a_plugin_that_refuses_a_pruned_model_says_so_before_the_load(tmp_path, monkeypatch):
    """adapt on a neurons-pruned model: refused from its config's mechkit_pruning entry, before any load."""
    import mechkit as mk
    from mechkit.model import loading
    from mechkit.model.sources.tiny import tiny_config

    model_dir = tmp_path / "pruned"
    model_dir.mkdir()
    config = tiny_config("llama").to_dict()
    config["mechkit_pruning"] = {"n_layers": config["num_hidden_layers"], "mlp_keep": {"0": [0, 1, 2]}, "head_keep": {}}
    (model_dir / "config.json").write_text(json.dumps(config))

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", no_load)
    with pytest.raises(MechkitError, match="adapt cannot run on a model with pruned"):
        mk.run("adapt", model=str(model_dir), write=False)
