"""Red-team pass 39 (b), config part: a RoPE scaling ``factor`` of 0 or less was computed on without a word,
and a bad ``rope_parameters.rope_theta`` was told to set a top-level ``rope_theta`` (which changed nothing)."""

from __future__ import annotations

import json

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import tiny_model_dir


def _with_rope(tmp_path, **rope):
    folder = tiny_model_dir(tmp_path / "m", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**(config.get("rope_parameters") or {}), **rope}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 0}, {"rope_type": "linear", "factor": -3.0},
                                  {"rope_type": "dynamic", "factor": -1}, {"rope_type": "linear", "factor": "x"}])
def test_a_rope_scaling_factor_of_zero_or_less_is_refused_naming_it(tmp_path, rope):
    with pytest.raises(MechkitError, match=r'rope_parameters.factor .* set "rope_parameters.factor" in config.json'):
        mk.load_model(str(_with_rope(tmp_path, **rope)))


def test_a_bad_rope_theta_inside_rope_parameters_is_told_that_field(tmp_path):
    folder = _with_rope(tmp_path, rope_theta=True)
    with pytest.raises(MechkitError, match=r'set "rope_parameters.rope_theta" in config.json'):
        mk.load_model(str(folder))


def test_a_sound_rope_scaling_factor_loads(tmp_path):
    assert mk.load_model(str(_with_rope(tmp_path, rope_type="linear", factor=2.0))) is not None
