"""What a plugin's source names beyond its plain imports: modules imported by a string, files run through
``exec``, ``eval``, ``compile`` or a file loader under any alias, and which files are the user's own (not the
standard library's, an installed package's or mechkit's). Read from the source as written: what is computed
at run time is recorded as it is read instead (:mod:`mechkit.io.reads`).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

from mechkit.io.reads import library_dirs


def users_file(path: Any, any_name: bool = False) -> bool:
    """Whether ``path`` is a source file of the user's own (not the standard library's, an installed
    package's or mechkit's): a ``.py`` file, or any file with ``any_name`` (code ``exec`` reads from a
    ``helpers.txt``)."""
    if not isinstance(path, str) or not (any_name or path.endswith(".py")) or not os.path.isfile(path):
        return False
    real = os.path.realpath(path)
    parts = Path(real).parts
    return "site-packages" not in parts and "dist-packages" not in parts and not real.startswith(library_dirs())


def module_file(name: str) -> str | None:
    """The source file of module ``name``, found without importing it (a key must not run the user's code)."""
    import importlib.machinery
    import sys

    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    path, spec = None, None
    parts = name.split(".")
    for i in range(len(parts)):
        parent = sys.modules.get(".".join(parts[:i + 1])) if i < len(parts) - 1 else None
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), path)
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return None
        path = getattr(parent, "__path__", None) or spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None
    return spec.origin if spec is not None and spec.has_location else None


# The functions that import or run a module named by a string, and the keyword that names it.
IMPORTERS = frozenset({"import_module", "__import__", "run_module"})
_NAME_KEYWORDS = ("name", "mod_name")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def imports_by_name(node: Any) -> bool:
    """``node`` (an ``ast.Call``) is ``importlib.import_module(...)``, ``import_module(...)`` or
    ``__import__(...)``: a helper loaded so is as much the plugin's code as one loaded by ``import``, and an
    edit of it between a kill and the rerun mixed two versions' steps."""
    import ast

    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name in IMPORTERS and (bool(node.args) or any(k.arg in _NAME_KEYWORDS for k in node.keywords))


def named_module(node: Any, package: str | None) -> str | None:
    """The module an import-by-name call names with a string literal (a relative one resolved against its
    ``package`` argument, or the file's own package), else None: a name computed at run time is not known
    before the run (docs/guides/safety.md says so)."""
    import ast
    import importlib.util

    first = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg in _NAME_KEYWORDS)
    if not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return None
    given = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
    anchor = given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else package
    try:
        return importlib.util.resolve_name(first.value, anchor) if first.value.startswith(".") else first.value
    except (ImportError, ValueError):
        return None


def scripts(value: Any, folders: list[Path], any_name: bool = False) -> list[str]:
    """The user's own files a string constant names: absolute, or relative to the plugin's folder or to the
    working directory (``runpy.run_path``, ``open`` and ``spec_from_file_location`` resolve a relative name
    against the latter). A ``.py`` name anywhere in the code (``run_path``, ``spec_from_file_location``), and any
    name in code that calls ``exec``, ``eval`` or ``compile`` (``any_name``: ``exec(open("helpers.txt").read())``,
    or the name in a constant: ``HELPER = "helpers.txt"``).
    A name built at run time from pieces none of which names the file is not known before the run
    (docs/guides/safety.md)."""
    if not isinstance(value, str) or not (any_name or value.endswith(".py")) or "\n" in value or not value \
            or len(value) > 4096 or "\0" in value:
        return []
    found = [value] if os.path.isabs(value) else [str(folder / value) for folder in folders]
    return sorted({f for f in found if users_file(f, any_name)})


RUNS_CODE = frozenset({"exec", "eval", "compile"})  # the builtins that run code: a constant may name its file
# The loaders that take a file of code by its name, whatever its suffix: a literal among their arguments names one.
LOADS_FILE = frozenset({"SourceFileLoader", "SourcelessFileLoader", "spec_from_file_location", "run_path",
                        "load_source"})


def runners(tree: Any) -> tuple[set[str], set[str], set[str]]:
    """The names a file calls the builtin ``exec``/``eval``/``compile`` by, the names of the ``builtins`` module
    in it, and the names it calls a file loader by, aliases included (``import builtins as b``, ``from builtins
    import exec as run``, ``from importlib.machinery import SourceFileLoader as L``); a name the file binds
    otherwise is not the builtin (``from re import compile``: every constant naming a file, a log the plugin
    writes, became part of the key, which then changed on every run)."""
    import ast

    runs, modules, loaders, bound = set(RUNS_CODE), {"builtins", "__builtins__"}, set(LOADS_FILE), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "builtins" and a.asname}
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                name = a.asname or a.name
                if node.module == "builtins" and a.name in RUNS_CODE:
                    runs.add(name)
                elif a.name in LOADS_FILE:
                    loaders.add(name)
                else:  # from re import compile: not the builtin, in whatever scope
                    bound.add(name)
    for node in tree.body:  # what the module itself binds under a builtin's name (a method of a class does not:
        # a Helper.eval hid every eval call of the file, and a helper it ran was left out of the key)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # compile = re.compile
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
    return runs - (bound & RUNS_CODE), modules, loaders


def runs_code(node: Any, runners: tuple[set[str], set[str], set[str]]) -> bool:
    """A call of the builtin ``exec``/``eval``/``compile`` by any of its names (:func:`runners`), not any
    ``.compile`` or ``.eval`` (``re.compile``, ``model.eval()``)."""
    import ast

    if not isinstance(node, ast.Call):
        return False
    runs, modules, _ = runners
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in runs
    if isinstance(func, ast.Subscript):  # __builtins__["exec"](...)
        return isinstance(func.value, ast.Name) and func.value.id in modules
    return isinstance(func, ast.Attribute) and func.attr in RUNS_CODE and isinstance(func.value, ast.Name) \
        and func.value.id in modules


def loads_file(node: Any, runners: tuple[set[str], set[str], set[str]]) -> bool:
    """A call of a loader that runs a file of code by its name (``SourceFileLoader("h", "helpers.txt")``), by
    any of its names."""
    import ast

    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in runners[2]
    return isinstance(func, ast.Attribute) and func.attr in LOADS_FILE and not (
        isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"))  # a method of the user's own


def installed_file(path: Any) -> bool:
    """Whether ``path`` lies in an installed package (a site-packages folder): neither the user's own file
    nor the standard library's (Python's version is in the key: ``runner.library_versions``)."""
    if not isinstance(path, str) or not path:
        return False
    parts = Path(os.path.realpath(path)).parts
    return "site-packages" in parts or "dist-packages" in parts


@functools.lru_cache(maxsize=4)
def distributions(search_path: tuple[str, ...]) -> dict[str, list[str]]:
    """The distributions that installed each top-level module, found once per search path (reading every
    installed package's records takes a fifth of a second)."""
    from importlib import metadata

    del search_path  # the cache's key: a folder added to sys.path holds other packages
    return metadata.packages_distributions()


def python_written(cls: type) -> bool:
    """Whether ``cls`` is written in Python (its instances' state lies in ``__dict__`` and ``__slots__``), not in
    C (a ``SimpleNamespace``'s, a ``datetime``'s, a compiled pattern's: its state is read through pickling's
    reduce). A heap type alone said "Python" of C types made by ``PyType_FromSpec`` (``re.Pattern``,
    ``operator.itemgetter``, ``array.array``, ``struct.Struct``), whose state no ``__dict__`` holds, so two
    patterns gave one key: a class of its own whose attributes include a descriptor that C code defines for
    it (a method, a member, a getset other than ``__dict__``/``__weakref__``, not one of its ``__slots__``)
    is C's."""
    import types

    if not cls.__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: a static type is C's
        return False
    own = vars(cls)
    for name, value in own.items():
        kind = type(value)
        if kind not in (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                        types.MemberDescriptorType, types.GetSetDescriptorType):
            continue
        if getattr(value, "__objclass__", None) is not cls or name in ("__dict__", "__weakref__") or (
                kind is types.MemberDescriptorType and "__slots__" in own):
            continue  # another type's descriptor kept as an attribute (f = str.upper), or Python's own
        return False
    return True
