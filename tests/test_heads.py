"""The one head-spec parser: grammar, ranges, score-ranked and random specs."""

from __future__ import annotations

import pytest

from mechkit.errors import HeadSpecError
from mechkit.model.headspec import Head, parse_heads, random_heads, top_heads


def test_explicit_and_layer_specs():
    assert parse_heads("1.2, 0.0", 2, 3) == [Head(0, 0), Head(1, 2)]
    assert parse_heads("layer:1", 2, 3) == [Head(1, 0), Head(1, 1), Head(1, 2)]
    assert parse_heads("1.2,1.2", 2, 3) == [Head(1, 2)]
    assert parse_heads([(0, 1)], 2, 3) == [Head(0, 1)]


@pytest.mark.parametrize("spec, needle", [
    ("17-3", "malformed head spec '17-3'"),
    ("", "empty head spec"),
    ("2.0", "out of range"),
    ("0.3", "out of range"),
    ("layer:9", "out of range"),
    ("induction", "needs induction scores"),
])
def test_bad_specs(spec, needle):
    with pytest.raises(HeadSpecError) as err:
        parse_heads(spec, 2, 3)
    assert needle in str(err.value) and "—" in str(err.value)


def test_score_ranked_spec():
    scores = {"induction": [[0.1, 0.9, 0.2], [0.8, 0.0, 0.5]]}
    assert parse_heads("induction", 2, 3, scores=scores, top_k=2) == [Head(0, 1), Head(1, 0)]
    assert top_heads(scores["induction"], 3) == [Head(0, 1), Head(1, 0), Head(1, 2)]


def test_random_heads_seeded_and_excluding():
    excluded = [Head(0, 0), Head(0, 1)]
    a = random_heads(2, 3, 4, seed=7, exclude=excluded)
    assert a == random_heads(2, 3, 4, seed=7, exclude=excluded)
    assert len(set(a)) == 4 and not set(a) & set(excluded)
    assert parse_heads("random", 2, 3, top_k=3, seed=1) == random_heads(2, 3, 3, seed=1)
    with pytest.raises(HeadSpecError):
        random_heads(2, 3, 5, exclude=excluded)
