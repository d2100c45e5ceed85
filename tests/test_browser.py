"""Every built-in plugin's report, opened in headless Chromium at 1280 px the way a researcher reads it.

For each report page (tiny models, small settings): nothing scrolls sideways (``scrollWidth <=
innerWidth``, with the collapsed sections closed and opened), every image loads, the finding
sentence is there and comes before the headline figure, which comes before the tables, and the
console stays free of errors. A screenshot of each page is kept under ``$MECHKIT_ARTIFACTS`` (default:
this session's pytest temporary directory, ``…/browser-screenshots0``). One browser serves all pages.

Chromium is Debian's ``chromium`` package; where it is missing the set-up installs it (see
:func:`tests.chromium.find_chromium`). The tests skip, saying why, only where it cannot be had.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import mechkit as mk
from mechkit import registry
from mechkit.report import compare_runs, load_report, write_compare
from mechkit.runner import report_tables
from tests.chromium import WIDTH, Chromium, find_chromium

TINY = "tiny:llama"
# Small settings of every built-in plugin (a few seconds in all on two cores).
OPTIONS = {
    "inspect": dict(seq_len=16, repeats=1, batch=1),
    "detect": dict(n_seqs=4, seg_len=6, top_k=3),
    "ablate": dict(tasks="capitalize,swap", n=3, shots=2, baseline_seeds=2, sweep="1,2", n_seqs=4,
                   seg_len=6),
    "shuffle": dict(heads="0.0,0.1,1.2", tasks="swap", n=3, shots=2, seeds=2, n_seqs=4, seg_len=6),
    "sweep": dict(tasks="swap", n=4, shots=2, method="both"),
    "finetune": dict(task="capitalize", steps=2, batch_size=2, eval_n=3),
    "icl-vectors": dict(tasks="swap,capitalize", n=3, n_dev=2, n_contexts=2, n_cie=1, shots=2, top_k=2,
                        fv_scales="1"),
    "prune": dict(guide="attribution,random", target="neurons", sparsity="0.25,0.5", tasks="capitalize,swap", n=3,
                  calib=2, shots=2, repeats=1, timing_batch=1),
    "taskvec-sweep": dict(lambdas="-1:1:1", n=2),  # plus --vectors, made in the fixture
    "compose": dict(n=2, seeds=2, shots="0,2", n_effect=2, n_dev=2, n_test=2, draws=2, top_k=2, verify=1,
                    n_seqs=4, seg_len=6),  # no n_contexts: the vector treatment's, refused under scale
    "adapt": dict(tasks="capitalize,past-tense", budgets="0.7,1.0", calib=3, n=2, shots=1, token_layers="0",
                  token_keep="0.5", signal_layer=0, repeats=1, prune_budgets="0.7", margin=0.05),
    "patch": dict(clean="abcab", corrupted="abdab", answers="c,d"),
    "attention": dict(prompt="abcdabcd", heads="0.1,1.3"),
    "select-tasks": dict(target="past-tense", pool="capitalize,swap,opposite", n=4),
}
PENDING: set[str] = set()  # plugins whose page is not checked yet (none)
# `make demo`'s ablate settings, on a random model shaped like the embedded SmolLM2 (30 layers × 9 heads, 3 KV):
# the page's shape (tasks, k = 5 and 10 heads listed, 3 random draws) is the demo's; fewer and shorter prompts
# (n, shots, detection sequences) change only the numbers, and keep it at a second instead of a minute and a half.
DEMO = dict(heads="induction", tasks="capitalize,past-tense,country-capital", sweep="5,10", baseline_seeds=3,
            n=2, shots=1, n_seqs=4, seg_len=6)


@pytest.fixture(scope="module")
def browser():
    binary, why = find_chromium()
    if binary is None:
        pytest.skip(f"Chromium cannot be obtained here: {why}")
    chrome = Chromium(binary)
    yield chrome
    chrome.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    where = os.environ.get("MECHKIT_ARTIFACTS")
    if where:
        path = Path(where) / "browser-screenshots"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("browser-screenshots")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One report directory per built-in plugin, plus ``ablate-demo`` and a ``compare`` page of the two ablates."""
    from mechkit.model.sources.tiny import tiny_model
    from mechkit.taskarith import extract
    from tests.conftest import noisy_model_dir

    root = tmp_path_factory.mktemp("reports")
    base = mk.load_model(TINY, device="cpu")
    vectors = [extract(base, noisy_model_dir(root / f"ft{i}", seed=i + 1), tasks=[task]).save(root / f"{task}.st")
               for i, task in enumerate(("capitalize", "lowercase"))]
    out = {}
    for name, options in OPTIONS.items():
        extra = {"vectors": ",".join(map(str, vectors))} if name == "taskvec-sweep" else {}
        out[name] = mk.run(name, model=base, out=root / name, **options, **extra).out_dir
    model, tokenizer = tiny_model("llama", num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                  hidden_size=72, head_dim=8, intermediate_size=96)
    smol_shaped = mk.load_model(model, tokenizer=tokenizer, device="cpu")
    out["ablate-demo"] = mk.run("ablate", model=smol_shaped, out=root / "ablate-demo", **DEMO).out_dir
    cmp = compare_runs([out["ablate"], out["ablate-demo"]], tables_of=report_tables)
    out["compare"] = write_compare(cmp, root / "compare")
    return out


def test_find_chromium_says_why_not(monkeypatch, tmp_path):
    monkeypatch.setenv("MECHKIT_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert find_chromium() == (None, f"MECHKIT_CHROMIUM={tmp_path / 'no-such-browser'} is not an executable")
    monkeypatch.delenv("MECHKIT_CHROMIUM")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MECHKIT_INSTALL_CHROMIUM", "0")
    assert find_chromium()[0] is None and "installing is off" in find_chromium()[1]


def test_every_builtin_plugin_is_rendered():
    assert set(registry.entries()) - PENDING == set(OPTIONS)


def _check_page(browser: Chromium, page: Path, shot: Path) -> dict:
    state = browser.open(page, screenshot=shot)
    assert state["inner_width"] == WIDTH
    assert state["scroll_width"] <= state["inner_width"], f"sideways scroll: {state['too_wide']}"
    assert state["scroll_width_open"] <= state["inner_width"], "sideways scroll with the details opened"
    broken = [i["alt"] for i in state["images"] if not (i["complete"] and i["width"] > 0)]
    assert not broken, f"images that did not load: {broken}"
    assert not state["console_errors"], state["console_errors"]
    assert not state["external_requests"], f"requests off the machine: {state['external_requests']}"
    assert shot.read_bytes().startswith(b"\x89PNG")
    return state


@pytest.mark.parametrize("name", [*OPTIONS, "ablate-demo"])
def test_report_page_in_chromium(name, runs, browser, artifacts):
    report = load_report(runs[name])
    state = _check_page(browser, runs[name] / "report.html", artifacts / f"{name}.png")
    pngs = [a for a in report["artifacts"] if a.endswith(".png")]
    assert len(state["images"]) == len(pngs) >= 1
    finding = report.get("finding")
    assert finding and re.search(r"\d", finding), "the finding states numbers"
    assert " ".join(state["finding"].split()) == " ".join(finding.split())
    assert state["finding_top"] < state["headline_top"] < state["table_top"], "finding, figure, tables: in order"


def test_compare_page_in_chromium(runs, browser, artifacts):
    state = _check_page(browser, runs["compare"] / "compare.html", artifacts / "compare.png")
    assert len(state["images"]) == 2  # each run's headline figure
    for name in ("ablate", "ablate-demo"):
        assert " ".join(load_report(runs[name])["finding"].split()) in " ".join(state["finding"].split())


# --- the interactive views (mechkit.report.views, viewer.js) -------------------------------------------

_ROW = """(() => [...document.querySelectorAll('.mk-view')[%d].querySelectorAll('svg.mk-pattern rect[data-q="%d"]')]
  .sort((a, b) => a.dataset.k - b.dataset.k).map(r => +r.getAttribute('fill-opacity')))()"""
_SHOWN = "document.querySelectorAll('.mk-view')[%d].querySelector('svg.mk-pattern').dataset.head"
_INFO = "document.querySelectorAll('.mk-view')[%d].querySelector('.mk-info').textContent"


def test_off_machine_requests_are_caught(browser, tmp_path):
    """The check the pages pass is a real one: a page asking a CDN for a script is caught (and blocked)."""
    page = tmp_path / "cdn.html"
    page.write_text('<!DOCTYPE html><html><body><script src="https://cdn.example.org/viewer.js"></script></body></html>')
    state = browser.open(page)
    assert state["external_requests"] == ["https://cdn.example.org/viewer.js"]


def test_detect_grid_hover_and_click_show_a_heads_pattern(runs, browser, artifacts):
    from mechkit.model.headspec import Head
    from mechkit.report.patterns import MAX_ERROR, Patterns

    report = load_report(runs["detect"])
    views = report["views"]
    grid = views["grids"]["induction_scores.png"]  # the headline: the first view on the page
    patterns = Patterns.from_json(views["patterns"][grid["patterns"]])
    state = browser.open(runs["detect"] / "report.html")
    assert not state["console_errors"] and not state["external_requests"]
    assert browser.evaluate("document.querySelectorAll('.mk-view svg.mk-grid').length") == len(views["grids"])
    best = max(((v, f"{layer}.{h}") for layer, row in enumerate(grid["values"]) for h, v in enumerate(row)))[1]
    assert browser.evaluate(_SHOWN % 0) == best  # opens on the strongest head
    T = len(patterns.tokens)
    first = ".mk-view svg.mk-grid rect[data-head='%s']"
    other = next(f"{h.layer}.{h.head}" for h in patterns.heads if f"{h.layer}.{h.head}" != best)
    browser.mouse(first % other)  # hover: the head, its value, and its pattern
    layer, head = map(int, other.split("."))
    assert browser.evaluate(_INFO % 0).startswith(f"head {other} · mean attention: ")
    assert browser.evaluate(_SHOWN % 0) == other
    browser.mouse("h1")  # leaving the grid goes back to the kept head
    assert browser.evaluate(_SHOWN % 0) == best
    browser.mouse(first % other, click=True)  # a click keeps it
    browser.mouse("h1")
    assert browser.evaluate(_SHOWN % 0) == other
    shown = browser.evaluate(_ROW % (0, T - 1))
    expected = patterns.of(Head(layer, head))[T - 1]
    assert len(shown) == T and np.abs(np.array(shown) - expected).max() <= MAX_ERROR + 1e-4
    browser.screenshot(artifacts / "detect-clicked.png")


@pytest.mark.parametrize(("name", "figure"), [("sweep", "exact_logprob_effect.png"), ("inspect", None),
                                               ("compose", "composite_specific_heads_capitalize_swap.png")])
def test_report_heatmaps_are_grids_to_hover(name, figure, runs, browser):
    report = load_report(runs[name])
    grids = (report.get("views") or {}).get("grids") or {}
    pngs = [a for a in report["artifacts"] if a in grids]
    if figure is not None:
        assert figure in grids
    browser.open(runs[name] / "report.html")
    assert browser.evaluate("document.querySelectorAll('.mk-view').length") == len(pngs) >= 1
    i = pngs.index(figure) if figure else 0
    values = grids[pngs[i]]["values"]
    sel = f"[data-mk-view-index='{i}'] svg.mk-grid rect[data-head='1.2']"
    browser.evaluate("document.querySelectorAll('.mk-view').forEach((v, j) => v.dataset.mkViewIndex = j)")
    browser.mouse(sel)
    info = browser.evaluate(_INFO % i)
    assert info.startswith("head 1.2 · "), info
    assert abs(float(info.rsplit(": ", 1)[1]) - values[1][2]) <= 5e-3 * max(1.0, abs(values[1][2]))


def test_attention_view_page_in_chromium(browser, artifacts, tmp_path):
    from mechkit.report.patterns import MAX_ERROR

    model = mk.load_model(TINY, device="cpu")
    view = mk.show_attention(model, "abcdeabcde", heads="0.1,1.2,1.3")
    page = view.save(tmp_path / "attention.html")
    state = browser.open(page, screenshot=artifacts / "attention-view.png")
    assert state["scroll_width"] <= state["inner_width"] == WIDTH
    assert not state["console_errors"] and not state["external_requests"]
    p, T = view.patterns, len(view.patterns.tokens)
    assert browser.evaluate(_SHOWN % 0) == "0.1"
    browser.mouse(".mk-view svg.mk-grid rect[data-head='1.2']")  # hover a recorded head: its pattern
    assert browser.evaluate(_SHOWN % 0) == "1.2"
    browser.mouse(".mk-view svg.mk-grid rect[data-head='1.3']", click=True)
    browser.mouse("h1")
    assert browser.evaluate(_SHOWN % 0) == "1.3"
    assert np.abs(np.array(browser.evaluate(_ROW % (0, T - 1))) - p.of(p.heads[2])[T - 1]).max() <= MAX_ERROR + 1e-4
    # a query token clicked in the text: each line's tints are that head's attention from it
    browser.mouse(".mk-text .mk-line .mk-tok[data-k='6']", click=True)
    tints = browser.evaluate("""[...document.querySelector('.mk-text .mk-line').querySelectorAll('.mk-tok')]
        .map(s => (m => m.length > 3 ? +m[3] : 1)(getComputedStyle(s).backgroundColor.match(/[\\d.]+/g)))""")
    assert np.abs(np.array(tints[:7]) - p.of(p.heads[2])[6, :7]).max() <= MAX_ERROR + 4e-3  # alpha kept in 8 bits
    assert browser.evaluate("document.querySelector('.mk-text .mk-q').dataset.k") == "6"
    heads_unrecorded = browser.evaluate("document.querySelectorAll('.mk-view svg.mk-grid rect').length")
    assert heads_unrecorded == 8  # the whole model's grid, the recorded heads outlined
    browser.screenshot(artifacts / "attention-view-clicked.png")
