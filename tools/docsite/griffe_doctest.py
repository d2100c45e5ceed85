"""A griffe extension: the ``>>>`` examples in mechkit's docstrings shown as Python console blocks.

mechkit's docstrings carry runnable doctest examples (tests/test_doctests.py runs them). Markdown has
no notion of them, so without this their brackets read as links; the extension fences each run of
example lines (``>>>``/``...`` and the output under them) as ``pycon`` before mkdocstrings renders it.
"""

from __future__ import annotations

import re

from griffe import Extension

PROMPT = re.compile(r"^(\s*)(>>>|\.\.\.)( |$)")


def fence_examples(text: str) -> str:
    """Wrap each doctest example (prompt lines plus the output lines until a blank line) in a fence."""
    out, block, indent = [], [], ""
    for line in text.splitlines():
        prompt = PROMPT.match(line)
        if prompt and not block:
            indent = prompt.group(1)
        if prompt or (block and line.strip()):
            block.append(line[len(indent):] if line.startswith(indent) else line.strip())
            continue
        if block:
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            block = []
        out.append(line)
    if block:
        out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
    return "\n".join(out)


class DoctestFences(Extension):
    """Fence the doctest examples of every documented object's docstring."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_examples(obj.docstring.value)
