"""Red-team pass 30 (b): what it found, fixed.

F1: a GGUF whose conversion mechkit's load checks refuse (a config vocab_size the weights disagree with...) was
dequantized again on every later load, and the refusal told the user to edit a file inside the cache entry
(which only made the next load convert again). F2: a user's folder in ``gguf/`` named ``*-<sha16>`` that sorted
before a whole entry of that content was refused as "in the way". F3: ablate/shuffle with two ranked items, or
an explicit head and a ranked item, failed after the scores with "lower --top-k to at most 3": the k given.
F4: ``--seg-len 1`` ran all the work, then blamed NaN on the weights (detect, shuffle), or ranked heads on
self-attention and exited 0 (ablate).
"""

from __future__ import annotations

import re

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from mechkit.model.sources import gguf as gguf_mod
from mechkit.model.sources.tiny import tiny_model
from tests.conftest import cli_in_process

# --- F1: a content refusal of a GGUF's conversion is not converted again, and names the GGUF -------------------


def _vocab(model):
    model.config.vocab_size = 999  # the embedding holds fewer rows


def _pad(model):
    model.config.pad_token_id = 100_000


def _shapes(model):
    model.config.hidden_size = 32


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_mod, "RACY_NS", 0)
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUF stand-in bytes")
    return f


def _converter(monkeypatch, spoil=None):
    builds: list = []

    def convert(path, dtype=None):
        builds.append(path)
        model, tok = tiny_model("llama")
        if spoil is not None:
            spoil(model)
        return model, tok

    monkeypatch.setattr(gguf_mod, "load_gguf", convert)
    return builds


@pytest.mark.parametrize("spoil", [_vocab, _pad, _shapes])
def test_a_refused_conversion_is_not_converted_again_and_names_the_gguf(gguf_file, monkeypatch, spoil):
    builds = _converter(monkeypatch, spoil)
    for _ in range(3):
        with pytest.raises(ModelLoadError) as err:
            mk.load_model(str(gguf_file), device="cpu")
        text = str(err.value)
        assert str(gguf_file) in text and err.value.fix is not None
        assert "cache" not in err.value.fix and "config.json" not in err.value.fix  # no edit inside the entry
        assert str(gguf_mod.cache_root()) not in text
    assert len(builds) == 1, "a content refusal dequantized the GGUF file again"


def test_an_entry_transformers_cannot_read_is_still_rebuilt_once(gguf_file, monkeypatch):
    from mechkit.model import loading

    builds = _converter(monkeypatch)
    first = mk.load_model(str(gguf_file), device="cpu")
    real, fails = loading.load_directory, []

    def flaky(path, *a, **k):
        if not fails:
            fails.append(path)
            raise loading.UnreadableFiles(f"could not load the model in {path}: boom", "re-export")
        return real(path, *a, **k)

    monkeypatch.setattr(loading, "load_directory", flaky)
    again = mk.load_model(str(gguf_file), device="cpu")
    assert len(builds) == 2 and again.source == first.source


# --- F2: a user's folder named like an entry does not hide the whole entry beside it ---------------------------


@pytest.mark.parametrize("name", ["a", "0", "Aaa_notes"])
def test_a_users_folder_sorting_first_is_passed_over(gguf_file, monkeypatch, name):
    builds = _converter(monkeypatch)
    entry = mk.load_model(str(gguf_file), device="cpu").source
    theirs = entry.parent / f"{name}-{entry.name.rsplit('-', 1)[1]}"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert sorted(entry.parent.glob(f"*-{entry.name.rsplit('-', 1)[1]}"))[0] == theirs
    again = mk.load_model(str(gguf_file), device="cpu")
    assert again.source == entry and len(builds) == 1
    assert (theirs / "notes.txt").read_text() == "mine"


def test_a_users_folder_beside_a_damaged_entry_leaves_it_rebuilt_in_place(gguf_file, monkeypatch):
    builds = _converter(monkeypatch)
    entry = mk.load_model(str(gguf_file), device="cpu").source
    theirs = entry.parent / f"a-{entry.name.rsplit('-', 1)[1]}"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    (entry / gguf_mod.META).unlink()  # damaged: only model files left
    again = mk.load_model(str(gguf_file), device="cpu")
    assert again.source == entry and len(builds) == 2 and (theirs / "notes.txt").read_text() == "mine"


# --- F3: the baseline refusal's fix is a k that works, applied literally ----------------------------------------

FAST = ["--n", "2", "--shots", "1", "--tasks", "capitalize", "--n-seqs", "4", "--seg-len", "6"]


def _suggested_top_k(stderr: str) -> str:
    found = re.findall(r"--top-k (\d+)", stderr)
    assert found, stderr
    return found[-1]


@pytest.mark.parametrize("plugin,model,heads,extra", [
    ("ablate", "tiny:gpt2", "induction,previous-token", ["--top-k", "3", "--baseline-seeds", "1"]),
    ("ablate", "tiny:llama", "0.0,induction", ["--baseline-seeds", "1"]),
    ("ablate", "tiny:llama", "previous-token,duplicate-token", ["--top-k", "3", "--baseline-seeds", "1"]),
    ("shuffle", "tiny:gpt2", "induction,previous-token", ["--top-k", "3", "--seeds", "1"]),
])
def test_the_baseline_refusals_top_k_works(tmp_path, plugin, model, heads, extra):
    args = [plugin, "--model", model, "--heads", heads, *FAST]
    refused = cli_in_process(*args, *extra, "--out", str(tmp_path / "a"))
    assert refused.returncode == 2, refused.stderr
    assert "cannot draw" not in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    k = _suggested_top_k(refused.stderr)
    given = extra[extra.index("--top-k") + 1] if "--top-k" in extra else None
    assert k != given
    kept = [a for i, a in enumerate(extra) if a != "--top-k" and (i == 0 or extra[i - 1] != "--top-k")]
    fixed = cli_in_process(*args, *kept, "--top-k", k, "--out", str(tmp_path / "b"))
    assert fixed.returncode == 0, fixed.stderr
    if plugin == "ablate":
        assert "--baseline none" in refused.stderr
        plain = [a for i, a in enumerate(extra) if "--baseline-seeds" not in (a, extra[i - 1] if i else "")]
        none = cli_in_process(*args, *plain, "--baseline", "none", "--out", str(tmp_path / "c"))
        assert none.returncode == 0, none.stderr


def test_the_safe_top_k_holds_whatever_the_scores_pick():
    from mechkit.model.headspec import parse_spec

    for spec, n_layers, n_heads in [("induction,previous-token", 2, 4), ("0.0,induction", 2, 4),
                                    ("induction,previous-token,duplicate-token,1.1", 3, 4)]:
        sel = parse_spec(spec)
        k = sel.safe_top_k(n_layers, n_heads)
        assert k >= 1
        for shift in range(n_layers * n_heads):  # scores ranking different heads first for each kind
            scores = {kind: [[float((layer * n_heads + h + shift * (i + 1)) % 7) for h in range(n_heads)]
                             for layer in range(n_layers)] for i, kind in
                      enumerate(("induction", "previous-token", "duplicate-token"))}
            sel.check_baseline(n_layers, n_heads, [k], scores=scores, late=True)


def test_a_failed_draw_beside_a_selection_does_not_suggest_the_same_k():
    from mechkit.model.headspec import Head, random_heads

    selected = [Head(0, h) for h in range(4)] + [Head(1, 0)]
    with pytest.raises(MechkitError) as err:
        random_heads(2, 4, 5, exclude=selected)
    assert "at most 3" not in str(err.value) and "at most 4 of the model's 8 heads" in str(err.value)


# --- F4: --seg-len 1 is refused before any work ----------------------------------------------------------------


@pytest.mark.parametrize("plugin,fast", [
    ("detect", ["--n-seqs", "4"]), ("shuffle", [*FAST[:4], "--n-seqs", "4", "--seeds", "1", "--top-k", "2"]),
    ("ablate", [*FAST[:6], "--n-seqs", "4", "--baseline-seeds", "1", "--top-k", "2"]),
    ("attention", ["--n-seqs", "4"]),
])
def test_seg_len_one_is_refused_at_once_and_two_runs(tmp_path, plugin, fast):
    args = [plugin, "--model", "tiny:llama", *fast]
    out = cli_in_process(*args, "--seg-len", "1", "--out", str(tmp_path / "a"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--seg-len" in out.stderr and "weights" not in out.stderr
    assert not (tmp_path / "a" / "report.json").exists()
    assert "pass --seg-len 2 or more" in out.stderr  # the fix, applied as it reads
    fixed = cli_in_process(*args, "--seg-len", "2", "--out", str(tmp_path / "b"))
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.parametrize("seg_len", [1, 0, True])
def test_head_scores_refuse_a_segment_too_short_for_induction(seg_len):
    from mechkit.heads.scores import head_scores

    handle = mk.load_model("tiny:llama")
    tokens = torch.randint(3, 100, (2, 5))
    with pytest.raises(MechkitError, match="seg_len must be a whole number of at least 2"):
        head_scores(handle, tokens, seg_len)

