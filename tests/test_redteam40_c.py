"""Session fixes beside pass 40: an integral float in a whole-number list option (``sweep=[5.0]``, ``layers=[10.0]``)
is its integer, as a whole-number option takes ``n=5.0``; before, it was refused as "'5.0' is not a whole number"."""

from __future__ import annotations

import numpy as np
import pytest

from mechkit.options import Option, OptionError
from mechkit.options.parsers import IntRanges, NumberList, OrAuto


@pytest.mark.parametrize("value, text, parsed", [
    ([5.0, 10], "5,10", (5, 10)),
    (5.0, "5", (5,)),
    (np.array([5.0, 2.0]), "5,2", (2, 5)),
    ((np.float32(3.0),), "3", (3,)),
])
def test_integral_floats_in_a_whole_number_list_are_their_integers(value, text, parsed):
    option = Option("sweep", str, None, parse=NumberList(int, min=1, sort=True))
    assert option.check(value) == (text, parsed)


def test_or_auto_and_layer_ranges_take_integral_floats_too():
    assert Option("k", str, "auto", parse=OrAuto(NumberList(int, min=1))).check([4.0]) == ("4", (4,))
    text, ranges = Option("layers", str, "all", parse=IntRanges()).check([10.0, 2.0])
    assert text == "10,2" and ranges.values == (2, 10)


@pytest.mark.parametrize("value", [[5.5], [1e300 * 10], 2.5])
def test_a_fraction_is_still_refused_in_one_line(value):
    with pytest.raises(OptionError, match="not a whole number|not a finite|too large"):
        Option("sweep", str, None, parse=NumberList(int, min=1)).check(value)


def test_a_float_list_keeps_its_floats():
    assert Option("alphas", str, None, parse=NumberList(float)).check([5.0, 0.5]) == ("5.0,0.5", (5.0, 0.5))


# --- a sliding window below 1 token, refused before the load (a raw tensor-size error at the first long forward) --


def _saved_with(tmp_path, family, **edits):
    import json

    import mechkit as mk

    m = mk.load_model(f"tiny:{family}")
    path = tmp_path / family
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config.update(edits)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("family, window", [("mistral", -5), ("mistral", 0), ("gemma2", 0), ("gemma2", -3),
                                            ("gemma2", None)])
def test_a_sliding_window_below_one_token_is_refused_before_the_load_and_its_fix_works(tmp_path, family, window):
    import torch

    import mechkit as mk
    from mechkit.errors import ModelLoadError

    path = _saved_with(tmp_path, family, sliding_window=window)
    with pytest.raises(ModelLoadError, match="sliding_window .* at least 1 token") as err:
        mk.load_model(str(path))
    assert 'set "sliding_window" in config.json to the window the model was made with' in err.value.fix
    assert ("or to null for none" in err.value.fix) == (family == "mistral")  # gemma2's sliding layers need one
    for fixed in (None, 4096) if family == "mistral" else (4096,):  # each way the fix gives, applied literally
        path = _saved_with(tmp_path, family, sliding_window=fixed)
        m = mk.load_model(str(path))
        assert torch.isfinite(m(torch.tensor([list(range(3, 60))]))).all()


def test_a_window_the_config_turns_off_is_left_as_it_is(tmp_path):
    import mechkit as mk

    path = _saved_with(tmp_path, "qwen2", sliding_window=0, use_sliding_window=False)
    assert mk.load_model(str(path)).model.config.sliding_window is None
