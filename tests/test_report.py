"""Reports: the JSON contract, the self-contained HTML page, atomic writes and the terminal summary."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from mechkit.errors import MechkitError, ReportExistsError
from mechkit.report import (
    SCHEMA,
    build_report,
    default_out_dir,
    load_report,
    print_summary,
    render_html,
    summary_table,
    to_jsonable,
    validate_report,
    write_report,
)

TASKS = ("capitalize", "swap")


def _conditions() -> list[dict]:
    def metrics(a: float, b: float) -> dict:
        return {"capitalize": {"accuracy": a, "logprob": -0.1}, "swap": {"accuracy": b, "logprob": -0.7}}

    return [
        {"name": "clean", "seed": 0, "heads": [], "metrics": metrics(0.9, 0.8)},
        {"name": "target", "seed": 0, "heads": [{"layer": 17, "head": 3}], "metrics": metrics(0.125, 0.25)},
        {"name": "random", "seed": 1, "heads": [{"layer": 2, "head": 0}], "metrics": metrics(0.875, 0.75)},
    ]


FINDING = "Ablating head 17.3 cuts capitalize from 0.90 to 0.12; a random head keeps 0.88."


def _report(finding: str | None = FINDING, **results) -> dict:
    return build_report(
        finding=finding,
        plugin="ablate",
        plugin_version="0.1.0",
        model={
            "spec": "llama",
            "name": "<tiny> & co",
            "architecture": "LlamaForCausalLM",
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 2,
            "d_head": 8,
            "dtype": "float32",
            "device": "cpu",
        },
        params={"heads": "induction", "top_k": 5, "tasks": list(TASKS)},
        seed=0,
        results={
            "conditions": _conditions(),
            "score": np.float32(0.5),
            "missing": float("nan"),
            "grid": np.arange(8, dtype=float).reshape(2, 4),
            **results,
        },
        artifacts=[],
        timings={"load_s": 0.25, "run_s": 1.5},
    )


@pytest.fixture(scope="module")
def figure():
    from mechkit.report import head_heatmap

    return head_heatmap(
        [[0.1, 0.9, 0.2, 0.0], [0.3, 0.2, float("nan"), 0.4]], "induction", highlight=[(0, 1)]
    )


class _BrokenFigure:
    def savefig(self, *args, **kwargs):
        raise RuntimeError("disk full")


def test_to_jsonable_is_strict_json():
    @dataclasses.dataclass
    class Cell:
        layer: int
        score: float

    out = to_jsonable(
        {
            "a": np.float64("nan"),
            "b": (1, np.int64(2)),
            "c": Path("x/y"),
            "d": Cell(3, math.inf),
            (17, 3): np.array([[1.0, np.nan]]),
            "e": np.bool_(True),
        }
    )
    assert out == {
        "a": None,
        "b": [1, 2],
        "c": "x/y",
        "d": {"layer": 3, "score": None},
        "17.3": [[1.0, None]],
        "e": True,
    }
    json.dumps(out, allow_nan=False)  # raises if anything non-JSON survived


def test_build_report_fills_contract_keys():
    r = _report()
    validate_report(r)
    assert r["schema"] == SCHEMA
    assert r["environment"]["python"] and "mechkit" in r["environment"]
    assert r["results"]["missing"] is None and r["results"]["score"] == 0.5
    for key in ("schema", "results", "seed"):
        broken = {k: v for k, v in r.items() if k != key}
        with pytest.raises(MechkitError, match=key):
            validate_report(broken)
    with pytest.raises(MechkitError, match="artifacts"):
        validate_report({**r, "artifacts": ["../escape.png"]})


def test_write_report(tmp_path, figure):
    out = write_report(
        tmp_path / "runs" / "r1",
        _report(),
        figures={"heatmap": figure},
        files={"scores.csv": "layer,head\n0,1\n"},
    )
    assert {p.name for p in out.iterdir()} == {"report.json", "report.html", "heatmap.png", "scores.csv",
                                               ".mechkit-files"}  # the manifest: what --force may replace
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r1"]  # no temp dir left behind

    raw = (out / "report.json").read_text()
    assert "NaN" not in raw and '"missing": null' in raw
    loaded = load_report(out)
    assert loaded == load_report(out / "report.json") == json.loads(raw)
    assert loaded["schema"] == SCHEMA
    assert loaded["artifacts"] == ["heatmap.png", "scores.csv"]

    page = (out / "report.html").read_text()
    png = (out / "heatmap.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert "data:image/png;base64," in page and "heatmap.png" in page
    assert "&lt;tiny&gt; &amp; co" in page and "<tiny>" not in page
    assert not re.search(r"https?://", page)
    assert "capitalize" in page and "0.12" in page  # conditions x tasks accuracy grid
    assert "2 × 4, max 7" in page  # score grids are summarised, not dumped
    assert loaded["finding"] == FINDING


def test_page_reads_finding_figure_tables_then_details(tmp_path, figure):
    out = write_report(tmp_path / "r", _report(), figures={"heatmap": figure, "second": figure})
    page = (out / "report.html").read_text()
    order = [page.index(x) for x in ('class="finding"', '<figure class="headline">', "<h2>Results</h2>",
                                      "<h2>More figures</h2>", "<summary>Parameters</summary>",
                                      "<summary>Raw results</summary>", "<summary>Timings and environment</summary>")]
    assert order == sorted(order)
    assert FINDING in page and page.count("<figure") == 2
    # every table sits in its own scroll box, so a wide one never widens the page
    assert page.count("<table") == page.count('<div class="scroll"><table')
    assert "overflow-x:auto" in page and "max-width:100%" in page
    assert 'class="finding"' not in render_html(_report(finding=None), {})


def test_finding_is_an_optional_string():
    assert "finding" not in _report(finding=None)
    validate_report({**_report(), "finding": None})
    with pytest.raises(MechkitError, match="finding"):
        validate_report({**_report(), "finding": 3})


def test_tables_round_per_table_and_shorten_head_lists():
    from mechkit.report import Table, pm
    from mechkit.report.html import table_html

    heads = [{"layer": layer, "head": h} for layer in range(3) for h in range(3)]
    t = Table("Accuracy", ["condition", "heads", "swap"],
              [["clean", [], 0.9], ["target", heads, 0.125], ["random", "3 draws", pm(0.5, 0.0123)]],
              note="zero ablation")
    html = table_html(t)
    assert ">0.90<" in html and ">0.12<" in html and ">0.50 ± 0.01<" in html
    assert ">0.0, 0.1, 0.2, 1.0, 1.1" not in html  # never the long list inline: on hover
    assert 'title="0.0, 0.1, 0.2, 1.0, 1.1, 1.2, 2.0, 2.1, 2.2">0.0, 0.1, 0.2, 1.0 (+5)</span>' in html
    assert "zero ablation" in html
    assert ">0.125<" in table_html(Table("t", ["", "v"], [["x", 0.125]], digits=3))
    with pytest.raises(ValueError, match="row 0"):
        Table("bad", ["a", "b"], [["only one"]])
    console = Console(record=True, width=100)
    from mechkit.report import rich_table

    console.print(rich_table(t))
    text = console.export_text()
    assert "0.12" in text and "0.50 ± 0.01" in text and "(+5)" in text and "zero ablation" in text


def test_page_uses_the_plugin_tables_when_given():
    from mechkit.report import Table

    page = render_html(_report(), {}, tables=[Table("Pivot", ["guide", "0.2"], [["wanda", 0.5]])])
    assert "<h3>Pivot</h3>" in page and "Accuracy by condition" not in page.split("<h2>Details</h2>")[0]


def test_refuses_to_overwrite_without_force(tmp_path, figure):
    out = write_report(tmp_path / "r", _report(tag="first"))
    with pytest.raises(ReportExistsError, match="--force"):
        write_report(out, _report(tag="second"))
    assert load_report(out)["results"]["tag"] == "first"
    write_report(out, _report(tag="second"), figures={"heatmap.png": figure}, force=True)
    assert load_report(out)["results"]["tag"] == "second"
    assert (out / "heatmap.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_failure_leaves_nothing_behind(tmp_path, figure):
    out = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError, match="disk full"):
        write_report(out, _report(), figures={"ok": figure, "broken": _BrokenFigure()})
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # neither a temp dir nor the parent it had to create


def test_failure_keeps_existing_report(tmp_path):
    out = write_report(tmp_path / "r", _report(tag="first"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError):
        write_report(out, _report(tag="second"), figures={"broken": _BrokenFigure()}, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_load_report_errors(tmp_path):
    (tmp_path / "report.json").write_text('{"schema": "mechkit.report/v1", ')
    with pytest.raises(MechkitError, match="not valid JSON"):
        load_report(tmp_path)
    with pytest.raises(MechkitError, match="no report"):
        load_report(tmp_path / "elsewhere")
    (tmp_path / "report.json").write_text('{"schema": "mechkit.report/v1"}')
    with pytest.raises(MechkitError, match="plugin"):
        load_report(tmp_path)


def test_summary_table_shows_conditions_by_task():
    console = Console(record=True, width=120)
    console.print(summary_table(_report()))
    text = console.export_text()
    assert "capitalize" in text and "swap" in text
    assert "0.12" in text and "17.3" in text and "target" in text

    console = Console(record=True, width=120)
    print_summary(_report(), console=console)
    text = console.export_text()
    assert "ablate" in text and "seed 0" in text and "0.12" in text and "grid" in text
    # the terminal follows the page: the finding first, then the tables, the timings last
    assert text.index("seed 0") < text.index("Ablating head 17.3") < text.index("Accuracy by condition") \
        < text.index("run_s")


def test_summary_table_flattens_nested_scalars():
    r = _report()
    r["results"] = {"top": {"a": 1, "b": {"c": 0.5}}, **{f"k{i}": i for i in range(60)}}
    console = Console(record=True, width=120)
    console.print(summary_table(r))
    text = console.export_text()
    assert "top.b.c" in text and "22 more rows in" in text


def test_render_html_generic_shapes():
    r = _report(
        records=[{"task": "swap", "acc": 0.5}, {"task": "plus-one", "n": 3}],
        by_task={"swap": {"clean": 0.9, "target": 0.1}},
    )
    page = render_html(r, {})
    assert "<th>task</th>" in page and "<th>n</th>" in page and "plus-one" in page
    assert "<th>clean</th>" in page and "<th>target</th>" in page


def test_default_out_dir(tmp_path):
    first = default_out_dir("ablate", root=tmp_path)
    assert first.parent == tmp_path and re.fullmatch(r"\d{8}-\d{6}-ablate", first.name)
    assert not first.exists()
    first.mkdir()
    second = default_out_dir("ablate", root=tmp_path)
    assert second != first and not second.exists()


def test_plots_render(tmp_path):
    from mechkit.report import bar_plot, line_plot

    figs = {
        "line": line_plot(
            [0, 1, 2],
            {"target": [0.9, 0.5, None], "random": [0.9, 0.85, 0.8]},
            "t",
            "k",
            "acc",
            errors={"random": [0.0, 0.05, 0.02]},
        ),
        "bar": bar_plot(
            ["capitalize", "swap"],
            {"clean": [0.9, 0.8], "target": [0.1, 0.2]},
            "t",
            "acc",
            errors={"clean": [0.01, 0.02]},
        ),
    }
    out = write_report(tmp_path / "r", _report(), figures=figs)
    assert all((out / f"{name}.png").read_bytes().startswith(b"\x89PNG") for name in figs)


def test_import_is_light():
    code = (
        "import sys, mechkit.report; "
        "bad = [m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def _shown(report: dict) -> str:
    import io

    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    print_summary(report, console=console)
    return console.file.getvalue()


def test_report_show_prints_strings_as_text_and_escapes_control_characters(tmp_path):
    hostile = build_report(plugin="x[/]", plugin_version="1", model={"spec": "\x1b[2J[bold]m"}, params={},
                           seed=0, results={"summary": {"[/]": "[red]text[/red]\x07", "a": "\x1b]0;title\x07"}},
                           artifacts=[], timings={})
    write_report(tmp_path / "run", hostile)
    out = _shown(load_report(tmp_path / "run"))
    assert "[red]text[/red]" in out and "x[/]" in out  # markup printed as text, never interpreted
    assert "\x1b[2J" not in out and "\x07" not in out and "\x1b]0;" not in out  # no raw control sequences
    assert "\\x1b[2J" in out and "\\x07" in out  # shown escaped


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"schema": ' + "9" * 5000 + "}"])
def test_report_show_refuses_pathological_json_with_one_line(tmp_path, capsys, text):
    from mechkit.cli.main import main

    (tmp_path / "report.json").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "show", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("mechkit: error:") and "not a mechkit report" in err
