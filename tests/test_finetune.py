"""Fine-tuning task models on tiny models: the loss falls, the caller's model is untouched, the saved
directory reloads, and LoRA is merged into plain weights."""

from __future__ import annotations

import json

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.taskarith.finetune import (
    Recipe,
    checkpoint_state,
    eval_prompts,
    finetune,
    parse_shots,
    training_rows,
)
from mechkit.tasks import build_prompts


@pytest.fixture(scope="module")
def tiny():
    return mk.load_model("tiny:llama", device="cpu")


def test_loss_falls_and_the_handle_is_untouched(tiny):
    before = {n: p.detach().clone() for n, p in tiny.model.named_parameters()}
    out = finetune(tiny, Recipe(task="capitalize", steps=12, lr=3e-3, batch_size=8, pool=64))
    assert sum(out.losses[-3:]) / 3 < sum(out.losses[:3]) / 3
    assert all(torch.equal(p, before[n]) for n, p in tiny.model.named_parameters())
    assert out.model is not tiny.model and not any(p.requires_grad for p in out.model.parameters())


def test_training_prompts_exclude_the_held_out_queries(tiny):
    recipe = Recipe(task="capitalize", eval_n=20, pool=200, shots=(0, 2))
    held_out = {p.query for p in eval_prompts(recipe)}
    rows = training_rows(tiny, recipe)
    texts = {tiny.tokenizer.decode(ids[:start]) for ids, start in rows}
    assert rows and not any(t.endswith(f"input: {q}\noutput:") for t in texts for q in held_out)
    assert parse_shots("0, 3") == (0, 3)
    with pytest.raises(MechkitError):
        parse_shots("x")


def test_plugin_writes_a_reloadable_model_dir_and_lora_adapter(tmp_path):
    out = tmp_path / "ft"
    run = mk.run("finetune", model="tiny:llama", task="lowercase", steps=2, batch_size=4, method="lora",
                 rank=2, out=out)
    files = set(run.results["model_files"])
    assert {"config.json", "model.safetensors", "tokenizer.json", "lora_adapter.safetensors"} <= files
    report = json.loads((out / "report.json").read_text())
    assert report["results"]["recipe"]["method"] == "lora" and len(report["results"]["losses"]) == 2
    reloaded = mk.load_model(str(out), device="cpu")
    base = mk.load_model("tiny:llama", device="cpu")
    changed = {n for n, p in reloaded.model.named_parameters()
               if not torch.equal(p, dict(base.model.named_parameters())[n])}
    assert changed and all("proj" in n for n in changed)  # LoRA merged into the targeted projections only
    assert "embed" not in " ".join(changed)


def test_lowercase_is_capitalize_reversed():
    for p in build_prompts("lowercase", n=10, shots=2, seed=0):
        assert p.target == p.query.lower() and p.query != p.target
        assert p.query in (p.target.upper(), p.target.capitalize())


@pytest.mark.parametrize("family, method", [("llama", "full"), ("llama", "lora"), ("gpt2", "full")])
def test_interrupted_finetune_resumes_to_the_same_weights(tmp_path, family, method):
    tiny = mk.load_model(f"tiny:{family}", device="cpu")  # gpt2 has dropout: its RNG state must resume too
    recipe = Recipe(task="capitalize", steps=6, lr=3e-3, batch_size=4, pool=32, method=method, rank=2)
    whole = finetune(tiny, recipe)

    def stop_after_four(step, loss):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(tiny, recipe, checkpoint=tmp_path, checkpoint_every=2, on_step=stop_after_four)
    assert checkpoint_state(tmp_path)["step"] == 4
    seen = []
    resumed = finetune(tiny, recipe, checkpoint=tmp_path, checkpoint_every=2, on_step=lambda i, _: seen.append(i))
    assert seen == [4, 5]  # only the unfinished steps ran
    assert resumed.losses == whole.losses
    a, b = dict(whole.model.named_parameters()), dict(resumed.model.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_checkpoint_from_another_recipe_is_ignored(tiny, tmp_path):
    recipe = Recipe(task="capitalize", steps=2, lr=3e-3, batch_size=4, pool=32)
    finetune(tiny, Recipe(task="capitalize", steps=4, lr=1e-3, batch_size=4, pool=32),
             checkpoint=tmp_path, checkpoint_every=2)
    seen = []
    finetune(tiny, recipe, checkpoint=tmp_path, checkpoint_every=2, on_step=lambda i, _: seen.append(i))
    assert seen == [0, 1]


def test_interrupted_finetune_command_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    import mechkit.taskarith.finetune as ft

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    original, calls = ft.save_checkpoint, []

    def save_then_interrupt(*args, **kwargs):
        original(*args, **kwargs)
        calls.append(len(args[-1]))
        raise KeyboardInterrupt

    monkeypatch.setattr(ft, "save_checkpoint", save_then_interrupt)
    opts = dict(model="tiny:llama", task="capitalize", steps=4, batch_size=4, lr=3e-3, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        mk.run("finetune", out=tmp_path / "a", **opts)
    assert calls == [2] and not (tmp_path / "a").exists()
    monkeypatch.setattr(ft, "save_checkpoint", original)
    resumed = mk.run("finetune", out=tmp_path / "a", **opts)
    assert not list((tmp_path / "cache" / "runs").iterdir())  # finished: its checkpoint is gone
    whole = mk.run("finetune", out=tmp_path / "b", **opts)
    assert resumed.results["losses"] == whole.results["losses"]
    a = mk.load_model(str(tmp_path / "a"), device="cpu").model.state_dict()
    b = mk.load_model(str(tmp_path / "b"), device="cpu").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_every_zero_writes_none_and_negative_is_refused(tiny, tmp_path):
    recipe = Recipe(task="capitalize", steps=2, lr=3e-3, batch_size=4, pool=32)
    finetune(tiny, recipe, checkpoint=tmp_path, checkpoint_every=0)
    assert checkpoint_state(tmp_path) is None
    with pytest.raises(MechkitError, match="checkpoint-every"):
        finetune(tiny, recipe, checkpoint=tmp_path, checkpoint_every=-1)


def test_a_bf16_model_is_trained_in_float32(tiny):
    bf16 = mk.load_model("tiny:llama", device="cpu", dtype="bfloat16")
    out = finetune(bf16, Recipe(task="capitalize", steps=2, lr=1e-5, batch_size=4, pool=32))
    base = dict(bf16.model.named_parameters())
    changed = [n for n, p in out.model.named_parameters() if not torch.equal(p, base[n].float())]
    assert next(out.model.parameters()).dtype == torch.float32
    assert len(changed) == len(base)  # lr 1e-5 updates survive; rounded into bf16 most would vanish


@pytest.mark.parametrize("opts, word", [(dict(task="capitalize,lowercase"), "one task"),
                                        (dict(method="lora", rank=0), "rank")])
def test_bad_finetune_input_is_one_line(tmp_path, capsys, opts, word):
    from mechkit.cli.main import main

    args = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "--model", "tiny:llama", "--steps", "1", "--out", str(tmp_path / "ft"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and word in err[0], err
    assert not (tmp_path / "ft").exists()
