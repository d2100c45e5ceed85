"""Issue 27 part 4: mechkit in a notebook. A run renders inline (finding, headline figure, tables,
images inline, nothing fetched), loaded reports the same way; handles, runs, caches and task vectors
show in a few lines; progress in Jupyter is plain text, never a live display that wants ipywidgets."""

from __future__ import annotations

import html
import io
import warnings

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.io.progress import Heartbeat, PlainProgress, heartbeat
from mechkit.plugin import RunContext

SHORT = 800  # characters a repr may take


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("nb") / "inspect"
    return mk.run("inspect", model="tiny:gpt2", out=out, console=Console(file=io.StringIO()))


def _short(text: str, lines: int = 8) -> None:
    assert len(text) < SHORT, text
    assert len(text.splitlines()) <= lines, text


def test_run_repr_is_a_few_lines_naming_plugin_model_finding_and_where(written):
    text = repr(written)
    _short(text)
    assert text.startswith("Run: inspect") and "tiny:gpt2" in text
    assert written.finding and written.finding.split()[0] in text
    assert str(written.out_dir / "report.html") in text
    assert str(written) == text
    assert "{'" not in text  # never the report dict


def test_run_renders_inline_with_finding_figure_and_tables(written):
    page = written._repr_html_()
    assert html.escape(written.finding) in page
    assert '<img src="data:image/png;base64,' in page
    assert "<table>" in page and "<h2>Results</h2>" in page
    assert "http://" not in page and "https://" not in page and "<link" not in page and " src=" not in page.replace(
        '<img src="data:', "")  # nothing fetched: images are data URIs, the grids' one script is inline
    assert page.count("<script>") == 1 and 'class="mk-view' in page  # the heatmap's interactive grid
    assert "body{" not in page and "<html" not in page  # a fragment, its CSS scoped to its own div
    assert page.startswith('<div class="mechkit-report mk-scope">')


def test_unwritten_run_draws_its_figures_inline():
    run = mk.run("inspect", model="tiny:gpt2", write=False, console=Console(file=io.StringIO()))
    assert run.out_dir is None and run.figures
    page = run._repr_html_()
    assert '<img src="data:image/png;base64,' in page and html.escape(run.finding) in page
    assert "not written" in repr(run)


def test_load_report_gives_a_run_that_renders_the_same_way(written):
    loaded = mk.load_report(written.out_dir)
    assert isinstance(loaded, mk.Run) and loaded.results == written.results
    _short(repr(loaded))
    page = loaded._repr_html_()
    assert html.escape(written.finding) in page and '<img src="data:image/png;base64,' in page
    assert mk.load_report(written.out_dir / "report.json").out_dir == written.out_dir


def test_show_prints_what_the_cli_prints(written):
    buf = io.StringIO()
    written.show(Console(file=buf, width=200))
    text = buf.getvalue()
    assert written.finding.split(";")[0] in text.replace("\n", " ")
    assert f"report: {written.out_dir}/report.json" in text


def test_handle_repr_is_its_anatomy_not_the_module_tree(tiny_llama):
    text = repr(tiny_llama)
    _short(text, lines=9)
    for part in ("ModelHandle tiny:llama", "family", "layers   2", "4 (2 KV)", "d_model", "params", "cpu · float32"):
        assert part in text, part
    for tree in ("LlamaDecoderLayer", "Linear(", "Embedding(", "Tokenizer", "(model):"):
        assert tree not in text, tree
    page = tiny_llama._repr_html_()
    assert "<table>" in page and "LlamaDecoderLayer" not in page


def test_cache_repr_names_shapes_never_tensors(tiny_llama):
    _, cache = mk.run_with_cache(tiny_llama, tiny_llama.to_tokens(["hello", "a b"]), ["blocks.*.attn.hook_z",
                                                                                      "blocks.*.hook_resid_post"])
    text = repr(cache)
    _short(text, lines=10)
    assert "Cache of 4 hook points from tiny:llama" in text and "blocks.1.hook_resid_post" in text
    assert "tensor(" not in text


def test_weight_task_vector_repr_never_prints_tensors():
    from mechkit.taskarith import TaskVector

    deltas = {f"model.layers.{i}.mlp.down_proj.weight": torch.full((64, 128), 0.01) for i in range(30)}
    tv = TaskVector(deltas, {"tasks": ["capitalize"], "ops": ["scale 0.5"],
                             "base": {"spec": "tiny:llama", "sha256": "ab" * 32}})
    text = repr(tv)
    _short(text, lines=4)
    assert "tensor(" not in text and "30 tensors" in text and "245.8k params" in text
    assert "capitalize" in text and "tiny:llama" in text and "scale 0.5" in text
    norm = float(torch.cat([d.flatten() for d in deltas.values()]).norm())
    assert f"norm {norm:.4g}" in text


def test_activation_vector_repr_never_prints_the_vector():
    from mechkit.actvec.vector import ActivationVector

    vec = ActivationVector(torch.randn(2, 64), "function-vector", "antonym", 1, "add", scale=2.0,
                           heads=[{"layer": 0, "head": 1}])
    text = repr(vec)
    _short(text, lines=3)
    assert "tensor(" not in text and "[2, 64]" in text and "layer 1" in text and "1 heads" in text


def test_progress_in_jupyter_is_plain_lines_without_warnings():
    buf = io.StringIO()
    console = Console(file=buf, force_jupyter=True)
    ctx = RunContext(model=None, params={}, seed=0, console=console)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        bar = ctx.progress()
        assert isinstance(bar, PlainProgress)
        with bar:
            job = bar.add_task("ablate", total=2)
            bar.advance(job)
            bar.advance(job)
        assert isinstance(heartbeat(console, "loading"), Heartbeat)
    assert not [w for w in seen if "ipywidgets" in str(w.message)]
    assert buf.getvalue().startswith("mechkit: ablate 2/2 done")


def test_a_run_in_jupyter_displays_nothing_empty(monkeypatch):
    """Rich's live displays in Jupyter warn without ipywidgets and leave empty output blocks (display
    calls with no text); a run with a notebook console makes neither."""
    import rich.jupyter

    shown: list[str] = []
    monkeypatch.setattr(rich.jupyter, "display", lambda segments, text: shown.append(text))
    buf = io.StringIO()
    console = Console(file=buf, force_jupyter=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mk.run("ablate", model="tiny:gpt2", write=False, console=console, heads="0.1", tasks="capitalize", n=4,
               shots=1, baseline="none")
    assert not [w for w in seen if "ipywidgets" in str(w.message)]
    assert all(text.strip() for text in shown), shown
    assert "mechkit: " in buf.getvalue() and " done " in buf.getvalue()  # the bar's plain lines, on stderr
