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
