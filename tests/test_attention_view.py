"""The attention viewer and the reports' interactive grids, without a browser (tests/test_browser.py opens them).

- the pattern encoding round-trips within its stated error, keeps each query's top source exactly, and
  stores T(T+1)/2 bytes per head;
- ``mk.show_attention`` records the heads a spec names, the same patterns a plain recording gives;
- ``mechkit attention`` refuses bad input in one line before the model loads, and writes its report;
- every layer × head heatmap puts its grid in the report (``views``); detect's carry patterns once;
- the embedded model's detect page stays under 2 MB, estimated from the tiny model's page and the exact
  size of 270 heads' patterns on 51 tokens.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.model.headspec import Head, parse_heads
from mechkit.report.patterns import MAX_ERROR, Patterns, record_patterns

# What would make a page fetch something: a URL in src/href, a CSS url() or @import.
OFFSITE = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", re.I)


def _softmax_patterns(n: int, T: int, seed: int, sharp: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, T, T)) * sharp
    logits[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


@pytest.mark.parametrize(("n", "T", "sharp"), [(1, 1, 1.0), (3, 7, 0.1), (5, 51, 3.0), (2, 130, 8.0)])
def test_encoding_round_trips_within_its_error(n, T, sharp):
    values = _softmax_patterns(n, T, seed=T, sharp=sharp)
    heads = [Head(i // 4, i % 4) for i in range(n)]
    enc = Patterns([f"t{i}" for i in range(T)], heads, values).to_json()
    assert len(base64.b64decode(enc["data"])) == n * T * (T + 1) // 2  # the lower triangle, one byte each
    assert len(base64.b64decode(enc["row_max"])) == 2 * n * T
    back = Patterns.from_json(json.loads(json.dumps(enc)))
    assert back.heads == heads and back.tokens == enc["tokens"]
    assert np.abs(back.values - values).max() <= MAX_ERROR
    assert (np.triu(back.values, 1) == 0).all()
    for h in heads:  # the top source of every query survives quantization exactly (its byte is 255)
        assert back.top_sources(h) == [int(i) for i in values[heads.index(h)].argmax(axis=1)]


def test_encoding_refuses_a_shape_that_does_not_match():
    with pytest.raises(mk.MechkitError, match="patterns of shape"):
        Patterns(["a", "b"], [Head(0, 0)], np.zeros((2, 2, 2))).to_json()
    with pytest.raises(mk.MechkitError, match="encoded as"):
        Patterns.from_json({"encoding": "other"})


def test_stripe_counts_the_token_after_the_earlier_occurrence():
    # "a b a b": query 2 (a) should attend to 1 (b, after the first a); query 3 (b) to 2 (a, after the first b)
    values = np.zeros((1, 4, 4))
    values[0, :, 0] = 1.0
    values[0, 2] = [0, 1, 0, 0]
    p = Patterns(list("abab"), [Head(0, 0)], values)
    assert p.stripe(Head(0, 0)) == (1, 2)  # query 3 attends to the first token, not to 2


def test_show_attention_records_the_heads_the_spec_names(tiny_llama):
    view = mk.show_attention(tiny_llama, "abcabcab", heads="1.2,layer:0")
    assert view.patterns.heads == parse_heads("1.2,layer:0", 2, 4)
    assert view.patterns.tokens == tiny_llama.to_str_tokens("abcabcab")
    with mk.record(tiny_llama, "blocks.*.attn.hook_pattern") as cache, torch.no_grad():
        tiny_llama(tiny_llama.to_tokens("abcabcab"))
    for h in view.patterns.heads:
        expected = cache[f"blocks.{h.layer}.attn.hook_pattern"][0, h.head].numpy()
        assert np.allclose(view.patterns.of(h), expected, atol=1e-6)
    scores = {"induction": [[0.0, 0.9, 0.1, 0.0], [0.5, 0.0, 0.0, 0.8]]}
    ranked = mk.show_attention(tiny_llama, "abab", heads="induction", top_k=2, scores=scores)
    assert ranked.patterns.heads == [Head(0, 1), Head(1, 3)]
    assert len(mk.show_attention(tiny_llama, "ab").patterns.heads) == 8  # default: every head
    with pytest.raises(mk.MechkitError, match="out of range"):
        mk.show_attention(tiny_llama, "ab", heads="5.0")
    with pytest.raises(mk.MechkitError, match="non-empty prompt"):
        mk.show_attention(tiny_llama, "")


def test_show_attention_renders_inline_and_saves_one_offline_page(tiny_llama, tmp_path):
    view = mk.show_attention(tiny_llama, "abcabc", heads="0.1,1.2")
    fragment = view._repr_html_()
    assert fragment.count('class="mk-view') == 1 and fragment.count("<script>") == 1
    page = view.save(tmp_path / "a.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and fragment in page
    assert not OFFSITE.search(page) and not re.search(r"https?://", page)  # nothing to fetch, not even a URL
    assert OFFSITE.search('<script src="https://cdn.example/v.js">') and OFFSITE.search("@import url(x.css)")
    spec = json.loads(page.split('<script type="application/json">', 1)[1].split("</script>", 1)[0])
    assert spec["pick"] == "0.1" and spec["text"] is True
    assert np.abs(Patterns.from_json(spec["patterns"]).values - view.patterns.values).max() <= MAX_ERROR


@pytest.mark.parametrize(("args", "says"), [
    (["--heads", "a.b"], "malformed head spec 'a.b'"),
    (["--prompt", "  "], "the prompt is empty"),
    (["--top-k", "0"], "--top-k 0 is below 1"),
])
def test_bad_input_is_one_line_before_the_model_loads(args, says, tmp_path, capsys, monkeypatch):
    from mechkit.cli.main import main
    from mechkit.model import loading

    def no_load(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)
    with pytest.raises(SystemExit) as exit_info:
        main(["attention", "--model", "tiny:llama", *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "run").exists()


def test_attention_plugin_writes_its_report(tiny_llama, tmp_path):
    run = mk.run("attention", model=tiny_llama, out=tmp_path / "run", prompt="abcdabcd", heads="0.1,1.3")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".mechkit-files", "attention.png", "report.html",
                                                                   "report.json"]
    heads = run.results["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(0, 1), (1, 3)]
    assert all(h["stripe_repeats"] == 4 for h in heads)  # a b c d repeat once: 4 tokens seen before
    grid = run.report["views"]["grids"]["attention.png"]
    assert grid["text"] is True and grid["highlight"] == [[0, 1], [1, 3]]
    stored = Patterns.from_json(run.report["views"]["patterns"][grid["patterns"]])
    assert stored.tokens == tiny_llama.to_str_tokens("abcdabcd")
    page = (tmp_path / "run" / "report.html").read_text()
    assert page.count('class="mk-view') == 1 and page.count('<script type="application/json" data-mk-patterns=') == 1
    assert not OFFSITE.search(page)


def test_detect_grids_share_one_set_of_patterns(tiny_llama):
    run = mk.run("detect", model=tiny_llama, write=False, n_seqs=2, seg_len=6, top_k=2)
    views = run.report["views"]
    assert set(views["grids"]) == {"induction_scores.png", "previous-token_scores.png",
                                   "duplicate-token_scores.png", "ov_copying.png"}
    assert list(views["patterns"]) == ["p0"]
    assert [views["grids"][f"{k}_scores.png"]["patterns"] for k in ("induction", "previous-token")] == ["p0", "p0"]
    assert "patterns" not in views["grids"]["ov_copying.png"]
    assert views["grids"]["induction_scores.png"]["values"] == run.results["scores"]["induction"]
    p = Patterns.from_json(views["patterns"]["p0"])
    first = _first_sequence(tiny_llama, 6)  # every head on the first detection sequence
    assert len(p.heads) == 8 and len(p.tokens) == first.shape[1]
    assert np.abs(record_patterns(tiny_llama, first, p.heads).values - p.values).max() <= MAX_ERROR
    assert 'class="mk-view' in run._repr_html_()  # the notebook view draws the grids too


def _first_sequence(handle, seg_len: int):
    from mechkit.heads.scores import repeated_tokens

    return repeated_tokens(handle, 1, seg_len, 0)


def test_prune_grid_shows_the_kept_heads(tiny_llama):
    run = mk.run("prune", model=tiny_llama, write=False, guide="random", target="heads", sparsity="0.25",
                 tasks="capitalize", n=2, calib=2, shots=1, repeats=1, timing_batch=1, reconstruct="none")
    grid = run.report["views"]["grids"]["kept_heads_random.png"]
    removed = {(int(layer), h) for layer, hs in run.results["rows"][-1]["plan"]["heads"].items() for h in hs}
    assert removed and sum(v == 0 for row in grid["values"] for v in row) == len(removed)
    assert all((grid["values"][layer][h] == 0) == ((layer, h) in removed) for layer in range(2) for h in range(4))


def test_the_embedded_detect_page_stays_under_2_mb(tiny_llama):
    """The full page is the tiny model's page with the tiny patterns swapped for 270 heads' on 51 tokens and
    its PNGs for heatmaps the size of a 30 × 9 grid (measured on the embedded model: 0.80 MB)."""
    from mechkit.report import head_heatmap
    from mechkit.report.html import render_html
    from mechkit.report.writer import figure_png

    run = mk.run("detect", model=tiny_llama, write=False, n_seqs=2, seg_len=25, top_k=10)
    images = {n: figure_png(f) for n, f in run.figures.items()}
    tiny_page = len(render_html(run.report, images).encode())
    tiny_blob = len(json.dumps(run.report["views"]["patterns"]["p0"]))
    full = Patterns([f"tok{i:03}" for i in range(51)], [Head(i // 9, i % 9) for i in range(270)],
                    _softmax_patterns(270, 51, seed=0))
    full_blob = len(json.dumps(full.to_json()))
    rng = np.random.default_rng(0)
    big_png = len(figure_png(head_heatmap(rng.random((30, 9)), "score", highlight=[(17, 3)])))
    tiny_pngs = sum(len(v) for n, v in images.items() if n != "loss_per_position.png")
    grids = 4 * 270 * 22  # each value as JSON text, generously
    estimate = tiny_page - tiny_blob + full_blob + 4 * 4 / 3 * big_png - tiny_pngs + grids
    assert full_blob < 560_000
    assert estimate < 2_000_000, f"estimated {estimate / 1e6:.2f} MB"


@pytest.mark.parametrize(("backend", "remote"), [("nnsight", None), ("nnsight", "local")])
def test_patterns_are_the_same_on_every_backend(backend, remote, tiny_llama):
    pytest.importorskip("nnsight", reason="nnsight is the interop extra: pip install 'mechkit[interop]'")
    there = mk.load_model("tiny:llama", device="cpu", backend=backend, remote=remote)
    heads = [Head(0, 1), Head(1, 3)]
    got = mk.show_attention(there, "abcdabcd", heads=heads).patterns.values
    want = mk.show_attention(tiny_llama, "abcdabcd", heads=heads).patterns.values
    assert np.allclose(got, want, atol=1e-5)
