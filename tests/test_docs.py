"""The documentation site cannot rot: it builds strictly, its code runs, its references match the code.

- The site builds with ``mkdocs build --strict``: any warning fails, broken links and anchors included.
- Every runnable code block in the docs and the README runs here, on tiny models; a block that cannot
  is marked ``<!-- not run: REASON -->`` and must give a reason. Every ``mechkit …`` line parses.
- The CLI reference lists exactly the options ``--help`` shows; every built-in plugin has a page.
- Every tutorial notebook executes top to bottom on a tiny model, and its stored embedded-model copy
  was made from the notebook as it is now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.docsite import blocks as docblocks  # noqa: E402
from tools.docsite import cli_reference, notebooks  # noqa: E402

README_LIMIT = 15_000
# The parameters that run each tutorial on a tiny model in seconds (the notebook's own values are the
# embedded model's, and the docs show that run).
TINY = {
    "01_induction_heads": {"MODEL": "tiny:llama", "N": 4, "N_SEQS": 4, "K": 2, "SEEDS": 1},
    "02_task_vectors": {"MODEL": "tiny:llama", "STEPS": 3, "N": 4, "N_CONTEXTS": 4},
    "03_pruning": {"MODEL": "tiny:llama", "N": 4, "CALIB": 4, "SHOTS": 2},
    "04_writing_a_plugin": {"MODEL": "tiny:llama", "N": 2},
}
# Analyses documented on a page named otherwise than their command.
PAGE_OF = {"taskvec-sweep": "taskvec"}


def _pages() -> list[Path]:
    return [p for p in docblocks.markdown_files(ROOT) if p.exists()]


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- the site --------------------------------------------------------------------------------------


def test_site_builds_strictly(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*.html")}
    for page in ("index.html", "reference/cli.html", "reference/api.html", "tutorials/induction-heads.html",
                 "analyses/detect.html", "benchmarks.html"):
        assert page in built, f"{page} was not built"


def test_readme_is_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; the limit is {README_LIMIT} (move detail into docs/)"


# --- references --------------------------------------------------------------------------------------


OPTION_LINE = re.compile(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)(?: ?/ ?(--[a-z][a-z0-9-]*))?")


def _help_flags(text: str) -> set[str]:
    """The flags ``--help`` lists: the start of each option line (flags named in help text do not count)."""
    options = text.split("Options:", 1)[1] if "Options:" in text else ""
    flags = {f for line in options.splitlines() if (m := OPTION_LINE.match(line)) for f in m.groups() if f}
    return flags - {"--help"}


def test_cli_reference_matches_help():
    from mechkit.cli.main import cli

    commands = cli_reference.walk(cli)
    assert len(commands) >= 20
    page = cli_reference.page()
    for path, command in commands:
        assert f"\n## {' '.join(path)}\n" in page, f"no section for mechkit {' '.join(path)}"
        documented = set(cli_reference.option_flags(command))
        shown = _help_flags(cli_reference.help_text(path))
        assert documented == shown, f"mechkit {' '.join(path)}: reference {sorted(documented ^ shown)} differ from --help"


def test_every_builtin_plugin_has_a_page_and_a_reference_entry():
    from mechkit import registry

    page = cli_reference.page()
    builtin = [e for e in registry.entries().values() if e.dist == "mechkit"]
    assert len(builtin) >= 11
    for entry in builtin:
        doc = ROOT / "docs" / "analyses" / f"{PAGE_OF.get(entry.name, entry.name)}.md"
        assert doc.exists(), f"plugin {entry.name} has no page {doc.relative_to(ROOT)}"
        assert f"mechkit {entry.name}" in doc.read_text(), f"{doc.name} never shows the command"
        assert f"\n## {entry.name}\n" in page


# --- code blocks ----------------------------------------------------------------------------------


def test_skipped_blocks_say_why():
    unexplained = [b.where for p in _pages() for b in docblocks.blocks(p) if b.not_run is not None and len(b.not_run) < 8]
    assert not unexplained, f"blocks marked not run without a reason: {unexplained}"


def test_every_mechkit_command_in_the_docs_parses():
    checked, bad = 0, []
    for page in _pages():
        for block in docblocks.blocks(page):
            for args in docblocks.mechkit_invocations(block):
                checked += 1
                try:
                    docblocks.check_parses(args)
                except Exception as err:  # click's errors and mechkit's OptionError
                    bad.append(f"{block.where}: mechkit {' '.join(args)}: {err}")
    assert checked > 20
    assert not bad, "\n".join(bad)


def _run_shell(block, tmp_path):
    if docblocks.only_mechkit(block):
        from click.testing import CliRunner

        from mechkit.cli.main import cli

        for command in docblocks.shell_commands(block.code):
            args = docblocks.mechkit_invocations(docblocks.Block(block.path, block.line, "bash", command + "\n", None))[0]
            result = CliRunner().invoke(cli, args, catch_exceptions=False)
            assert result.exit_code == 0, f"{block.where}: mechkit {' '.join(args)}\n{result.output[-2000:]}"
        return
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-e", "-c", block.code], cwd=tmp_path, capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, f"{block.where}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"


@pytest.mark.parametrize("page", _pages(), ids=_label)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    runnable = [b for b in docblocks.blocks(page) if b.runs]
    if not runnable:
        marked = [b for b in docblocks.blocks(page) if b.not_run is not None]
        pytest.skip(f"no runnable block ({len(marked)} marked not run, each with its reason)")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in runnable:
        if block.lang in {"python", "py"}:
            code = compile(block.code, block.where, "exec")
            exec(code, namespace)  # noqa: S102 - the docs' own examples
        else:
            _run_shell(block, tmp_path)


# --- tutorials -----------------------------------------------------------------------------------


def test_tutorials_are_listed():
    names = [s.stem for s in notebooks.sources()]
    assert names == sorted(TINY), "every notebook needs its tiny parameters in TINY"
    assert len(names) >= 4


@pytest.mark.parametrize("source", notebooks.sources(), ids=lambda p: p.stem)
def test_stored_outputs_come_from_this_notebook_on_the_embedded_model(source):
    nb = notebooks.executed(source)
    assert nb is not None, f"notebooks/executed/{source.stem}.ipynb is missing: run `make notebooks`"
    meta = nb.metadata["mechkit"]
    assert meta["source_sha256"] == notebooks.source_hash(source), f"{source.name} changed since: run `make notebooks`"
    assert meta["model"] == "llama"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


_EXECUTED: dict = {}


def _executed_tiny(source: Path, tmp_path_factory) -> object:
    """Each notebook executed once on its tiny parameters (two tests read the plugin tutorial's run)."""
    if source.stem not in _EXECUTED:
        cwd = tmp_path_factory.mktemp(source.stem)
        _EXECUTED[source.stem] = notebooks.execute(source, TINY[source.stem], timeout=600, cwd=cwd)
    return _EXECUTED[source.stem]


@pytest.mark.parametrize("source", notebooks.sources(), ids=lambda p: p.stem)
def test_tutorial_executes_on_a_tiny_model(source, tmp_path_factory):
    nb = _executed_tiny(source, tmp_path_factory)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    streams = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Warning" not in streams, f"a notebook run should print mechkit's output only:\n{streams[-1500:]}"
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    runs = [c for c in nb.cells if c.cell_type == "code" and "mk.run(" in c.source]
    assert runs and len(html) >= 1, "a run shown in a notebook renders as HTML"


def test_a_run_renders_inline_with_its_finding(tmp_path_factory):
    """The plugin tutorial's ``run`` cell displays the report as HTML; its last cell prints the finding."""
    import ast
    import html as html_lib

    source = next(s for s in notebooks.sources() if s.stem == "04_writing_a_plugin")
    nb = _executed_tiny(source, tmp_path_factory)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    shown = next(c for c in cells if c.source.strip().endswith("\nrun"))
    finding = ast.literal_eval(cells[-1].outputs[-1]["data"]["text/plain"])
    assert finding.startswith("Head ")
    rendered = "".join(o["data"]["text/html"] for o in shown.outputs if "text/html" in o.get("data", {}))
    assert html_lib.escape(finding) in rendered, rendered[:1000]
    assert "<img" in rendered and "data:image/png;base64," in rendered, "the headline figure is inline"
