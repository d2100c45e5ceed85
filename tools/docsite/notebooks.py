"""The tutorial notebooks: executed by the suite on a tiny model, shown in the docs as run on the embedded model.

Each tutorial is a text notebook (jupytext's percent format) in ``notebooks/``. Its cell tagged
``parameters`` sets ``MODEL``; :func:`execute` runs the notebook in a fresh kernel with another value
injected after that cell, as papermill does. ``python -m tools.docsite.notebooks`` (``make notebooks``)
runs every tutorial on the embedded model and stores the executed copy, with the command and a hash
of its source, in ``notebooks/executed/``; the docs pages are made from those copies, and a test fails
when a source changed after its copy was made.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "notebooks"
EXECUTED = SOURCES / "executed"
COMMAND = "make notebooks"


def sources() -> list[Path]:
    """The tutorial notebooks, in the order the docs list them."""
    return sorted(SOURCES.glob("[0-9]*.py"))


def page_name(source: Path) -> str:
    """``01_induction_heads.py`` -> ``induction-heads``."""
    return source.stem.split("_", 1)[1].replace("_", "-")


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def read(source: Path):
    import jupytext

    return jupytext.read(source)


def _inject(nb, params: dict) -> None:
    """Put a cell setting ``params`` right after the cell tagged ``parameters`` (papermill's convention)."""
    import nbformat

    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    if index is None:
        raise ValueError("the notebook has no cell tagged 'parameters'")
    code = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(code, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)


def execute(source: Path, params: dict | None = None, timeout: int = 600, cwd: Path | None = None):
    """Run ``source`` top to bottom in a fresh kernel and return the executed notebook (raises on any error)."""
    import tempfile

    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = read(source)
    if params:
        _inject(nb, params)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory(prefix="mechkit-kernel-") as sockets:
        # local sockets rather than TCP: nothing listens on the network, and the kernel has no warning to print
        km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "kernel"))
        client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(cwd or source.parent)}})
        try:
            client.execute()
        finally:
            if km.has_kernel:  # a kernel manager we made is ours to stop; nbclient stops only its own
                km.shutdown_kernel(now=True)
    return nb


def store(source: Path, nb, model: str, seconds: float) -> Path:
    """Write the executed copy with what made it: the command, the model, the source's hash."""
    import nbformat

    nb.metadata["mechkit"] = {"command": COMMAND, "model": model, "source_sha256": source_hash(source),
                              "seconds": round(seconds, 1)}
    EXECUTED.mkdir(exist_ok=True)
    path = EXECUTED / (source.stem + ".ipynb")
    tmp = path.with_suffix(".tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)
    return path


def executed(source: Path):
    """The stored executed copy of ``source``, or None."""
    import nbformat

    path = EXECUTED / (source.stem + ".ipynb")
    return nbformat.read(path, as_version=4) if path.exists() else None


# --- the docs page of an executed notebook ------------------------------------------------------


PROGRESS = re.compile(r"^mechkit: .*\(elapsed [^)]*\)$")


def _shown_stream(text: str) -> str:
    """A stream as a page shows it: progress lines (``mechkit: … (elapsed 40s)``) only where a step ends."""
    lines = [ln for ln in text.splitlines() if not PROGRESS.match(ln) or " done " in ln]
    return "\n".join(lines).strip()


def _merged(outputs: list) -> list:
    """Consecutive stream outputs as one (a kernel flushes a long print in pieces)."""
    merged: list = []
    for output in outputs:
        if output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream":
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + output["text"]}
        else:
            merged.append(dict(output))
    return merged


def _output_md(output) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        text = _shown_stream(output["text"])
        return "```text\n" + text + "\n```\n" if text else ""
    if kind == "error":
        return "```text\n" + "\n".join(output.get("traceback", [])) + "\n```\n"
    data = output.get("data", {})
    if "text/html" in data:
        return '<div class="nb-output" markdown="0">\n' + "".join(data["text/html"]).strip() + "\n</div>\n"
    if "image/png" in data:
        return f'<img class="nb-output" alt="figure" src="data:image/png;base64,{data["image/png"].strip()}">\n'
    if "text/plain" in data:
        return "```text\n" + "".join(data["text/plain"]).rstrip() + "\n```\n"
    return ""


def to_markdown(nb, source: Path) -> str:
    """A docs page: markdown cells as they are, code cells as (shown, not re-run) code, then their outputs."""
    meta = nb.metadata.get("mechkit", {})
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source.strip() + "\n")
        elif "injected-parameters" in cell.metadata.get("tags", []):
            continue  # the values this copy ran with are named in the footer
        elif cell.cell_type == "code" and cell.source.strip():
            parts.append("<!-- not run: a tutorial cell; tests/test_docs.py executes the whole notebook -->\n"
                         "```python\n" + cell.source.rstrip() + "\n```\n")
            parts += [_output_md(o) for o in _merged(cell.get("outputs", []))]
    footer = (f"\n---\n\n*Outputs above: executed on the embedded model (`{meta.get('model', '?')}`) by "
              f"`{meta.get('command', COMMAND)}` in {meta.get('seconds', '?')} s, from `notebooks/{source.name}`. "
              "The test suite executes the same notebook on a tiny model.*\n")
    return "\n".join(parts) + footer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute the tutorial notebooks and store them for the docs.")
    parser.add_argument("names", nargs="*", help="notebook stems or page names (default: all)")
    parser.add_argument("--model", default="llama", help="the model the stored outputs come from")
    args = parser.parse_args(argv)
    for source in sources():
        if args.names and source.stem not in args.names and page_name(source) not in args.names:
            continue
        start = time.perf_counter()
        print(f"executing {source.name} on {args.model} ...", flush=True)
        nb = execute(source, {"MODEL": args.model}, timeout=3600)
        path = store(source, nb, args.model, time.perf_counter() - start)
        print(f"  wrote {path.relative_to(ROOT)} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
