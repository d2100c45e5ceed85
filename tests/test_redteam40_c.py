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
