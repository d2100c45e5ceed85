"""``mechkit report compare DIR…``: runs of one plugin side by side; other plugins refused in one line."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import mechkit as mk
from mechkit.cli.main import cli, main
from mechkit.errors import MechkitError
from mechkit.report import build_report, compare_runs, write_report

DETECT = dict(model="tiny:llama", n_seqs=4, seg_len=6, top_k=3)


@pytest.fixture(scope="module")
def detect_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return [mk.run("detect", **DETECT, seed=seed, out=root / f"seed{seed}").out_dir for seed in (0, 1)]


def _probe(tmp_path, name: str, plugin: str, **params) -> str:
    r = build_report(plugin=plugin, plugin_version="1", model={"name": "m"}, params=params, seed=0,
                     results={"accuracy": 0.5}, artifacts=[], timings={}, finding=f"{plugin} found it")
    return str(write_report(tmp_path / name, r))


def test_cli_compare_puts_seeds_side_by_side(detect_runs, tmp_path):
    out = tmp_path / "cmp"
    res = CliRunner().invoke(cli, ["report", "compare", *map(str, detect_runs), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "compare.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == [".mechkit-files", "compare.html"]  # the page and its manifest
    assert not re.search(r"https?://", page)
    # the plugin's own tables (rank x kind), one column per run, labelled by what differs: the seed
    assert "Top heads by score" in page and "<th>seed 0</th><th>seed 1</th>" in page
    assert page.count("data:image/png;base64,") == 2  # each run's headline figure
    text = " ".join(res.output.split())
    assert "seed 0: The strongest induction head" in text and "seed 1: The strongest induction head" in text
    assert "comparison:" in text and "Top heads by score: induction head" in text
    assert text.index("seed 0: The strongest") < text.index("Top heads by score")  # findings, then tables
    again = CliRunner().invoke(cli, ["report", "compare", *map(str, detect_runs), "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output


def test_compare_refuses_mixed_plugins_in_one_line(tmp_path, capsys):
    a, b = _probe(tmp_path, "a", "probe"), _probe(tmp_path, "b", "other")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "compare", a, b, "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "different plugins" in err and "a (probe)" in err and "b (other)" in err
    assert not (tmp_path / "never").exists()
    with pytest.raises(MechkitError, match="at least two"):
        compare_runs([a])


def test_labels_name_what_differs(tmp_path):
    a = _probe(tmp_path, "a", "probe", k=5, mode="zero")
    b = _probe(tmp_path, "b", "probe", k=10, mode="zero")
    same = _probe(tmp_path, "c", "probe", k=10, mode="zero")
    assert compare_runs([a, b]).labels == ["k=5", "k=10"]
    assert compare_runs([b, same]).labels == ["b", "c"]  # identical settings: the directories tell them apart
    cmp = compare_runs([a, b, same])
    assert cmp.labels == ["k=5 (a)", "k=10 (b)", "k=10 (c)"]
    assert cmp.tables[0].rows == [["accuracy", 0.5, 0.5, 0.5]]
