"""Red-team pass 12 (issue 32), classes 8 and 11: options still silently ignored, and a line naming a flag the
user never typed.

Each test names the case that failed before its fix. The option checks run before any model loads, so these
cost no forward pass.
"""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import mechkit as mk
from mechkit.cli.main import cli
from mechkit.options import OptionError
from mechkit.taskarith import TaskVector


@pytest.mark.parametrize("plugin, options, said", [
    # icl-vectors --method task-vector --top-k 5 picked no heads: the function vector's options went unread
    ("icl-vectors", {"method": "task-vector", "top_k": 5}, "--top-k sets the function vector"),
    ("icl-vectors", {"method": "task-vector", "n_cie": 3}, "--n-cie sets the function vector"),
    ("icl-vectors", {"method": "task-vector", "fv_scales": "2"}, "--fv-scales sets the function vector"),
    # adapt --token-layers '' --token-keep 0.4 selected no token and said nothing
    ("adapt", {"token_layers": "", "token_keep": "0.4"}, "--token-keep sets the shares kept"),
    ("adapt", {"token_layers": "2", "token_keep": ""}, "--token-keep '' keeps no share there"),
    # select-tasks --executor ray without --validate: nothing to run on Ray
    ("select-tasks", {"target": "capitalize", "executor": "ray"}, "--executor sets the validation fine-tunes"),
    ("select-tasks", {"target": "capitalize", "workers": 2}, "--workers sets the validation fine-tunes"),
    # prune --target neurons --gqa group and --guide induction --protect-top-k 3: no head pruned, nothing read
    ("prune", {"target": "neurons", "gqa": "group"}, "--gqa sets how heads are pruned, and --target neurons"),
    ("prune", {"target": "neurons", "guide": "induction", "protect_top_k": 3}, "--protect-top-k keeps heads"),
    # prune --target heads --allocation sensitivity went global, silently (MLP sensitivity spreads neurons alone)
    ("prune", {"target": "heads", "allocation": "sensitivity"}, "--allocation sensitivity spreads MLP channels"),
    ("prune", {"target": "heads,layers", "guide": "wanda@sensitivity"}, "--guide wanda@sensitivity spreads MLP"),
    ("prune", {"target": "layers", "allocation": "uniform"}, "--allocation spreads neurons and heads"),
    ("prune", {"target": "layers", "guide": "attribution@uniform"}, "--guide attribution@uniform sets how"),
    # finetune --method full --rank 4 was refused only after the model had loaded
    ("finetune", {"method": "full", "rank": 4}, "--rank applies to --method lora"),
    ("finetune", {"method": "full", "lora_alpha": 8.0}, "--lora-alpha applies to --method lora"),
])
def test_an_option_still_unread_is_refused_before_the_model_loads(plugin, options, said):
    with pytest.raises(OptionError, match=said):
        mk.run(plugin, model="tiny:nonexistent-family", write=False, **options)  # refused before any load


@pytest.mark.parametrize("plugin, options", [
    ("icl-vectors", {"method": "function-vector", "top_k": 5, "n_cie": 3, "fv_scales": "2"}),
    ("icl-vectors", {"method": "both", "top_k": 5}),
    ("icl-vectors", {"method": "task-vector", "spans": "1,2", "n_contexts": 4}),  # both methods read these
    ("adapt", {"token_layers": "2", "token_keep": "0.5"}),
    ("adapt", {"token_layers": "", "token_keep": ""}),
    ("adapt", {"token_keep": ""}),  # auto blocks, no share: no token selection, as asked
    ("select-tasks", {"target": "capitalize", "validate": True, "workers": 2, "executor": "ray"}),
    ("finetune", {"method": "lora", "rank": 4, "lora_alpha": 8.0}),
    ("prune", {"target": "neurons,heads", "gqa": "group", "guide": "combined", "protect_top_k": 3}),
    ("prune", {"target": "heads", "allocation": "uniform", "guide": "wanda@global-z,random"}),
    ("prune", {"target": "neurons", "allocation": "sensitivity", "guide": "wanda@sensitivity,random"}),
    ("prune", {"target": "layers", "guide": "attribution,random"}),
    ("prune", {"target": "layers", "budget": 0.5, "guide": "attribution"}),
])
def test_the_same_options_where_they_are_read_still_pass_the_checks(plugin, options):
    from mechkit.errors import MechkitError

    with pytest.raises(MechkitError) as err:  # past the option checks: the unknown model is what stops it
        mk.run(plugin, model="tiny:nonexistent-family", write=False, **options)
    assert not isinstance(err.value, OptionError), err.value


def test_a_flag_turned_off_is_named_as_typed():
    """adapt --margin 0.05 --no-debias said '--debias ... drop --debias', a flag the user never passed."""
    with pytest.raises(OptionError) as err:
        mk.run("adapt", model="tiny:nonexistent-family", write=False, margin=0.05, debias=False)
    assert str(err.value).startswith("--no-debias ") and "drop it" in str(err.value)


@pytest.fixture
def vectors(tmp_path):
    paths = []
    for i, task in enumerate(("capitalize", "swap")):
        path = tmp_path / f"{task}.safetensors"
        TaskVector({"w": torch.full((2, 2), float(i + 1))}, {"tasks": [task]}).save(path)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("method, flags, said", [
    # taskvec merge --method task_arithmetic --density 0.2 merged every entry, as if --density were 1
    ("task_arithmetic", ["--density", "0.2"], "--density applies to --method ties"),
    ("dare_ties", ["--density", "0.2"], "--density applies to --method ties"),
    ("ties", ["--p", "0.5"], "--p applies to --method dare and dare_ties"),
    ("task_arithmetic", ["--seed", "3"], "--seed applies to --method dare and dare_ties"),
])
def test_taskvec_merge_refuses_a_merge_option_its_method_does_not_read(tmp_path, vectors, method, flags, said):
    out = tmp_path / "merged.safetensors"
    args = ["taskvec", "merge", "-v", vectors[0], "-v", vectors[1], "--method", method, *flags, "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and said in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize("method, flags", [
    ("ties", ["--density", "0.5"]), ("dare", ["--p", "0.5", "--seed", "3"]), ("dare_ties", ["--p", "0.3"])])
def test_taskvec_merge_takes_each_option_under_its_method(tmp_path, vectors, method, flags):
    out = tmp_path / "merged.safetensors"
    args = ["taskvec", "merge", "-v", vectors[0], "-v", vectors[1], "--method", method, *flags, "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert out.is_file()


# ---- class 11: the fix a line suggests, followed, runs ------------------------------------------------------

@pytest.mark.parametrize("options, then", [
    # prune --budget 0.8 --guide wanda --protect-top-k 3 said "add --guide induction"; adding it named two guides,
    # and --budget refused that next (and --target neurons, the default, prunes no head to protect)
    ({"budget": 0.8, "guide": "wanda", "protect_top_k": 3}, {"guide": "induction", "target": "neurons,heads"}),
    ({"budget": 0.8, "guide": "wanda", "guide_text_weight": 0.1}, {"guide": "attribution"}),
    ({"guide": "wanda,magnitude", "guide_text_weight": 0.1}, {"guide": "wanda,magnitude,attribution"}),
    ({"guide": "random@uniform", "protect_top_k": 2, "target": "heads"}, {"guide": "random@uniform,induction"}),
    ({"target": "neurons", "gqa": "group"}, {"target": "neurons,heads"}),
    ({"target": "heads", "allocation": "sensitivity"}, {"target": "neurons,heads"}),
])
def test_prunes_fix_followed_passes_the_checks(options, then):
    from mechkit.errors import MechkitError

    with pytest.raises(OptionError) as err:
        mk.run("prune", model="tiny:nonexistent-family", write=False, **options)
    for name, value in then.items():
        assert f"--{name} {value}" in str(err.value), err.value
    with pytest.raises(MechkitError) as err:  # the fix taken: past the option checks, stopped by the unknown model
        mk.run("prune", model="tiny:nonexistent-family", write=False, **{**options, **then})
    assert not isinstance(err.value, OptionError), err.value
