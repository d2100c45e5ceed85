"""The command line: fast help, plugin listing, reports, and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from mechkit.report import load_report
from tests.conftest import cli_in_process


def mechkit(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mechkit.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_plugins_without_importing_torch():
    code = ("import sys; from mechkit.cli.main import cli; "
            "from click.testing import CliRunner; r = CliRunner().invoke(cli, ['--help']); "
            "print(r.output); assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "inspect" in result.stdout and "plugins" in result.stdout


def test_help_is_fast():
    start = time.perf_counter()
    result = mechkit("--help")
    assert result.returncode == 0
    assert time.perf_counter() - start < 5.0  # the budget is 1.5 s; the slack absorbs CI noise


def test_plugins_list_shows_builtins_with_versions():
    result = mechkit("plugins", "list")
    assert result.returncode == 0
    assert "inspect" in result.stdout and "0.1.0" in result.stdout and "mechkit" in result.stdout


def test_inspect_writes_report_and_refuses_overwrite(tmp_path):
    out = tmp_path / "run"
    result = mechkit("inspect", "--model", "tiny:qwen2", "--out", str(out), "--seq-len", "16", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "mechkit.report/v1" and report["plugin"] == "inspect"
    assert report["model"]["n_kv_heads"] == 2 and report["params"]["seq_len"] == 16
    assert report["checks"]["logits_unchanged"] is True
    assert "head_output_norm.png" in report["artifacts"] and (out / "head_output_norm.png").exists()
    assert "data:image/png;base64" in (out / "report.html").read_text()
    before = (out / "report.json").read_bytes()
    again = mechkit("inspect", "--model", "tiny:qwen2", "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert (out / "report.json").read_bytes() == before
    shown = mechkit("report", "show", str(out))
    assert shown.returncode == 0 and "inspect" in shown.stdout


@pytest.mark.parametrize("args, needle", [
    (["inspect", "--model", "no-such-model"], "unknown model"),
    (["inspect", "--model", "tiny:llama", "--dtype", "float8"], "unknown dtype"),
    (["report", "show", "/nonexistent/report.json"], "report"),
    (["no-such-command"], "No such command"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, args, needle):
    out = tmp_path / "never"
    extra = ["--out", str(out)] if args[0] == "inspect" else []
    result = cli_in_process(*args, *extra)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert not out.exists()


def test_python_api_matches_cli(tmp_path):
    import mechkit as mk

    run = mk.run("inspect", model="tiny:gpt2", out=tmp_path / "py", seq_len=8, repeats=1)
    assert load_report(run.out_dir)["results"]["anatomy"]["family"] == "gpt2"
    with pytest.raises(mk.MechkitError, match="has no option"):
        mk.run("inspect", model="tiny:gpt2", write=False, nonsense=1)
