"""A ``--heads`` spec is read once per run: the typed selection it becomes is what every later step uses."""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit.errors import HeadSpecError
from mechkit.model import headspec as heads_module
from mechkit.model.headspec import Head, HeadSelection, parse_spec


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Every time the grammar reads a spec's text (the memo bypassed, so a repeat would count)."""
    seen: list[str] = []
    original = heads_module._parse_text.__wrapped__

    def counting(spec: str) -> HeadSelection:
        seen.append(spec)
        return original(spec)

    monkeypatch.setattr(heads_module, "_parse_text", counting)
    return seen


def test_the_selection_says_what_it_names_whether_it_needs_scores_and_how_k_applies():
    explicit, ranked, drawn = parse_spec("1.2,layer:0"), parse_spec("induction"), parse_spec("random")
    assert (explicit.needs_scores, explicit.ranked) == (False, False)
    assert (ranked.needs_scores, ranked.ranked) == (True, True)
    assert (drawn.needs_scores, drawn.ranked) == (False, True)
    assert explicit.ks(2, 3, sweep=(5, 10), top_k=4) == [4]  # what it names: 3 heads of layer 0 and 1.2
    assert ranked.ks(2, 3, sweep=(1, 2), top_k=4) == [1, 2] and ranked.ks(2, 3, None, top_k=4) == [4]
    assert explicit.resolve(2, 3) == [Head(0, 0), Head(0, 1), Head(0, 2), Head(1, 2)]
    with pytest.raises(HeadSpecError, match="cannot draw 7 random heads"):
        drawn.ks(2, 3, sweep=(7,), top_k=1)


def test_an_ablate_run_parses_its_head_spec_once(parses):
    run = mk.run("ablate", model="tiny:llama", write=False, heads="random", sweep="1,2", baseline_seeds=2,
                 mode="mean", tasks="swap", n=2, shots=1)
    assert parses == ["random"]  # one parse, then resolved for two ks, four draws and the interventions
    assert [c["k"] for c in run.results["conditions"] if c["name"] == "target"] == [1, 2]


def test_a_shuffle_run_parses_its_head_spec_once(parses):
    mk.run("shuffle", model="tiny:llama", write=False, heads="layer:1", seeds=1, tasks="", n_seqs=2, seg_len=4)
    assert parses == ["layer:1"]
