"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages generated from the code at build time.

- ``reference/cli.md`` from the commands and the plugins' ``Option`` declarations;
- ``reference/api.md`` from ``mechkit._API`` and each public subpackage's ``__all__``;
- ``tutorials/<name>.md`` from the executed notebooks in ``notebooks/executed/``;
- ``benchmarks.md`` from ``bench/README.md``, which stays the benchmarks' one source;
- the table of ``guides/architectures.md`` from the measured matrix ``docs/architectures.json``.

Generated pages exist only in the build, so none of them can be stale in the repository.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File  # noqa: E402

from mechkit.io.quiet import quiet  # noqa: E402
from tools.docsite import api_reference, architectures, cli_reference, notebooks  # noqa: E402


def benchmarks_page() -> str:
    """bench/README.md as a docs page: links to files beside it become plain text (they are not pages)."""
    text = (ROOT / "bench" / "README.md").read_text()
    text = re.sub(r"\[([^\]]+)\]\((?!https?://|#)([^)]+)\)", r"\1 (`bench/\2`)", text)
    return text


def generated_pages() -> dict[str, str]:
    """Every generated page, by its path under docs/."""
    pages = {"reference/cli.md": cli_reference.page(), "reference/api.md": api_reference.page(),
             "benchmarks.md": benchmarks_page()}
    for source in notebooks.sources():
        nb = notebooks.executed(source)
        if nb is None:
            raise RuntimeError(f"notebooks/executed/{source.stem}.ipynb is missing: run `make notebooks`")
        pages[f"tutorials/{notebooks.page_name(source)}.md"] = notebooks.to_markdown(nb, source)
    return pages


def on_files(files, config):
    with quiet():  # the API pages import all of mechkit: no third-party warnings in the build log
        pages = generated_pages()
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    return architectures.render(markdown)
