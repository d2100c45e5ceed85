"""The fresh red-team pass of issue 32 on what came after the last one: the ``attention`` and reworked
``patch`` plugins and the report's ``views`` key. Each test holds one class of failure it found, with
several instances: a crafted ``views`` that raised while rendering, ``patch`` values that crashed or were
refused after the model loaded with a fix naming the wrong option, and a default that failed on the tiny
models."""

from __future__ import annotations

import json

import pytest

import mechkit as mk
from mechkit.report import build_report, render_html
from mechkit.report.views import MAX_CELLS, sane
from tests.test_reliability import _cli, _fix_names_real_options

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
GRID = {"title": "t", "label": "score", "values": [[0.5, None], [0.25, 1.0]], "highlight": [[1, 1]], "patterns": "p0"}
CRAFTED = {  # a report.json's views as a hostile or damaged file may hold them
    "views a list": [1, 2],
    "views a string": "x",
    "grids a list": {"grids": [GRID]},
    "a grid a string": {"grids": {"a.png": "x"}},
    "values a string": {"grids": {"a.png": {**GRID, "values": "abc"}}},
    "rows mixing text and numbers": {"grids": {"a.png": {**GRID, "values": [[1, "a", None], 5]}}},
    "patterns a list": {"grids": {"a.png": GRID}, "patterns": [1]},
    "patterns key a number": {"grids": {"a.png": {**GRID, "patterns": 7}}, "patterns": {"p0": {}}},
    "highlight junk": {"grids": {"a.png": {**GRID, "highlight": [[1], "x", [1, "b"]]}}},
    "a grid too large": {"grids": {"a.png": {**GRID, "values": [[0.0] * 1000] * (MAX_CELLS // 1000 + 1)}}},
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_views_key_renders_the_page_without_raising(case):
    report = {**build_report(plugin="probe", plugin_version="1", model={"name": "m"}, params={}, seed=0,
                             results={"x": 1}, artifacts=["a.png"], timings={}),
              "views": json.loads(json.dumps(CRAFTED[case]))}
    page = render_html(report, {"a.png": PNG})
    kept = sane(report["views"])
    assert page.count('<script type="application/json" data-mk-patterns=') == len(kept["patterns"] if kept else [])
    if kept:  # what survives is only the well-formed part: numbers or blanks, int pairs, a known patterns key
        grid = kept["grids"]["a.png"]
        assert all(v is None or isinstance(v, float) for row in grid["values"] for v in row)
        assert all(isinstance(a, int) and isinstance(b, int) for a, b in grid["highlight"])
        assert grid.get("patterns") in (None, *kept["patterns"])
    else:
        assert 'class="mk-view' not in page


def test_a_well_formed_views_key_is_kept_whole():
    views = {"grids": {"a.png": GRID}, "patterns": {"p0": {"tokens": ["a"]}}}
    assert sane(views) == {"grids": {"a.png": {**{k: v for k, v in GRID.items()}, "values": [[0.5, None], [0.25, 1.0]]}},
                           "patterns": {"p0": {"tokens": ["a"]}}}


PATCH_BAD = {  # refused in one line, exit 2, before the model loads, nothing written, the fix's options real
    "empty clean": ("--clean", "", "--corrupted", "ab", "--answers", "a,b"),
    "blank corrupted": ("--clean", "ab", "--corrupted", "   ", "--answers", "a,b"),
    "--pair with --clean": ("--clean", "ab", "--corrupted", "ac", "--answers", "a,b", "--pair", "3"),
    "--pairs with --clean": ("--clean", "ab", "--corrupted", "ac", "--answers", "a,b", "--pairs", "4"),
    "--pair beyond any task": ("--pair", "100000"),
}


@pytest.mark.parametrize("case", PATCH_BAD)
def test_bad_patch_values_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys, case):
    from mechkit.model import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr("mechkit.model.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    argv = ("patch", "--model", "tiny:llama", *PATCH_BAD[case], "--out", str(tmp_path / "r"))
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and " — " in err[0], err
    assert "--n " not in err[0] and "n=" not in err[0]  # names the option the user gave, not an inner one
    _fix_names_real_options(argv, err[0])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("model", "options"), [("tiny:llama", {"pairs": 2}), ("tiny:gpt2", {"method": "both"})])
def test_patch_on_its_default_task_runs_on_the_tiny_models(tmp_path, model, options):
    """IOI names are several tokens to a byte-level tokenizer: compared at their first differing token, as
    ICL answers are, the default task gives pairs there too (it gave none, and the fix named --shots)."""
    from plugins.patch import PatchPlugin

    run = mk.run(PatchPlugin, model=model, out=tmp_path / "p", **options)
    results = run.report["results"]
    assert results["n_pairs"] == options.get("pairs", 1) and results["clean"] != results["corrupted"]
    assert all(p["first_token"] and not p["shuffled_labels"] for p in results["pairs"])


SHOW_BAD = {  # mk.show_attention misuse: a MechkitError naming the fix, never a raw exception or a silent view
    "blank text": {"text": "   "},
    "top_k text": {"heads": "random", "top_k": "3"},
    "top_k zero": {"heads": "random", "top_k": 0},
    "no heads": {"heads": []},
    "scores of another shape": {"heads": "induction", "scores": {"induction": [[1.0]]}},
    "scores not numbers": {"heads": "induction", "scores": {"induction": [["a"] * 4] * 2}},
}


@pytest.mark.parametrize("case", SHOW_BAD)
def test_show_attention_misuse_is_a_mechkit_error(llama, case):
    from mechkit.errors import MechkitError

    kwargs = {"text": "abcabc", **SHOW_BAD[case]}
    with pytest.raises(MechkitError) as err:
        mk.show_attention(llama, kwargs.pop("text"), **kwargs)
    assert " — " in str(err.value)  # the problem, then the fix


def test_scores_of_the_right_shape_still_rank_heads(llama):
    import numpy as np

    grid = np.zeros((2, 4))
    grid[1, 2] = 1.0
    view = mk.show_attention(llama, "abcabc", heads="induction", top_k=1, scores={"induction": grid})
    assert [(h.layer, h.head) for h in view.patterns.heads] == [(1, 2)]


@pytest.mark.parametrize("where", ["a directory", "a missing folder", "not a path", "empty"])
def test_a_save_to_a_place_no_file_can_go_is_one_line_and_leaves_nothing(llama, tmp_path, where):
    from mechkit.errors import MechkitError
    from mechkit.io import write_atomic

    target = {"a directory": tmp_path, "a missing folder": tmp_path / "no" / "a.html", "not a path": 5,
              "empty": ""}[where]
    view = mk.show_attention(llama, "abc", heads="0.0")
    for save in (view.save, lambda p: write_atomic(p, "x")):
        with pytest.raises(MechkitError) as err:
            save(target)
        assert " — " in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [("attention", "--heads", "0.0"), ("patch",),
                                  ("ablate", "--top-k", "2", "--tasks", "capitalize")])
def test_a_model_without_a_tokenizer_is_one_line_naming_the_fix_that_works(tmp_path, capsys, argv):
    """A model directory without tokenizer files loads (analyses on token ids need none); one that reads
    text said ``'NoneType' object is not callable``. Now one line, and following its fix runs."""
    from mechkit.model.sources.tiny import byte_tokenizer
    from tests.test_reliability import _model_dir

    d = _model_dir(tmp_path / "m")
    for f in d.glob("*token*"):
        f.unlink()
    code, err = _cli(capsys, argv[0], "--model", str(d), *argv[1:], "--out", str(tmp_path / "r"))
    assert code == 2 and len(err) == 1 and "has no tokenizer" in err[0] and "save_pretrained" in err[0], err
    assert not (tmp_path / "r").exists()
    if argv[0] == "attention":  # the fix, followed
        byte_tokenizer().save_pretrained(d)
        code, err = _cli(capsys, argv[0], "--model", str(d), *argv[1:], "--out", str(tmp_path / "r"))
        assert code == 0 and (tmp_path / "r" / "report.json").is_file(), err


SMALL = ("--tasks", "capitalize", "--n", "4", "--shots", "2", "--n-seqs", "2", "--seg-len", "5")


@pytest.mark.parametrize(("plugin", "fixes"), [("ablate", [("--top-k", "4", "--baseline-seeds", "1"),
                                                           ("--baseline", "none")]),
                                               ("shuffle", [("--top-k", "4", "--seeds", "1")])])
def test_a_k_leaving_no_random_baseline_is_refused_before_scores_and_the_fixes_work(tmp_path, monkeypatch, capsys,
                                                                                    plugin, fixes):
    """On tiny:llama (8 heads) k=10 names every head: the random baseline failed only after the head scores,
    saying "lower --top-k" without how far. Now refused first; each fix it names runs. (The default k is now
    at most half the model's heads, so the defaults run: the next test.)"""
    import mechkit.heads.scores as hs

    real = hs.compute_scores
    monkeypatch.setattr(hs, "compute_scores", lambda *a, **k: pytest.fail("scores computed before the refusal"))
    code, err = _cli(capsys, plugin, "--model", "tiny:llama", *SMALL, "--top-k", "10", "--out", str(tmp_path / "r"))
    assert code == 2 and len(err) == 1 and "random baseline" in err[0], err
    _fix_names_real_options((plugin,), err[0])
    monkeypatch.setattr(hs, "compute_scores", real)
    for i, fix in enumerate(fixes):
        assert all(word in err[0] for word in fix[:2])
        code, out = _cli(capsys, plugin, "--model", "tiny:llama", *SMALL, *fix, "--out", str(tmp_path / f"ok{i}"))
        assert code == 0 and (tmp_path / f"ok{i}" / "report.json").is_file(), out


@pytest.mark.parametrize("plugin", ["ablate", "shuffle"])
def test_the_default_k_runs_on_a_tiny_model(tmp_path, capsys, plugin):
    """Class 11: a default that fails on the default tiny models is a bug. k defaults to 10 but at most half
    the heads (4 of tiny:llama's 8), leaving the random baseline heads to draw from."""
    code, out = _cli(capsys, plugin, "--model", "tiny:llama", *SMALL, "--out", str(tmp_path / "ok"))
    assert code == 0, out
    import json

    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["params"]["top_k"] is None and report["checks"]["logits_unchanged"]


@pytest.mark.parametrize(("icl", "shots"), [(False, False), (True, True)])
def test_no_patchable_pair_names_shots_only_for_icl_pairs(llama, icl, shots):
    from mechkit.errors import MechkitError
    from mechkit.patching.pairs import PromptPair, aligned

    pair = PromptPair("ab", "abc", " x", " y", first_token=True, shuffled_labels=icl)  # lengths differ
    with pytest.raises(MechkitError) as err:
        aligned(llama, [pair])
    assert ("--shots" in str(err.value)) == shots and "--seed" in str(err.value)
