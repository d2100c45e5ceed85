"""A plugin's code as part of its resume key: what decides the steps it keeps, so an edit between an interrupt
and the rerun starts fresh instead of resuming on steps the old code computed.

A plugin in a file is keyed by that file, its package, the user's own modules it imports and mechkit's code; a
plugin with no source file (a notebook cell, ``exec``) by what its code reaches (:class:`_Reach`), bounded.
The runner puts :func:`plugin_code` into the key beside the plugin's name, version, options, seed and model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mechkit.plugin import Plugin


def plugin_code(cls: type[Plugin]) -> str:
    """SHA-256 of the plugin's code: the file that defines it, every ``.py`` file of the top-level package it
    lives in (a plugin's helper module), the user's own modules it imports (:class:`_Reach`: a single-file
    plugin's ``import myhelpers`` from its folder had no package to cover it) and mechkit's own code (which
    every plugin computes through: a third-party plugin's key covered only its own package, so mechkit edited
    under the same version between a kill and the rerun resumed on steps the old code computed). A plugin
    edited between a kill and the rerun without a version bump (a third-party one in development, say), in its
    own file or a module it imports, starts fresh instead of resuming on steps its old code computed; where the
    source cannot be read (a notebook cell), what its code reaches stands in (:func:`_compiled_code`)."""
    import inspect
    import sys

    try:
        own = Path(inspect.getsourcefile(cls) or "")
        digest = hashlib.sha256(own.read_bytes())
    except (OSError, TypeError):  # a class defined in a notebook cell or by exec: no file to read
        return _compiled_code(cls)
    top = sys.modules.get(cls.__module__.partition(".")[0])
    roots = [Path(p) for p in getattr(top, "__path__", [])] if top is not None else []
    if cls.__module__.partition(".")[0] == "mechkit":  # built-in plugins live beside mechkit's package
        roots.append(own.parent)
    mechkit_root = sys.modules.get("mechkit")  # a third-party plugin computes through mechkit's code too
    roots += [Path(p) for p in getattr(mechkit_root, "__path__", [])]
    digest.update(package_code(tuple(sorted({str(r) for r in roots}))).encode())
    _Reach(digest).file(str(own), cls.__module__)  # the user's modules it imports (none for a built-in plugin)
    return digest.hexdigest()


def _compiled_code(cls: type[Plugin]) -> str:
    """SHA-256 of what a plugin class's code reaches, where its source file cannot be read (a notebook cell,
    exec), and of mechkit's own code: its key was the name and version alone, so a cell edited between an
    interrupt and the rerun resumed on steps the old code computed. The class's functions counted by their
    bytecode alone missed a default argument, a closure's value, a ``@property``'s body, and the cell's globals
    and helper functions the code reads: :class:`_Reach` follows all of these."""
    import sys

    digest = hashlib.sha256()
    _Reach(digest).plugin_class(cls)
    mechkit_root = sys.modules.get("mechkit")
    roots = tuple(sorted(str(p) for p in getattr(mechkit_root, "__path__", [])))
    digest.update(package_code(roots).encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def package_code(roots: tuple[str, ...]) -> str:
    """SHA-256 of every ``.py`` file under ``roots`` (names and bytes), read once per process: the code of a
    process does not change while it runs."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
            except OSError:
                continue
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """The folders whose code is not the user's own: the standard library, site-packages (their versions are
    in the key: :func:`library_versions`) and mechkit's package (:func:`package_code` covers it), symlinked
    parts of a development checkout included."""
    import site
    import sys
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {*site.getsitepackages(), site.getusersitepackages()}
    for root in getattr(sys.modules.get("mechkit"), "__path__", []):
        dirs.add(root)
        with contextlib.suppress(OSError):
            dirs |= {str(child) for child in Path(root).iterdir() if child.is_symlink()}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _users_file(path: Any) -> bool:
    """Whether ``path`` is a source file of the user's own (not the standard library's, an installed
    package's or mechkit's)."""
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
        return False
    real = os.path.realpath(path)
    parts = Path(real).parts
    return "site-packages" not in parts and "dist-packages" not in parts and not real.startswith(_library_dirs())


def _module_file(name: str) -> str | None:
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


class _Reach:
    """What a plugin's code reaches, fed to one digest for its resume key, bounded: its functions' code
    (nested code objects in it), their defaults and keyword defaults, the values their closures hold, the
    functions under ``property``/``staticmethod``/``classmethod``/``functools.partial``/``__wrapped__``, and
    the globals the code reads by name (``co_names``, nested code included): functions and classes followed
    (each once), modules of the user's own by their source file and the user's modules it imports, mechkit's,
    the standard library's and installed packages' by name (their code is in the key already), tensors and
    arrays by their bytes, other values by their repr without addresses. Past :data:`OBJECTS` objects,
    :data:`FILES` files, :data:`BYTES` bytes or :data:`DEPTH` levels the rest is not told apart (safety.md)."""

    OBJECTS, FILES, BYTES, DEPTH, ITEMS, REPR = 4000, 256, 64 << 20, 40, 100_000, 10_000

    def __init__(self, digest: Any) -> None:
        self.digest, self.seen, self.kept, self.files = digest, {}, [], set()
        self.objects, self.bytes = self.OBJECTS, self.BYTES

    def put(self, *parts: Any) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode("utf-8", "backslashreplace")
            self.digest.update(len(data).to_bytes(8, "little") + data)

    def shown(self, value: Any) -> str:
        """A value's repr, capped and without the addresses a default repr holds (another each process)."""
        try:
            text = repr(value)[: self.REPR]
        except Exception:  # a repr that fails: its type stands in
            text = f"<{type(value).__qualname__}>"
        return re.sub(r" at 0x[0-9a-fA-F]+", "", text)

    def plugin_class(self, cls: type) -> None:
        """The plugin class itself, followed whatever module it names (a cell's class names ``__main__`` or
        ``builtins``)."""
        self.seen[id(cls)] = len(self.seen)
        self.put("plugin", cls.__qualname__)
        for base in cls.__bases__:
            self.feed(base, 1)
        self.class_body(cls)

    def feed(self, value: Any, depth: int = 0) -> None:
        import types

        if value is None or isinstance(value, bool | int | float | complex | str | bytes):
            self.put(type(value).__name__, value if isinstance(value, bytes) else self.shown(value))
            return
        if self.objects <= 0 or depth > self.DEPTH:
            self.put("…")  # bounded work: the rest is not told apart
            return
        if id(value) in self.seen:
            self.put("seen", self.seen[id(value)])
            return
        self.seen[id(value)] = len(self.seen)
        self.kept.append(value)  # ids stay unique while the walk runs
        self.objects -= 1
        depth += 1
        if isinstance(value, types.FunctionType):
            self.function(value, depth)
        elif isinstance(value, types.MethodType | staticmethod | classmethod):
            self.put(type(value).__name__)
            self.feed(value.__func__, depth)
        elif isinstance(value, property):
            self.put("property")
            for part in (value.fget, value.fset, value.fdel):
                self.feed(part, depth)
        elif isinstance(value, functools.partial):
            self.put("partial")
            for part in (value.func, value.args, value.keywords):
                self.feed(part, depth)
        elif isinstance(value, type):
            self.klass(value, depth)
        elif isinstance(value, types.ModuleType):
            self.module(value)
        elif isinstance(value, types.CodeType):
            self.code(value, {}, depth)
        elif isinstance(value, dict | list | tuple | set | frozenset):
            self.container(value, depth)
        else:
            self.other(value, depth)

    def function(self, fn: Any, depth: int) -> None:
        """A function of the user's own by its code, defaults, closure and the globals it reads; another's
        (mechkit's, a library's) by its name, as its code is in the key already."""
        code = fn.__code__
        if str(fn.__module__ or "").partition(".")[0] == "mechkit" or code.co_filename.startswith("<frozen ") or (
                os.path.isfile(code.co_filename) and not _users_file(code.co_filename)):
            self.put("function", fn.__module__, fn.__qualname__)
            return
        self.put("function", fn.__qualname__)
        if _users_file(code.co_filename):
            self.file(code.co_filename, fn.__module__ if isinstance(fn.__module__, str) else None)
        self.code(code, fn.__globals__, depth)
        self.feed(fn.__defaults__, depth)
        self.feed(fn.__kwdefaults__, depth)
        for cell in fn.__closure__ or ():
            try:
                self.feed(cell.cell_contents, depth)
            except ValueError:  # a cell not yet filled
                self.put("empty cell")
        if hasattr(fn, "__wrapped__"):
            self.feed(fn.__wrapped__, depth)

    def code(self, code: Any, names: dict, depth: int) -> None:
        import dis
        import marshal
        import types

        def portable(c: Any) -> Any:  # a notebook cell's file name is another each kernel
            consts = tuple(portable(k) if isinstance(k, types.CodeType) else k for k in c.co_consts)
            return c.replace(co_filename="", co_consts=consts)

        try:
            self.put(marshal.dumps(portable(code)))
        except ValueError:  # a constant marshal cannot write: its repr stands in
            self.put(self.shown(code.co_consts), code.co_code)
        read, imported, todo = set(), set(), [code]
        while todo:
            c = todo.pop()
            read |= set(c.co_names)
            imported |= {i.argval for i in dis.get_instructions(c) if i.opname == "IMPORT_NAME"}
            todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        for name in sorted(read):
            if name in names and not name.startswith("__"):
                self.put("global", name)
                self.feed(names[name], depth)
        for name in sorted(n for n in imported if isinstance(n, str) and n):
            self.file(_module_file(name), name)  # ``import myhelpers`` inside the function

    def klass(self, cls: type, depth: int) -> None:
        import sys

        module = sys.modules.get(cls.__module__)
        where = getattr(module, "__file__", None)
        found = module
        for part in cls.__qualname__.split("."):
            found = getattr(found, part, None)
        if cls.__module__.partition(".")[0] == "mechkit" or (where and not _users_file(where)) or (
                found is cls and not where and cls.__module__ != "__main__"):
            self.put("class", cls.__module__, cls.__qualname__)  # mechkit's, a library's or a built-in type
            return
        self.put("class", cls.__qualname__)  # a cell's, whatever module it names (exec's say "builtins")
        if _users_file(where):
            self.file(where, cls.__module__)
        for base in cls.__bases__:
            self.feed(base, depth)
        self.class_body(cls, depth)

    def class_body(self, cls: type, depth: int = 0) -> None:
        import types

        for name, value in sorted(vars(cls).items()):
            if name.startswith("__") and not isinstance(value, types.FunctionType | property | staticmethod | classmethod):
                continue  # __dict__, __doc__, __module__: not what the code does
            self.put("attr", name)
            self.feed(value, depth)

    def module(self, module: Any) -> None:
        where = getattr(module, "__file__", None)
        self.put("module", module.__name__)
        if module.__name__.partition(".")[0] != "mechkit" and _users_file(where):
            self.file(where, module.__name__)

    def file(self, path: Any, name: str | None) -> None:
        """A user's module by its bytes, and the user's modules it imports (``import myhelpers`` beside a
        single-file plugin), each once."""
        import ast
        import importlib.util

        if not _users_file(path) or os.path.realpath(path) in self.files:
            return
        self.files.add(os.path.realpath(path))
        if len(self.files) > self.FILES or self.bytes <= 0:
            self.put("…")
            return
        try:
            source = Path(path).read_bytes()
        except OSError:
            return
        self.bytes -= len(source)
        self.put("file", Path(path).name, source)
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        package = (name if Path(path).name == "__init__.py" else (name or "").rpartition(".")[0]) or None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                try:
                    base = importlib.util.resolve_name(base, package) if node.level else base
                except (ImportError, ValueError):
                    continue
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
            else:
                continue
            for target in targets:
                self.file(_module_file(target), target)

    def container(self, value: Any, depth: int) -> None:
        import itertools

        self.put(type(value).__name__, len(value))
        if isinstance(value, set | frozenset):  # the order a set iterates in is another each process
            for shown in sorted(self.shown(v) for v in list(value)[: self.ITEMS]):
                self.put(shown)
            return
        items = itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else value
        for i, item in enumerate(items):
            if i >= 2 * self.ITEMS or self.objects <= 0:
                self.put("…")
                return
            self.feed(item, depth)

    def other(self, value: Any, depth: int) -> None:
        """A tensor or array by its bytes (its repr elides the middle), an object with the default repr by
        its type and attributes, anything else by its repr."""
        import torch

        self.put("object", type(value).__module__, type(value).__qualname__)
        if isinstance(value, torch.Tensor):
            self.put(tuple(value.shape), value.dtype)
            if not value.is_meta and value.numel() * value.element_size() <= self.bytes:
                try:
                    flat = value.detach().reshape(-1).cpu().contiguous()
                    self.bytes -= flat.numel() * flat.element_size()
                    self.put(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
                except (RuntimeError, TypeError):  # a sparse or quantized tensor: its repr stands in
                    self.put(self.shown(value))
            return
        tobytes = getattr(value, "tobytes", None)
        if type(value).__module__ == "numpy" and callable(tobytes) and getattr(value, "nbytes", 1 << 62) <= self.bytes:
            self.bytes -= value.nbytes
            self.put(self.shown(getattr(value, "dtype", "")), tuple(getattr(value, "shape", ())), tobytes())
            return
        if type(value).__repr__ is object.__repr__ and isinstance(getattr(value, "__dict__", None), dict):
            self.feed(type(value), depth)
            self.feed(vars(value), depth)
            return
        self.put(self.shown(value))
