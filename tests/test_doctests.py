"""Every ``>>>`` example in mechkit's docstrings runs here, so documentation cannot rot.

Examples use tiny models (``tiny:FAMILY``) and temporary directories; an example that needs the
embedded model or the hub is marked ``# doctest: +SKIP`` and says so in its text.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names() -> list[str]:
    names = {"mechkit"}
    for package in ("mechkit", "mechkit.plugins", "mechkit.cli"):  # plugins/ and cli/ map into mechkit
        pkg = importlib.import_module(package)
        names |= {package} | {m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")}
    return sorted(names)


def _examples(module) -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module.__name__) if t.examples]


@pytest.mark.parametrize("name", _module_names())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in _examples(module):
        runner.run(test, out=lambda _text: None)
    if runner.failures:
        failed = [t.name for t in _examples(module)]
        report = doctest.DocTestRunner(optionflags=FLAGS)
        lines: list[str] = []
        for test in _examples(module):
            report.run(test, out=lines.append)
        pytest.fail(f"{runner.failures} failing example(s) in {failed}:\n" + "".join(lines)[-4000:])


def test_the_examples_are_many_and_run():
    """A guard against a finder that silently finds nothing: the suite holds real examples."""
    total = sum(len(t.examples) for n in _module_names() for t in _examples(importlib.import_module(n))
                if not all(e.options.get(doctest.SKIP) for e in t.examples))
    assert total >= 60, f"only {total} docstring examples found"
