"""Red-team pass 51, fixed.

F1 (data loss): an ``--out`` with ``..`` after a name that is no folder (``U/nosuch/../data``) passed every check
(the system stops at ``nosuch``, so each found nothing there), and the write, which resolves the path as text,
replaced ``U/data``'s report or the user's own files without ``--force`` (CLI, ``mk.run``, and a run started while
another wrote that place). It is refused in one line naming the place meant. F2 (data loss, minor): a blank or
padded number under a lock's name was taken for a lock mechkit made and removed. (b) F1 (wrong fix): with every
head protected, a refused level said "lower --sparsity heads", which never helps. F2 (silently wrong): a layer
holding protected heads was removed whole (the budget search chose a layers mix with every head protected).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.locks import is_lock_text


def _inspect(out, **options):
    return mk.run("inspect", model="tiny:gpt2", seq_len=8, repeats=1, out=out, console=Console(file=io.StringIO()),
                  **options)


@pytest.mark.parametrize("held", ["report", "users"])
def test_dot_dot_after_a_missing_folder_is_refused_and_nothing_is_replaced(tmp_path, monkeypatch, held):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    if held == "report":
        _inspect(data)
    else:
        data.mkdir()
        (data / "report.html").write_text("precious")
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(MechkitError, match="goes back \\(..\\) out of .*nosuch, which is no folder") as err:
        _inspect(tmp_path / "nosuch" / ".." / "data")
    assert err.value.fix == f"name the place without the .. (--out {data})"
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before and not (tmp_path / "nosuch").exists()


def test_dot_dot_after_a_real_folder_still_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "sub").mkdir()
    assert _inspect(tmp_path / "sub" / ".." / "fresh").report and (tmp_path / "fresh" / "report.json").exists()


def test_only_what_mechkit_writes_is_a_lock():
    assert is_lock_text(b"") and is_lock_text(b"4242\n") and is_lock_text(b"4242")
    assert not any(is_lock_text(t) for t in (b"\n", b"  7 \n", b" 7", b"my notes", b"7\n8\n"))


# --- pass 51 (b) -------------------------------------------------------------------------------------------------


def _scores(protected):
    import numpy as np

    from mechkit.pruning.guides import Scores

    return Scores(mlp=np.zeros((2, 8)), heads=np.arange(8.0).reshape(2, 4), layers=np.array([0.1, 5.0]),
                  guide="induction", protected_heads=protected)


ANATOMY = dict(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=8)


def test_a_layer_holding_a_protected_head_is_never_removed_and_a_level_it_blocks_is_refused():
    from types import SimpleNamespace

    from mechkit.pruning.select import make_plan

    anatomy = SimpleNamespace(**ANATOMY)
    assert make_plan(_scores(((0, 1),)), anatomy, {"layers": 0.5}).layers == [1]  # the next least important
    assert make_plan(_scores(((1, 1),)), anatomy, {"layers": 0.5}).layers == [0]
    with pytest.raises(MechkitError, match="only 0 hold none of the 2 heads --protect-top-k keeps") as err:
        make_plan(_scores(((0, 1), (1, 2))), anatomy, {"layers": 0.5}, strict=True)
    assert err.value.fix == ("lower --protect-top-k (it keeps all the layers that could go; --protect-top-k 0 keeps "
                             "none)")  # layers is the only target: dropping it would leave --target empty


def test_when_protection_leaves_no_head_the_fix_never_says_lower_the_sparsity():
    from types import SimpleNamespace

    from mechkit.pruning.select import make_plan

    every = tuple((layer, h) for layer in range(2) for h in range(4))
    with pytest.raises(MechkitError, match="only 0 can go") as err:
        make_plan(_scores(every), SimpleNamespace(**ANATOMY), {"heads": 0.1}, "global", strict=True)
    assert err.value.fix.startswith("lower --protect-top-k") and "--sparsity" not in err.value.fix
