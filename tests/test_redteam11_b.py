"""Red-team pass 11 (issue 32), classes 4, 7, 8 and 11: what still failed, fixed as a class.

Each test names the case that failed before its fix. Tiny models only; the option checks run before any model
loads, so most of these cost no forward pass.
"""

from __future__ import annotations

import platform

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, PluginError
from mechkit.options import OptionError
from mechkit.plugin import Plugin
from mechkit.runner import library_versions
from mechkit.taskarith import TaskVector
from mechkit.taskarith.apply import apply, model_base
from mechkit.taskarith.checks import architecture_mismatch, base_mismatch
from mechkit.taskselect.coverage import mahalanobis2


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


# ---- class 8: an option the run does not read is refused, in every plugin ----------------------------------

@pytest.mark.parametrize("plugin, options, said", [
    # ablate --heads 0.1 --sweep 2,3 ablated the one head and reported k=1 only
    ("ablate", {"heads": "0.1", "sweep": "2,3"}, "--sweep picks among ranked or random heads"),
    ("ablate", {"heads": "0.1,1.0", "top_k": 3}, "--top-k picks among ranked"),
    ("ablate", {"heads": "0.1", "n_seqs": 7}, "--n-seqs scores heads to rank them"),
    ("ablate", {"heads": "random", "from_report": "."}, "--from scores heads to rank them"),
    ("ablate", {"from_report": ".", "seg_len": 9}, "--seg-len sets how heads are scored here"),
    ("ablate", {"top_k": 2, "sweep": "2,3"}, "--top-k sets the one k of a run"),
    ("ablate", {"baseline": "none", "baseline_seeds": 2}, "--baseline-seeds counts the random-head draws"),
    ("shuffle", {"heads": "0.1,1.1", "top_k": 3}, "--top-k picks among ranked"),
    ("shuffle", {"heads": "random", "from_report": "."}, "--from scores heads to rank them"),
    ("shuffle", {"tasks": "", "n": 3}, "--n sets the task prompts, and --tasks '' scores no task"),
    # prune --reconstruct none --ridge 0.5 ran with no refit at all
    ("prune", {"reconstruct": "none", "ridge": 0.5}, "--ridge sets the least-squares refit"),
    ("prune", {"reconstruct": "mean", "sequential": True}, "--sequential sets the least-squares refit"),
    ("prune", {"protect_top_k": 3}, "--protect-top-k protects heads under the induction and combined guides"),
    ("prune", {"guide": "magnitude,wanda", "guide_text_weight": 0.2}, "--guide-text-weight weighs the gradient"),
    ("prune", {"budget": 0.8, "guide": "wanda,magnitude"}, "--budget searches the plan of the first alone"),
    # select-tasks --steps 5 --lr 0.5 without --validate exited 0 having trained nothing
    ("select-tasks", {"target": "capitalize", "steps": 5}, "--steps sets the validation fine-tunes"),
    ("select-tasks", {"target": "capitalize", "seeds": "3"}, "--seeds sets the validation fine-tunes"),
    ("select-tasks", {"target": "capitalize", "transfer_seeds": 0}, "--transfer-seeds sets the validation"),
    # adapt --margin 0.05 --margin-prompts 3 timed nothing and reported a 0.99 adherence target it never aimed at
    ("adapt", {"margin": 0.05, "margin_prompts": 3}, "--margin-prompts calibrates the margin"),
    ("adapt", {"margin": 0.05, "adherence": 0.9}, "--adherence calibrates the margin"),
    ("adapt", {"margin": 0.05, "debias": False}, "--no-debias calibrates the margin"),
    ("adapt", {"protect_top_k": 3}, "--protect-top-k keeps the blocks of induction heads"),
    ("adapt", {"prune_budgets": "", "prune_reconstruct": "none"}, "--prune-reconstruct sets the static pruning"),
    # compose --parts steps --shots 0,2 measured K = 2 alone, and its report listed the grid [0, 2]
    ("compose", {"parts": "steps", "shots": "0,2"}, "--shots is a grid of the study part"),
    ("compose", {"parts": "components", "shots": "0,5"}, "--shots is a grid of the study part"),
    ("compose", {"parts": "components", "shots": "5", "effect_shots": 2}, "--effect-shots gives the only K"),
])
def test_an_option_the_run_would_not_read_is_refused_before_the_model_loads(plugin, options, said):
    with pytest.raises(OptionError, match=said):
        mk.run(plugin, model="tiny:nonexistent-family", write=False, **options)  # refused before any load


@pytest.mark.parametrize("plugin, options", [
    ("ablate", {"heads": "induction", "sweep": "2,3"}),
    ("ablate", {"heads": "random", "top_k": 2, "n_seqs": 50}),  # at its default: cannot be told from left out
    ("shuffle", {"heads": "0.1,1.1", "n_seqs": 7}),  # shuffle's loss reads --n-seqs whatever the heads
    ("prune", {"guide": "induction", "protect_top_k": 3, "target": "neurons,heads"}),  # heads: it protects some
    ("prune", {"budget": 0.8, "guide_text_weight": 0.1}),  # the default guides' first (attribution) reads it
    ("adapt", {"margin": 0.05, "margin_plans": 10}),
    ("select-tasks", {"target": "capitalize", "validate": True, "steps": 5}),
    ("compose", {"parts": "steps", "shots": "5"}),
    ("compose", {"parts": "study", "shots": "0,2"}),
    ("compose", {"parts": "steps,components", "shots": "5", "effect_shots": 2}),
])
def test_an_option_the_run_reads_is_still_accepted(plugin, options):
    with pytest.raises(MechkitError) as err:  # only the (absent) model stops it: the options passed
        mk.run(plugin, model="tiny:nonexistent-family", write=False, **options)
    assert "unknown tiny model family" in str(err.value)


# ---- class 11: a fix the message suggests works ------------------------------------------------------------

def test_a_singular_covariance_never_suggests_the_estimator_that_failed():
    points = torch.randn(2, 64, generator=torch.Generator().manual_seed(0)).double().numpy()
    with pytest.raises(MechkitError) as err:  # Ledoit-Wolf on 2 points: "use --estimator ledoit-wolf" was the fix
        mahalanobis2(points, points.mean(0) * 0, "ledoit-wolf")
    assert "ledoit-wolf" not in err.value.fix and "--estimator oas" in err.value.fix
    assert mahalanobis2(points, points.mean(0) * 0, "oas") > 0  # the fix named works


def test_allow_other_base_is_offered_only_where_the_vector_fits_the_model(llama):
    base = model_base(llama)
    pruned = {**base, "sha256": "0" * 64,
              "architecture": {**base["architecture"], "pruning": {"n_layers": 2, "head_keep": {"0": [0, 3]}}}}
    assert architecture_mismatch(pruned, base) == "one is a pruned model, the other is not"
    name = "model.layers.0.self_attn.o_proj.weight"
    vector = TaskVector({name: torch.zeros(64, 32)}, {"tasks": ["capitalize"], "base": pruned})
    with pytest.raises(MechkitError) as err, apply(llama, vector):  # "pass --allow-other-base": then a shape error
        pass
    assert "allow-other-base" not in err.value.fix and "cannot take it" in err.value.fix
    other = {**base, "sha256": "0" * 64}  # same architecture, other weights: there the option does apply
    assert architecture_mismatch(other, base) is None and base_mismatch(other, base).startswith("the weights differ")
    qwen = {**other, "architecture": {**base["architecture"], "model_type": "qwen2"}}  # its names and shapes fit
    for recorded in (other, qwen):
        fits = TaskVector({name: torch.zeros_like(llama.model.state_dict()[name])}, {"base": recorded})
        with pytest.raises(MechkitError) as err, apply(llama, fits):  # the option is the right fix
            pass
        assert "--allow-other-base" in err.value.fix
        with apply(llama, fits, allow_other_base=True):  # and following it works
            pass

# ---- class 7: a plugin that fails after changing the model says so ------------------------------------------

class _EditsThenFails(Plugin):
    name = "redteam11-edits-then-fails"
    version = "0.1.0"
    summary = "Scales a weight, then fails without undoing it."
    options = ()

    def run(self, ctx):
        with torch.no_grad():
            next(ctx.model.model.parameters()).mul_(2.0)
        raise MechkitError("something else went wrong", "try again")


class _FailsCleanly(_EditsThenFails):
    name = "redteam11-fails-cleanly"

    def run(self, ctx):
        raise MechkitError("something else went wrong", "try again")


def test_a_plugin_that_fails_after_editing_the_model_says_the_model_stays_changed():
    handle = mk.load_model("tiny:llama")
    with pytest.raises(PluginError, match="left the model changed .*after it failed: something else went wrong"):
        mk.run(_EditsThenFails, model=handle, write=False)  # only "something else went wrong" was said


def test_a_plugin_that_fails_without_changes_keeps_its_own_error(llama):
    with pytest.raises(MechkitError) as err:
        mk.run(_FailsCleanly, model=llama, write=False)
    assert not isinstance(err.value, PluginError) and err.value.problem == "something else went wrong"


# ---- class 4: the resume key covers the Python that computes ------------------------------------------------

def test_the_resume_key_holds_the_python_version():
    """prune's calibration and held-out text is CPython's pydoc_data.topics and the tasks draw with its random
    module: a venv rebuilt on another Python between a kill and the rerun resumed on the old steps."""
    assert library_versions()["python"] == platform.python_version()
