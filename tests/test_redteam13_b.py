"""Red-team pass 13 (issue 32), helper B: options still silently ignored, one over-refusal, and --gqa group on
a model without KV groups.

Each test names the case that failed before its fix. The option checks run before any model loads; the
--gqa checks run as the run starts, before any forward.
"""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit import registry
from mechkit.options import OptionError
from mechkit.options.execution import ray_installed
from mechkit.options.resolve import resolve_options
from mechkit.options.unread import refuse_no_kv_groups
from tests.conftest import cli_in_process

needs_ray = pytest.mark.skipif(not ray_installed(), reason="--executor ray parses only where Ray is installed")
SELECT = {"target": "capitalize"}


@pytest.mark.parametrize("plugin, options, said", [
    # patch --method attribution --batch-size 4 ran: attribution batches no patch (the pass-12 leftover)
    ("patch", {"method": "attribution", "batch_size": 4}, "--batch-size sets the patches per forward pass"),
    ("patch", {"method": "attribution", "batch_size": 4, "clean": "The cat sat.", "corrupted": "The dog sat.",
               "answers": " cat, dog"}, "--method attribution runs none"),
    # select-tasks embedded no token under lora-grad and the last token under actvec, whatever --position said
    ("select-tasks", {**SELECT, "representation": "lora-grad", "position": "mean"}, "--position picks the token"),
    ("select-tasks", {**SELECT, "representation": "actvec", "position": "mean"}, "reads the last token"),
    ("select-tasks", {**SELECT, "representation": "lora-grad", "layer": 0}, "--layer picks the block"),
    ("select-tasks", {**SELECT, "representation": "lora-grad", "position": "mean", "validate": True,
                      "transfer_seeds": 0}, "--position picks the token"),
    # finetune --steps 10 --checkpoint-every 20 wrote no checkpoint: a kill restarted from step 0
    ("finetune", {"steps": 10, "checkpoint_every": 20}, "--steps 10 ends first"),
    ("finetune", {"steps": 10, "checkpoint_every": 10}, "pass --checkpoint-every below 10, or 0 for none"),
    # sweep/ablate/shuffle --tasks capitalize --setting simple were refused only after the model had loaded
    ("sweep", {"tasks": "capitalize", "setting": "simple"}, "--setting simple applies to composite tasks"),
    ("ablate", {"tasks": "capitalize,past-tense", "setting": "composite"}, "none of capitalize, past-tense is one"),
    ("shuffle", {"tasks": "capitalize", "setting": "composite-in-context"}, "add a composite such as"),
    # adapt --tasks capitalize --min-cv 0.5: one task fits no task signal, so nothing was ever trusted by it
    ("adapt", {"tasks": "capitalize", "min_cv": 0.5}, "--min-cv sets when the task signal is trusted"),
])
def test_options_a_run_would_not_read_are_refused(plugin, options, said):
    with pytest.raises(OptionError, match=said):
        resolve_options(registry.get(plugin), options)


@needs_ray
@pytest.mark.parametrize("plugin, options, said", [
    # sweep --method attribution --executor ray: no unit was mapped, the run stayed in this process
    ("sweep", {"method": "attribution", "executor": "ray"}, "--executor fans the exact sweep's layers out"),
    ("sweep", {"method": "attribution", "executor": "ray", "workers": 2}, "--executor fans"),
    # prune --budget 0.5 --executor ray: the budget search runs serially
    ("prune", {"budget": 0.5, "executor": "ray", "workers": 2}, "--budget searches one row at a time"),
])
def test_execution_options_where_no_unit_is_mapped_are_refused(plugin, options, said):
    with pytest.raises(OptionError, match=said):
        resolve_options(registry.get(plugin), options)


@pytest.mark.parametrize("plugin, options", [
    # select-tasks --validate --grad-blocks 2 was refused, though the ρ table computes lora-grad with it
    ("select-tasks", {**SELECT, "representation": "hidden", "validate": True, "grad_blocks": 1}),
    ("select-tasks", {**SELECT, "representation": "lora-grad", "validate": True, "layer": 0, "position": "mean"}),
    ("select-tasks", {**SELECT, "representation": "pc1", "position": "mean"}),
    ("select-tasks", {**SELECT, "representation": "actvec", "layer": 0}),
    ("adapt", {"tasks": "capitalize,past-tense", "min_cv": 0.5}),
    ("finetune", {"steps": 10, "checkpoint_every": 5}),
    ("finetune", {"steps": 10, "checkpoint_every": 0}),
    ("finetune", {"steps": 30}),  # the default 50 cannot be told from one given: not refused (refuse_ignored)
    ("sweep", {"tasks": "capitalize,capitalize+swap", "setting": "simple"}),
    ("patch", {"method": "both", "batch_size": 4}),
    ("sweep", {"method": "attribution", "batch_size": 4}),
])
def test_options_a_run_reads_are_accepted(plugin, options):
    resolve_options(registry.get(plugin), options)


@needs_ray
def test_the_exact_sweep_and_the_prune_grid_still_take_ray():
    resolve_options(registry.get("sweep"), {"method": "both", "executor": "ray", "workers": 2})
    resolve_options(registry.get("prune"), {"sparsity": "0.2", "executor": "ray", "workers": 2})


def test_the_grad_blocks_line_names_the_validation_that_reads_it():
    with pytest.raises(OptionError, match="--transfer-seeds above 0"):
        resolve_options(registry.get("select-tasks"), {**SELECT, "validate": True, "transfer_seeds": 0,
                                                       "grad_blocks": 1})


@pytest.mark.parametrize("plugin, args", [
    # shuffle --gqa group on GPT-2 (one KV head per query head) ran as --gqa query with only a table note
    ("shuffle", ["--tasks", "", "--seeds", "1", "--n-seqs", "2", "--seg-len", "5"]),
    # prune --target heads --gqa group removed each head on its own (the group mode's g > 1 guard)
    ("prune", ["--target", "heads", "--sparsity", "0.2", "--tasks", "capitalize", "--n", "1", "--calib", "1"]),
])
def test_gqa_group_without_kv_groups_is_one_line_before_any_work(tmp_path, plugin, args):
    out = tmp_path / "run"
    r = cli_in_process(plugin, "--model", "tiny:gpt2", "--gqa", "group", *args, "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert "--gqa group acts on grouped-query attention's KV groups" in r.stderr and "drop --gqa group" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_a_model_with_kv_groups_passes_the_gqa_check():
    refuse_no_kv_groups(mk.load_model("tiny:llama").anatomy, "--gqa group", "unused")  # 4 query heads, 2 KV heads
    with pytest.raises(OptionError, match="one KV head per query head"):
        refuse_no_kv_groups(mk.load_model("tiny:gpt2").anatomy, "--gqa group", "drop --gqa group")
