"""Red-team pass 50, fixed.

F1 (data loss): a set with more entries than a journal held (about 2,000 long names) had its journal written
without them, and its roll-back then deleted what the killed write moved in, a user's file put inside with it.
A journal now holds 16 MiB, and a set too large even for that is marked so: its roll-back deletes nothing it
moved in, and says what to move aside. (b) F1 (silently wrong): a model with one head (or MLP channel) per layer
pruned nothing at a fraction that rounds to one. F2/F3 (wrong fix): a target left out of --sparsity got 0.2, which
removes no layer of a 2-layer model; the fix for one target of a bare fraction dropped the others. (Not a failure:
icl-vectors --load-vector with --layers measures the loaded vector's test curve at those layers.) F5 (silently wrong): --protect-top-k only raised the protected
heads' scores, and a level past the others removed them.
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

import mechkit as mk
import mechkit.io.journal as journal
from mechkit.errors import MechkitError
from mechkit.io.journal import TOO_MANY, journal_path, journal_text, recover
from mechkit.pruning.guides import Scores
from mechkit.pruning.select import make_plan, removes_nothing
from tests.killed_write import killed_write


def test_a_set_too_large_to_list_is_marked_so(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    for i in range(20):
        (tmp_path / "model" / f"{'x' * 50}{i}.txt").write_text("n")
    assert json.loads(journal_text(tmp_path, ["model"], []))["entries"]["model"] == ["folder"]
    monkeypatch.setattr(journal, "JOURNAL_LIMIT", 1000)
    assert json.loads(journal_text(tmp_path, ["model"], []))["entries"] == TOO_MANY


def test_a_roll_back_of_a_set_too_large_to_list_deletes_nothing_it_moved_in(tmp_path):
    out = killed_write(tmp_path, "after-model")
    record = json.loads(journal_path(out).read_text())
    journal_path(out).write_text(json.dumps({**record, "entries": TOO_MANY}))  # as a 20,000-file set's is
    (out / "model" / "my_notes.txt").write_text("precious")
    with pytest.raises(MechkitError, match="too many for its journal to list") as err:
        recover(out)
    assert (out / "model" / "my_notes.txt").read_text() == "precious"
    assert err.value.fix == f"move those out of {out} (keep what is yours), then rerun"
    (tmp_path / "aside").mkdir()
    for name in ("model", "a.txt"):  # the fix, as said
        (out / name).rename(tmp_path / "aside" / name)
    assert recover(out) and (out / "a.txt").read_text() == "1" and (out / "model" / "config.json").read_text() == "{}"


# --- pass 50 (b) -------------------------------------------------------------------------------------------------


def _prune(tmp_path, name, **options):
    return mk.run("prune", guide="magnitude", tasks="capitalize", n=2, calib=2, repeats=1, out=tmp_path / name,
                  console=Console(file=io.StringIO()), **options)


@pytest.mark.parametrize(("shape", "target"), [({"n_heads": 1, "d_mlp": 64}, "heads"), ({"n_heads": 4, "d_mlp": 1},
                                                                                       "neurons")])
@pytest.mark.parametrize("allocation", ["uniform", "global"])
def test_one_unit_per_layer_is_refused_whatever_the_fraction(shape, target, allocation):
    a = SimpleNamespace(n_layers=2, n_kv_heads=shape["n_heads"], n_groups=1, **shape)
    for fraction in (0.3, 0.6, 0.9):
        found = removes_nothing(a, {target: fraction}, allocation)  # the only target: dropping it leaves none
        other = "neurons" if target == "heads" else "heads" if a.n_heads > 1 else "layers"
        assert found is not None and found[1] == f"prune what this model can lose instead: --target {other}", found
        assert removes_nothing(a, {target: fraction, "layers": 0.5}, allocation)[1] == f"drop {target} from --target"


def test_the_fix_for_one_target_of_a_bare_fraction_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MechkitError) as err:
        _prune(tmp_path, "o", model="tiny:llama", target="neurons,heads,layers", sparsity="0.1")
    assert err.value.fix == "raise heads and layers (--sparsity neurons=0.1,heads=0.25,layers=0.5)", err.value.fix
    run = _prune(tmp_path, "fixed", model="tiny:llama", target="neurons,heads,layers",
                 sparsity="neurons=0.1,heads=0.25,layers=0.5")  # the fix, as said
    assert run.report["results"]["rows"][0]["plan"]["counts"]["layers"] == 1


def test_a_target_left_out_gets_a_fraction_that_removes_some_on_this_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MechkitError, match="gives it no fraction") as err:
        _prune(tmp_path, "o", model="tiny:llama", target="neurons,layers", sparsity="neurons=0.1")
    assert "--sparsity neurons=0.1,layers=0.5" in err.value.fix
    assert _prune(tmp_path, "fixed", model="tiny:llama", target="neurons,layers", sparsity="neurons=0.1,layers=0.5")


def test_protected_heads_are_never_removed_and_a_level_they_block_is_refused():
    anatomy = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=8)
    protected = ((0, 0), (0, 2), (1, 2), (1, 3))
    scores = Scores(mlp=np.zeros((2, 8)), heads=np.arange(8.0).reshape(2, 4)[::-1].copy(), layers=np.zeros(2),
                    guide="induction", protected_heads=protected)
    plan = make_plan(scores, anatomy, {"heads": 0.25}, "global")
    assert not {(layer, h) for layer, hs in plan.heads.items() for h in hs} & set(protected)
    with pytest.raises(MechkitError, match="with the 4 that --protect-top-k keeps only 3 can go"):
        make_plan(scores, anatomy, {"heads": 0.75}, "global", strict=True)
    loose = make_plan(scores, anatomy, {"heads": 0.75}, "global")  # the budget search: what it can remove
    assert sum(map(len, loose.heads.values())) == 3
