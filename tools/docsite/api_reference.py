"""The API reference page: every public name, found from the code rather than listed by hand.

The top-level API is ``mechkit._API`` (what ``import mechkit as mk`` offers); each public subpackage
contributes its ``__all__``. Names are resolved at build time to where they are defined, so a lazily
imported name (``mechkit.actvec``'s) is documented from its real module, and mkdocstrings renders its
docstring.
"""

from __future__ import annotations

import importlib
import inspect

# The subpackages whose ``__all__`` is public API, in the order a reader meets them.
MODULES = {
    "mechkit.hooking": "Hooks, recording and caches.",
    "mechkit.interventions": "Ablation, weight edits and head shuffles.",
    "mechkit.tasks": "Tasks and prompts.",
    "mechkit.eval": "Scoring prompts.",
    "mechkit.report": "Reports, tables and figures.",
    "mechkit.taskarith": "Weight-space task vectors (task arithmetic).",
    "mechkit.actvec": "Activation-space task vectors and function vectors.",
    "mechkit.pruning": "Pruning guided by interpretability.",
    "mechkit.compose": "The compositional study.",
    "mechkit.adapt": "Adaptive inference.",
    "mechkit.options.parsers": "Parsers for plugin options.",
    "mechkit.errors": "Errors.",
}


def _target(owner: str, name: str) -> str | None:
    """The dotted path where ``owner.name`` is defined, or None for data (constants are not documented)."""
    module = importlib.import_module(owner)
    obj = getattr(module, name)
    if inspect.ismodule(obj):
        return obj.__name__
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return None
    return f"{obj.__module__}.{obj.__qualname__}"


def _entry(label: str, target: str) -> str:
    return f"### `{label}`\n\n::: {target}\n    options:\n      show_root_heading: false\n      heading_level: 4\n"


def _public(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", "") == module_name]
    return list(names)


def page() -> str:
    """The whole page, as Markdown with mkdocstrings directives."""
    import mechkit

    lines = ["# API reference", "",
             "Generated when the site is built: the top-level names of `import mechkit as mk`, then each public",
             "subpackage's `__all__`. Examples in docstrings (`>>>`) are run by the test suite on tiny models.", "",
             "## mechkit", ""]
    for name in mechkit._API:
        target = _target("mechkit", name)
        if target:
            lines.append(_entry(f"mk.{name}", target))
    for module_name, summary in MODULES.items():
        lines += [f"## {module_name}", "", summary, ""]
        for name in _public(module_name):
            target = _target(module_name, name)
            if target:
                lines.append(_entry(f"{module_name}.{name}", target))
    return "\n".join(lines)
