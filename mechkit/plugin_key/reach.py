"""The walk over what a plugin's code reaches, fed to its resume key's digest (:class:`Reach`), bounded."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from mechkit.plugin_key.source import (
    IMPORTERS,
    MODULE_NAME,
    RUNS_CODE,
    distributions,
    imports_by_name,
    installed_file,
    loads_file,
    module_file,
    named_module,
    python_written,
    runners,
    runs_code,
    scripts,
    users_file,
)


class Reach:
    """What a plugin's code reaches, fed to one digest for its resume key, bounded: its functions' code
    (nested code objects in it), their defaults and keyword defaults, the values their closures hold, the
    functions under ``property``/``staticmethod``/``classmethod``/``functools.partial``/``__wrapped__``, and
    the globals the code reads by name (``co_names``, nested code included): functions and classes followed
    (each once), modules of the user's own by their source file and the user's modules it imports, mechkit's
    and the standard library's by name (their code is in the key already), installed packages' by their
    distribution's name and version (:meth:`installed`), tensors and arrays by their bytes, an object by its
    class (its methods: a method edited is another key) and its state (``__dict__``, ``__slots__``, or
    pickling's reduce for a type written in C), never by a repr that a set's hash order or an elided middle
    decides. A set's items and a dict's items count in an order of their own content (:meth:`order`), not
    the hash order another process has. Reading a user object that raises (a nested tensor's sizes, a
    ``__repr__`` that fails) puts its type instead. Past :data:`OBJECTS` objects, :data:`FILES` files,
    :data:`BYTES` bytes (a tensor past them by an evenly spaced sample of :data:`SAMPLE` elements or more)
    or :data:`DEPTH` levels the rest is not told apart (safety.md)."""

    OBJECTS, FILES, BYTES, DEPTH, ITEMS, REPR, ORDER, SAMPLE = 4000, 256, 64 << 20, 40, 100_000, 10_000, 64, 1024

    def __init__(self, digest: Any) -> None:
        self.digest, self.seen, self.kept, self.files, self.dists = digest, {}, [], set(), set()
        self.objects, self.bytes = self.OBJECTS, self.BYTES

    def put(self, *parts: Any) -> None:
        for part in parts:
            data = part if type(part) is bytes else str(part).encode("utf-8", "backslashreplace")
            self.digest.update(len(data).to_bytes(8, "little") + data)

    def shown(self, value: Any) -> str:
        """A value's repr, capped and without the addresses a default repr holds (another each process)."""
        try:
            text = repr(value)[: self.REPR]
        except Exception:  # a repr that fails: its type stands in
            text = f"<{type(value).__qualname__}>"
        return re.sub(r" at 0x[0-9a-fA-F]+", "", text)

    @staticmethod
    def scalar(value: Any) -> bytes | None:
        """A plain value's type and whole content, read without a subclass's code (a repr capped a long
        string at its start and ran a user's ``__repr__``), or None for anything else."""
        if value is None:
            return b"NoneType\0"
        kind = type(value)  # never ``isinstance``: it reads ``__class__`` through a user's ``__getattribute__``
        if issubclass(kind, bool | int):
            data = hex(int.__index__(value)).encode()
        elif issubclass(kind, float | complex):
            data = (float.__repr__(value) if issubclass(kind, float) else complex.__repr__(value)).encode()
        elif issubclass(kind, str):
            data = str.encode(value, "utf-8", "surrogatepass")
        elif issubclass(kind, bytes):
            data = bytes.__getitem__(value, slice(None))
        else:
            return None
        return type(value).__name__.encode("utf-8", "backslashreplace") + b"\0" + data

    def plugin_class(self, cls: type) -> None:
        """The plugin class itself, followed whatever module it names (a cell's class names ``__main__`` or
        ``builtins``)."""
        self.seen[id(cls)] = len(self.seen)
        self.put("plugin", cls.__qualname__)
        for base in cls.__bases__:
            self.feed(base, 1)
        self.class_body(cls)

    def feed(self, value: Any, depth: int = 0) -> None:
        plain = self.scalar(value)
        if plain is not None:
            self.put(plain[: max(self.bytes, self.REPR)], len(plain))  # a long string counts against the bytes
            self.bytes -= len(plain) if len(plain) > self.REPR else 0
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
        try:
            self.dispatch(value, depth + 1)
        except Exception:  # a user object that raises when read (a nested tensor's sizes): its type stands in
            try:
                self.put("unreadable", type(value).__module__, type(value).__qualname__)
            except Exception:
                self.put("unreadable")

    def dispatch(self, value: Any, depth: int) -> None:
        import collections
        import types
        import weakref

        kind = type(value)
        if issubclass(kind, weakref.WeakKeyDictionary | weakref.WeakValueDictionary | weakref.WeakSet):
            self.put("weak", kind.__qualname__)  # a cache by nature (singledispatch's dispatch_cache fills on each
            return  # call): followed, a helper called once changed the key, and an interrupted run never resumed
        if issubclass(kind, types.FunctionType):
            self.function(value, depth)
        elif issubclass(kind, types.MethodType | staticmethod | classmethod):
            self.put(type(value).__name__)
            self.feed(value.__func__, depth)
            if issubclass(kind, types.MethodType):
                self.feed(value.__self__, depth)  # the instance (or class) the method is bound to
        elif issubclass(kind, property):
            self.put("property")
            for part in (value.fget, value.fset, value.fdel):
                self.feed(part, depth)
        elif issubclass(kind, functools.partial):
            self.put("partial")
            for part in (value.func, value.args, value.keywords):
                self.feed(part, depth)
        elif issubclass(kind, type):
            self.klass(value, depth)
        elif issubclass(kind, types.ModuleType):
            self.module(value)
        elif issubclass(kind, types.CodeType):
            self.code(value, {}, depth)
        elif issubclass(kind, dict | list | tuple | set | frozenset | collections.deque):
            self.container(value, depth)
        else:
            self.other(value, depth)

    def order(self, values: list, depth: int) -> list[int]:
        """The indices of ``values`` in an order of their own content: a set iterates (and a dict built from
        one was filled) in hash order, another each process (PYTHONHASHSEED), so the key never matched on a
        rerun. A plain value is placed by its bytes, anything else (a function in a frozenset) by a walk of
        its own, bounded (:data:`ORDER` objects, shared out before any is walked, so what one gets does not
        hang on the order they come in)."""
        plain = [self.scalar(v) for v in values]
        rest = max(1, sum(p is None for p in plain))
        objects, size = max(1, min(self.ORDER, self.objects // rest)), min(1 << 20, max(self.bytes, 0) // rest)
        places = []
        for value, data in zip(values, plain, strict=True):
            if data is not None:
                places.append(b"\0" + hashlib.sha256(data).digest())
                continue
            alone = Reach(hashlib.sha256())
            alone.objects, alone.bytes, alone.FILES = objects, size, 0
            alone.feed(value, depth)
            self.objects -= objects - alone.objects
            self.bytes -= size - max(alone.bytes, 0)
            places.append(b"\1" + alone.digest.digest())
        return sorted(range(len(values)), key=places.__getitem__)

    def function(self, fn: Any, depth: int) -> None:
        """A function of the user's own by its code, defaults, closure and the globals it reads; mechkit's and
        the standard library's by name, an installed package's by its version too, as their code is in the
        key already."""
        code = fn.__code__
        if str(fn.__module__ or "").partition(".")[0] == "mechkit" or code.co_filename.startswith("<frozen ") or (
                os.path.isfile(code.co_filename) and not users_file(code.co_filename)):
            self.put("function", fn.__module__, fn.__qualname__)
            self.installed(fn.__module__, code.co_filename)
            self.held(fn, depth)  # a library's wrapper (@torch.no_grad()) holds the user's function
            return
        self.put("function", fn.__qualname__)
        if users_file(code.co_filename):
            self.file(code.co_filename, fn.__module__ if isinstance(fn.__module__, str) else None)
        self.code(code, fn.__globals__, depth)
        self.feed(fn.__defaults__, depth)
        self.feed(fn.__kwdefaults__, depth)
        self.held(fn, depth)

    def held(self, fn: Any, depth: int) -> None:
        """The values a function's closure holds and the function it wraps (``__wrapped__``), followed for a
        library's function too: a decorator's wrapper (``@torch.no_grad()``, any installed package's
        ``functools.wraps``) lives in the library's file and was keyed by its name alone, hiding the user's
        body it calls, so an edited helper resumed on steps the old one computed."""
        for cell in fn.__closure__ or ():
            try:
                self.feed(cell.cell_contents, depth)
            except ValueError:  # a cell not yet filled
                self.put("empty cell")
        if "__wrapped__" in fn.__dict__:
            self.feed(fn.__dict__["__wrapped__"], depth)

    def code(self, code: Any, names: dict, depth: int) -> None:
        import builtins
        import dis
        import marshal
        import types

        def portable(c: Any) -> Any:  # a notebook cell's file name is another each kernel
            consts = tuple(portable(k) if isinstance(k, types.CodeType) else k for k in c.co_consts)
            return c.replace(co_filename="", co_consts=consts)

        try:
            self.put(marshal.dumps(portable(code)))  # a frozenset constant: marshal writes it sorted
        except ValueError:  # a constant marshal cannot write: its repr stands in
            self.put(self.shown(code.co_consts), code.co_code)
        read, imported, run_files, todo = set(), set(), set(), [code]
        while todo:
            c = todo.pop()
            read |= set(c.co_names)
            imported |= {i.argval for i in dis.get_instructions(c) if i.opname == "IMPORT_NAME"}
            if IMPORTERS & set(c.co_names):  # ``importlib.import_module("myhelpers")``: a module named by a string
                imported |= {k for k in c.co_consts if isinstance(k, str) and MODULE_NAME.fullmatch(k)
                             and users_file(module_file(k))}
            everything = any(i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval in RUNS_CODE
                             and names.get(i.argval, getattr(builtins, i.argval)) is getattr(builtins, i.argval)
                             for i in dis.get_instructions(c))  # the builtin itself, not re.compile or .eval()
            run_files |= {f for k in c.co_consts for f in scripts(k, [Path.cwd()], everything)}
            todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        for name in sorted(read):
            if name in names and not name.startswith("__"):
                self.put("global", name)
                self.feed(names[name], depth)
        for name in sorted(n for n in imported if isinstance(n, str) and n):
            self.file(module_file(name), name)  # ``import myhelpers`` inside the function
        for script in sorted(run_files):
            self.file(script, None, any_name=True)

    def klass(self, cls: type, depth: int) -> None:
        import sys
        import types

        module = sys.modules.get(cls.__module__)
        where = getattr(module, "__file__", None)
        found = module
        for part in cls.__qualname__.split("."):  # read, not ``getattr``: a lazy module's ``__getattr__`` imports
            found = vars(found).get(part) if issubclass(type(found), type | types.ModuleType) else None
        if cls.__module__.partition(".")[0] == "mechkit" or (where and not users_file(where)) or (
                found is cls and not where and cls.__module__ != "__main__"):
            self.put("class", cls.__module__, cls.__qualname__)  # mechkit's, a library's or a built-in type
            self.installed(cls.__module__, where)
            return
        self.put("class", cls.__qualname__)  # a cell's, whatever module it names (exec's say "builtins")
        if users_file(where):
            self.file(where, cls.__module__)
        for base in cls.__bases__:
            self.feed(base, depth)
        self.class_body(cls, depth)

    def class_body(self, cls: type, depth: int = 0) -> None:
        import types

        for name, value in sorted(vars(cls).items()):
            if name.startswith("__") and not issubclass(type(value), types.FunctionType | property | staticmethod | classmethod):
                continue  # __dict__, __doc__, __module__: not what the code does
            self.put("attr", name)
            self.feed(value, depth)

    def module(self, module: Any) -> None:
        where = getattr(module, "__file__", None)
        self.put("module", module.__name__)
        if module.__name__.partition(".")[0] != "mechkit" and users_file(where):
            self.file(where, module.__name__)
        else:
            self.installed(module.__name__, where)

    def installed(self, name: Any, path: Any) -> None:
        """An installed package the code reaches (a helper the user installed, ``pip install -U mylab-utils``
        between a kill and the rerun) by its distribution's name and version, or by its file's bytes where no
        distribution claims it: its code counted by name alone resumed on steps the old version computed.
        Mechkit's code and the standard library's are in the key already; each package counts once."""
        import sys
        from importlib import metadata

        top = name.partition(".")[0] if isinstance(name, str) else ""
        if not top or top == "mechkit" or top in self.dists:
            return
        self.dists.add(top)
        root = sys.modules.get(top)
        where = path if isinstance(path, str) and path else getattr(root, "__file__", None)
        where = where or next(iter(getattr(root, "__path__", None) or []), None)
        if not installed_file(where):
            return  # the standard library's, a built-in module's: Python's version is in the key
        names = sorted(set(distributions(tuple(sys.path)).get(top, ())))
        for dist in names:
            try:
                self.put("installed", dist, metadata.version(dist))
            except metadata.PackageNotFoundError:
                self.put("installed", dist, "absent")
        if names or not os.path.isfile(where) or len(self.files) >= self.FILES or self.bytes <= 0:
            return
        with contextlib.suppress(OSError):  # a module no distribution claims (copied into site-packages)
            source = Path(where).read_bytes()
            self.files.add(os.path.realpath(where))
            self.bytes -= len(source)
            self.put("installed file", Path(where).name, source)

    def file(self, path: Any, name: str | None, any_name: bool = False) -> None:
        """A user's module by its bytes, and the user's modules it imports (``import myhelpers`` beside a
        single-file plugin) or runs by a file name, each once; an installed package it imports by its version
        (:meth:`installed`). ``any_name``: a file of code not named ``.py`` (what ``exec`` reads)."""
        import ast
        import importlib.util

        if not users_file(path, any_name):
            self.installed(name, path)
            return
        if os.path.realpath(path) in self.files:
            return
        self.files.add(os.path.realpath(path))
        if len(self.files) > self.FILES or self.bytes <= 0:
            self.put("…")
            return
        try:
            size = os.path.getsize(path)
            if size > self.bytes:  # past the bound, read by its size and time, never loaded whole; the bound is
                stat_ = os.stat(path)  # left for the files after it (it ended the key's reading of every later one)
                self.put("file", Path(path).name, size, stat_.st_mtime_ns, stat_.st_ctime_ns)
                return
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
        folders = [Path(path).parent, Path.cwd()]
        named = runners(tree)  # exec/eval/compile or a file loader, by any name: then a constant naming any
        # file of the user's may be code it runs (HELPER = "helpers.txt"; exec(...) or SourceFileLoader("h", HELPER))
        any_code = any(runs_code(node, named) or loads_file(node, named) for node in ast.walk(tree))
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
            elif isinstance(node, ast.Call) and imports_by_name(node):
                targets = [named_module(node, package)]
            elif isinstance(node, ast.Constant) and (found := scripts(node.value, folders, any_code)):
                for script in found:  # run_path, spec_from_file_location, what exec reads: a file by its name
                    self.file(script, None, any_name=True)
                continue
            elif loads_file(node, named):  # SourceFileLoader("h", "helpers.txt"): its literal arguments
                for inner in ast.walk(node):
                    for script in scripts(getattr(inner, "value", None), folders, any_name=True):
                        self.file(script, None, any_name=True)
                continue
            else:
                continue
            for target in targets:
                if target:
                    self.file(module_file(target), target)

    def container(self, value: Any, depth: int) -> None:
        """A dict, list, tuple, set or deque by its items (a subclass's own methods never run: a user's
        ``items()`` or ``__len__`` may raise or load), a subclass by its class and attributes too; a set's and
        a dict's items in an order of their content (:meth:`order`)."""
        import collections
        import itertools

        kind = type(value)
        base = next(b for b in (dict, list, tuple, set, frozenset, collections.deque) if issubclass(kind, b))
        self.put(base.__name__, base.__len__(value))
        if type(value) is not base:
            self.feed(type(value), depth)  # a namedtuple's, a user subclass's methods
            if issubclass(kind, collections.defaultdict):
                self.feed(value.default_factory, depth)
            self.state(value, depth)
        if base is dict:
            pairs = list(itertools.islice(dict.items(value), self.ITEMS))
            items = itertools.chain.from_iterable(pairs[i] for i in self.order([k for k, _ in pairs], depth))
        elif base in (set, frozenset):
            members = list(itertools.islice(base.__iter__(value), self.ITEMS))
            items = (members[i] for i in self.order(members, depth))
        else:
            items = itertools.islice(base.__iter__(value), 2 * self.ITEMS)
        for item in items:
            if self.objects <= 0:
                break
            self.feed(item, depth)
        if self.objects <= 0 or base.__len__(value) > (self.ITEMS if base in (dict, set, frozenset) else 2 * self.ITEMS):
            self.put("…")

    def state(self, value: Any, depth: int) -> None:
        """An instance's attributes, read without running its class's code (a user ``__getattr__`` may load or
        raise): ``__dict__`` and each ``__slots__`` member."""
        try:
            attrs = object.__getattribute__(value, "__dict__")
        except AttributeError:
            attrs = None
        if isinstance(attrs, dict):
            self.put("attrs")
            self.feed(attrs, depth)
        for cls in type(value).__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                mangled = f"_{cls.__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__") \
                    else name
                member = cls.__dict__.get(mangled)
                if name in ("__dict__", "__weakref__") or type(member).__name__ != "member_descriptor":
                    continue
                self.put("slot", name)
                try:
                    self.feed(member.__get__(value, cls), depth)
                except AttributeError:  # a slot not set
                    self.put("unset")

    def other(self, value: Any, depth: int) -> None:
        """An object by its class (a user's followed: a method edited between a kill and the rerun is another
        key) and its state: a tensor or array by its bytes (a repr elides the middle), an instance of a class
        written in Python by its attributes (a dataclass's or a module's repr showed neither its methods nor
        its weights), one written in C by pickling's reduce (a ``SimpleNamespace``'s dict, a ``datetime``'s
        bytes), else by its repr without addresses."""
        import sys

        kind = type(value)
        self.feed(kind, depth)
        torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None and issubclass(kind, torch.Tensor):
            self.tensor(value, depth)
        elif numpy is not None and issubclass(kind, numpy.ndarray | numpy.generic):
            self.array(numpy.asarray(value), depth)
        elif all(python_written(cls) for cls in kind.__mro__[:-1]):
            self.state(value, depth)
        else:
            try:
                reduced = kind.__reduce_ex__(value, 4)
            except Exception:  # not picklable (a lock, a file): its repr stands in
                reduced = None
            if isinstance(reduced, tuple):
                self.put("reduced")
                self.feed(reduced[:3], depth)
            else:
                self.put(self.shown(value))
                self.exposed(value, depth)
            try:  # a C wrapper of the user's function (functools.lru_cache's) reduces to its name alone
                attrs = object.__getattribute__(value, "__dict__")
            except AttributeError:
                attrs = None
            wrapped = dict.get(attrs, "__wrapped__") if isinstance(attrs, dict) else None
            if wrapped is not None:
                self.put("wraps")
                self.feed(wrapped, depth)

    def exposed(self, value: Any, depth: int) -> None:
        """The data a C type that pickling cannot reduce exposes itself (its own members and getsets, read by
        their C descriptors, never a user's code): a ``struct.Struct``'s format, which its repr without the
        address lacked."""
        import types

        for cls in type(value).__mro__[:-1]:
            if python_written(cls):
                continue
            for name, member in sorted(vars(cls).items()):
                if type(member) not in (types.GetSetDescriptorType, types.MemberDescriptorType) or name.startswith("__") \
                        or getattr(member, "__objclass__", None) is not cls:
                    continue
                try:
                    part = member.__get__(value, cls)
                except Exception:  # a member not set, a getset that refuses: not told apart
                    continue
                self.put("member", name)
                self.feed(part, depth)

    def tensor(self, value: Any, depth: int) -> None:
        """A tensor by its dtype, shape and bytes; past the byte bound by an evenly spaced sample. A nested
        tensor by its parts, a sparse one by its indices and values, a meta one by its shape alone."""
        import torch

        self.put("tensor", value.dtype, value.layout, value.is_nested)
        if value.is_nested:
            self.feed(list(value.unbind()), depth)
            return
        if value.layout != torch.strided:
            coo = (value if value.layout == torch.sparse_coo else value.to_sparse_coo()).coalesce()
            self.feed([coo.indices(), coo.values()], depth)
            return
        self.put(tuple(value.shape))
        if value.is_meta:
            return
        if value.is_quantized:
            self.put(self.shown(value.qscheme()))
            value = value.int_repr()
        flat = value.detach().reshape(-1)
        room = max(self.SAMPLE, max(self.bytes, 0) // max(flat.element_size(), 1))
        if flat.numel() > room:
            step = -(-flat.numel() // room)
            self.put("sampled", step)
            flat = flat[::step]
        flat = flat.cpu().contiguous()
        self.bytes -= flat.numel() * flat.element_size()
        self.put(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")

    def array(self, value: Any, depth: int) -> None:
        """An array by its dtype, shape and bytes (an evenly spaced sample past the byte bound); an object
        array by its items (its bytes are pointers, another each process)."""
        import numpy

        self.put("array", value.dtype.str, value.dtype.descr if value.dtype.fields else "", value.shape)
        flat = value.reshape(-1)
        if value.dtype.hasobject:
            self.feed(flat[: 2 * self.ITEMS].tolist(), depth)
            return
        room = max(self.SAMPLE, max(self.bytes, 0) // max(value.dtype.itemsize, 1))
        if flat.size > room:
            step = -(-flat.size // room)
            self.put("sampled", step)
            flat = flat[::step]
        data = numpy.ascontiguousarray(flat).tobytes()
        self.bytes -= len(data)
        self.put(data)
