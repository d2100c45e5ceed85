"""Red-team pass 54 (b), fixed: refusals whose suggested fix failed when applied literally.

- F1: a level with one fraction too small and another too large got only one check's fix (``--sparsity
  neurons=0.999,heads=0.2`` was told ``neurons=0.999,heads=0.5``, refused next for neurons); :func:`fit_levels`
  fits both, repeating where layers change what the others can lose.
- F2: a list of levels (``--sparsity 0.3,0.9``) was told ``--sparsity heads=0.5``, dropping 0.3; the fix is the
  whole list with each bad level replaced by one fraction passing for every target.
- F3: a repeated ``--sparsity`` key beside another target was told ``--target heads --sparsity 0.2,0.4``, dropping
  neurons; the example keeps the other pairs.
- F4: ``--protect-top-k`` blocking the only target was told "or drop heads from --target", leaving it empty.
- F5: an unreachable budget was told "add targets", which reached no more; ``--target heads`` alone has no mix
  to search, now said before any work.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.options.option import OptionError
from mechkit.pruning.guides import Scores
from mechkit.pruning.select import fit_levels, make_plan, parse_levels, past_reach, removes_nothing
from mechkit.pruning.study import budget_fix, unsearched

QUIET = dict(console=Console(file=io.StringIO()))
LLAMA = SimpleNamespace(n_layers=2, n_heads=4, n_groups=2, n_kv_heads=2, d_mlp=128)  # tiny:llama's shape
COMMON = dict(model="tiny:llama", tasks="capitalize", calib=2, n=2, shots=1, repeats=1, guide="random",
              reconstruct="none", **QUIET)


def _passes(anatomy, level, allocation="uniform", gqa="slot"):
    return removes_nothing(anatomy, level, allocation, gqa) is None and past_reach(anatomy, level, allocation,
                                                                                  gqa) is None


def _sparsity(fix):
    return fix.rpartition("--sparsity ")[2].rstrip(")")


# --- F1 ----------------------------------------------------------------------------------------------------------


def test_a_level_too_small_and_too_large_gets_one_fix_passing_both():
    level = {"neurons": 0.999, "heads": 0.2}
    why, fix = fit_levels(LLAMA, [level], "uniform")
    assert "heads=0.2 removes no head" in why and "neurons=0.999 asks for 128" in why
    assert fix == "lower neurons to 0.99 and raise heads to 0.5 (--sparsity neurons=0.99,heads=0.5)"
    fixed = parse_levels(_sparsity(fix), ["neurons", "heads"])
    assert fixed == [{"neurons": 0.99, "heads": 0.5}] and _passes(LLAMA, fixed[0])  # both targets kept


@pytest.mark.parametrize("shape", [dict(n_layers=2, n_heads=4, n_groups=1, n_kv_heads=4, d_mlp=64),
                                   dict(n_layers=3, n_heads=8, n_groups=2, n_kv_heads=4, d_mlp=16),
                                   dict(n_layers=5, n_heads=6, n_groups=1, n_kv_heads=6, d_mlp=7)])
@pytest.mark.parametrize("allocation", ["uniform", "global"])
def test_every_fitted_level_passes_both_checks(shape, allocation):
    anatomy = SimpleNamespace(**shape)
    for layers in (0, 0.01, 0.3, 0.9, 0.99):
        for heads in (0.01, 0.3, 0.99):
            for neurons in (0.001, 0.5, 0.999):
                level = {k: v for k, v in dict(layers=layers, heads=heads, neurons=neurons).items() if v}
                found = fit_levels(anatomy, [level], allocation)
                if found is None:
                    assert _passes(anatomy, level, allocation)
                    continue
                fixed = parse_levels(_sparsity(found[1]), list(level))
                assert set(fixed[0]) == set(level) and _passes(anatomy, fixed[0], allocation), (level, found)


def test_the_public_checks_keep_their_words():
    assert removes_nothing(LLAMA, {"heads": 0.2})[1] == "give it 0.5 or more (--sparsity heads=0.5)"
    assert past_reach(LLAMA, {"heads": 0.9})[1] == "give it 0.5 or less (--sparsity heads=0.5)"
    assert fit_levels(LLAMA, [{"heads": 0.9}])[1] == "give it 0.5 or less (--sparsity heads=0.5)"


def test_prune_fixes_both_fractions_at_once_and_the_fix_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OptionError, match="neurons=0.999 asks for") as err:
        mk.run("prune", out=tmp_path / "a", target="neurons,heads", sparsity="neurons=0.999,heads=0.2",
               allocation="uniform", **COMMON)
    assert "heads=0.2 removes no head" in str(err.value)
    run = mk.run("prune", out=tmp_path / "b", target="neurons,heads", sparsity=_sparsity(err.value.fix),
                 allocation="uniform", **COMMON)
    assert run.report["results"]["rows"][0]["sparsity"] == {"neurons": 0.99, "heads": 0.5}


def test_gpt2_layers_too_many_and_heads_too_few_fit_together(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = {**COMMON, "model": "tiny:gpt2"}
    with pytest.raises(OptionError, match="layers=0.9") as err:
        mk.run("prune", out=tmp_path / "a", target="layers,heads", sparsity="layers=0.9,heads=0.1", **common)
    assert "heads=0.1 removes no head" in str(err.value)
    fixed = parse_levels(_sparsity(err.value.fix), ["layers", "heads"])[0]
    assert set(fixed) == {"layers", "heads"}
    run = mk.run("prune", out=tmp_path / "b", target="layers,heads", sparsity=_sparsity(err.value.fix), **common)
    assert run.report["results"]["rows"][0]["sparsity"] == fixed


# --- F2 ----------------------------------------------------------------------------------------------------------


def test_a_list_of_levels_keeps_every_level_in_its_fix():
    levels = parse_levels("0.3,0.9", ["heads"])
    why, fix = fit_levels(LLAMA, levels, "uniform")
    assert why.startswith("--sparsity heads=0.9 asks for 4") and "0.3" not in why  # only the bad level's problem
    # 0.5, the most it can remove, removes the slot 0.3 removes on this shape: one level, not two rows (pass 57)
    assert fix == "drop 0.9 (the most it can remove, 0.5, removes what 0.3 does) (--sparsity 0.3)"
    assert fit_levels(LLAMA, parse_levels(_sparsity(fix), ["heads"]), "uniform") is None


def test_a_list_fix_is_one_fraction_for_every_target_without_repeats():
    levels = parse_levels("0.3,0.999,0.5", ["neurons", "heads"])
    fix = fit_levels(LLAMA, levels, "uniform")[1]
    assert _sparsity(fix) == "0.3,0.5"  # 0.999 fitted to 0.5, already a level: once, order kept
    assert all(_passes(LLAMA, level) for level in parse_levels("0.3,0.5", ["neurons", "heads"]))
    small = fit_levels(LLAMA, parse_levels("0.01,0.3", ["neurons", "heads"]), "uniform")[1]
    assert _sparsity(small) == "0.5,0.3"


def test_one_fraction_for_every_target_keeps_the_pairs_form():
    fix = fit_levels(LLAMA, parse_levels("0.9", ["heads"]), "uniform")[1]
    assert fix.endswith("(--sparsity heads=0.5)")


def test_prune_list_fix_runs_every_level(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OptionError, match="neurons=0.9999 asks for") as err:  # heads: 0.3 and 0.5 are one plan here
        mk.run("prune", out=tmp_path / "a", target="neurons", sparsity="0.3,0.9999", allocation="uniform", **COMMON)
    assert _sparsity(err.value.fix) == "0.3,0.99"
    run = mk.run("prune", out=tmp_path / "b", target="neurons", sparsity="0.3,0.99", allocation="uniform", **COMMON)
    assert [r["sparsity"]["neurons"] for r in run.report["results"]["rows"]] == [0.3, 0.99]


# --- F3 ----------------------------------------------------------------------------------------------------------


def test_a_repeated_key_beside_another_target_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(OptionError, match="names heads twice") as err:
        mk.run("prune", out=tmp_path / "a", target="neurons,heads", sparsity="neurons=0.3,heads=0.2,heads=0.4",
               **COMMON)
    assert "--target heads --sparsity" not in err.value.fix and "separate runs" in err.value.fix
    assert "(--sparsity neurons=0.3,heads=0.4)" in err.value.fix
    run = mk.run("prune", out=tmp_path / "b", target="neurons,heads", sparsity="neurons=0.3,heads=0.4", **COMMON)
    assert run.report["results"]["rows"][0]["sparsity"] == {"neurons": 0.3, "heads": 0.4}


def test_a_repeated_key_as_the_only_target_keeps_the_list_form(tmp_path):
    with pytest.raises(OptionError, match="names heads twice") as err:
        mk.run("prune", out=tmp_path / "a", target="heads", sparsity="heads=0.25,heads=0.5", **QUIET)
    assert err.value.fix.endswith("(--target heads --sparsity 0.25,0.5)")


def test_a_repeated_key_with_a_target_unnamed_gives_it_a_fraction(tmp_path):
    with pytest.raises(OptionError, match="names heads twice") as err:
        mk.run("prune", out=tmp_path / "a", target="neurons,heads", sparsity="heads=0.2,heads=0.6", **QUIET)
    assert "(--sparsity heads=0.6,neurons=0.6)" in err.value.fix


# --- F4 ----------------------------------------------------------------------------------------------------------


def _scores(protected):
    return Scores(mlp=np.zeros((2, 8)), heads=np.arange(8.0).reshape(2, 4), layers=np.array([0.1, 5.0]),
                  guide="induction", protected_heads=protected)


ANATOMY = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=8)
EVERY = tuple((layer, h) for layer in range(2) for h in range(4))


@pytest.mark.parametrize("target", ["heads", "layers"])
def test_drop_from_target_is_offered_only_where_other_targets_remain(target):
    protected = EVERY if target == "heads" else ((0, 1), (1, 2))
    with pytest.raises(MechkitError, match="--protect-top-k") as err:
        make_plan(_scores(protected), ANATOMY, {target: 0.5}, "global", strict=True)
    assert "--target" not in err.value.fix and err.value.fix.startswith("lower --protect-top-k")
    with pytest.raises(MechkitError, match="--protect-top-k") as err:
        make_plan(_scores(protected), ANATOMY, {target: 0.5, "neurons": 0.5}, "global", strict=True)
    assert err.value.fix.endswith(f", or drop {target} from --target")


def test_prune_induction_protecting_every_head_does_not_say_drop_heads(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MechkitError, match="--protect-top-k") as err:
        mk.run("prune", out=tmp_path / "a", target="heads", sparsity="0.5", protect_top_k=8,
               **{**COMMON, "guide": "induction"})
    assert "--target" not in err.value.fix


# --- F5 ----------------------------------------------------------------------------------------------------------


def test_an_unreachable_budget_is_not_told_to_add_targets():
    assert budget_fix(["neurons"], [{"cost_ratio": 0.62}], "flops") == (
        "raise --budget (the cheapest plan tried reached 0.62)")
    assert budget_fix(["heads", "layers"], [{"cost_ratio": 0.5}, {"cost_ratio": 0.41}], "flops") == (
        "raise --budget (the cheapest plan tried reached 0.41)")
    assert "--target" not in budget_fix(["neurons"], [{"cost_ratio": 1.1}])


def test_heads_alone_has_no_budget_mix_and_says_so_before_the_work(tmp_path, monkeypatch):
    assert unsearched(["heads"]) is not None and unsearched(["heads", "layers"]) is None
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = {k: v for k, v in COMMON.items()}
    with pytest.raises(MechkitError, match="--budget searches the mixes") as err:
        mk.run("prune", out=tmp_path / "a", target="heads", budget=0.2, budget_unit="flops", **common)
    assert err.value.fix.startswith("pass --sparsity instead of --budget")
    assert "raise --budget" not in err.value.fix


def test_heads_alone_under_a_budget_is_refused_from_the_options_before_the_model_loads():
    from mechkit import registry
    from mechkit.options.resolve import resolve_options

    with pytest.raises(OptionError, match="no plan would be searched"):
        resolve_options(registry.get("prune"), {"target": "heads", "budget": 0.5})
    resolve_options(registry.get("prune"), {"target": "heads,layers", "budget": 0.5})  # layers: a mix to search
