"""What an NDIF server lets a request use — the modules it may name and import, the builtins it may call.

NDIF runs every request under a ``Protector`` (ndif-team/ndif,
``src/services/ray/src/ray/nn/security/protected_environment.py``; from Feb 2026 branches on, its lists
live in ``whitelist.yaml`` beside it). While the request is **unpickled** ``__import__`` refuses every
module outside ``WHITELISTED_MODULES_DESERIALIZATION`` (``deserialization_modules`` + ``modules``);
while it **runs**, every module outside ``WHITELISTED_MODULES`` (``modules``), and every builtin outside
``WHITELISTED_BUILTINS`` is removed. Unpickling a global imports its module, so a request that *names*
``dataclasses.Field`` (any dataclass shipped by value does) is refused before it runs.

The lists below are the stricter reading of both versions: ndif ``main`` (028db44, 2026-02-12) and
``whitelist.yaml`` of ``caden/cpu`` (b7ac71f, 2026-02-21), which adds ``__future__`` to ``modules`` and
``nnsight.intervention.serialization`` and ``transformers`` to ``deserialization_modules`` (left out
here: main refuses them) and drops ``input`` from the builtins (left out). Matching is the yaml's: a
strict entry matches its own name only, a loose one the name and its submodules. Absent, among others:
``dataclasses``, ``functools``, ``types``, ``sys``, ``contextlib``, ``itertools``, ``copy``, ``re``,
``transformers``, and the ``nnsight`` package root (``import nnsight`` inside a request fails).

Besides these, a request names the nnsight modules nnsight's own serialiser writes into every request
(:data:`NNSIGHT_OWN`; the 0.5-era entries of NDIF's lists are the same machinery under older paths): a
server serving this nnsight accepts those or accepts nothing. mechkit names nothing else of nnsight.

So what mechkit ships into a trace is plain data (tuples, lists, dicts, tensors, ``SimpleNamespace``),
plain classes and functions over torch, einops and whitelisted builtins, with nnsight's ``save`` as the
only nnsight name. :func:`server_unpickler` and :func:`server_builtins` let ``--remote local``
(:mod:`mechkit.model.backends.simulation`) enforce exactly that.
"""

from __future__ import annotations

from typing import Any

from mechkit.model.backends.base import BackendError

# (name, strict): NDIF's WHITELISTED_MODULES (ndif main), in both versions.
MODULES = (("builtins", True), ("torch", False), ("collections", False), ("nnsight.intervention.envoy", False),
           ("time", False), ("numpy", False), ("sympy", False), ("nnterp", False), ("math", False),
           ("einops", False), ("urllib3", False), ("typing", False), ("_operator", True), ("operator", True),
           ("pandas", False), ("enum", False))
# NDIF's additional WHITELISTED_MODULES_DESERIALIZATION (ndif main), in both versions.
DESERIALIZATION = (("pickle", False), ("cloudpickle", False), ("copyreg", False), ("nnsight.schema.request", True),
                   ("nnsight.modeling.mixins.remoteable", True), ("nnsight.intervention.tracing.base", True),
                   ("nnsight.intervention.interleaver", True), ("nnsight.intervention.batching", True),
                   ("nnsight.modeling", False))
# What nnsight 0.8's serialiser itself names in a request (a trace, a session, a function shipped by
# source), beyond NDIF's lists: tests/test_nnsight.py measures it on an empty trace and session.
NNSIGHT_OWN = (("nnsight.intervention.tracer", True), ("nnsight.tracing.tracer", True),
               ("nnsight.tracing.util", True), ("nnsight.intervention.serialization", True))

# NDIF's WHITELISTED_BUILTINS (both versions; ``input`` is main's only).
_BUILTIN_NAMES = """
ArithmeticError AssertionError AttributeError BaseException BaseExceptionGroup BlockingIOError BrokenPipeError
BufferError BytesWarning ChildProcessError ConnectionAbortedError ConnectionError ConnectionRefusedError
ConnectionResetError DeprecationWarning EOFError Ellipsis EncodingWarning EnvironmentError Exception False
FileExistsError FileNotFoundError FloatingPointError FutureWarning GeneratorExit IOError ImportError ImportWarning
IndentationError IndexError InterruptedError IsADirectoryError KeyError KeyboardInterrupt LookupError MemoryError
ModuleNotFoundError NameError None NotADirectoryError NotImplemented NotImplementedError OSError OverflowError
PendingDeprecationWarning PermissionError ProcessLookupError RecursionError ReferenceError ResourceWarning
RuntimeError RuntimeWarning StopAsyncIteration StopIteration SyntaxError SyntaxWarning SystemError SystemExit
TabError TimeoutError True TypeError UnboundLocalError UnicodeDecodeError UnicodeEncodeError UnicodeError
UnicodeTranslateError UnicodeWarning UserWarning ValueError Warning ZeroDivisionError __build_class__ __doc__
__import__ __loader__ __name__ __package__ __spec__ abs aiter all anext any ascii bool bytearray bytes callable
chr classmethod complex copyright credits delattr dict dir divmod enumerate eval filter float format frozenset
getattr globals hasattr hash hex id int isinstance issubclass iter len list map max memoryview min next object
oct ord pow print property range repr reversed round set setattr slice sorted staticmethod str sum super tuple
type vars zip
"""
BUILTINS = frozenset(_BUILTIN_NAMES.split())

FIX = ("ship plain data (tuples, lists, dicts, tensors) and functions over torch and einops; "
       "the server's whitelist is in mechkit.model.backends.whitelist")


class NotWhitelisted(BackendError):
    """A request names or imports what an NDIF server refuses."""


def _matches(name: str, entries: tuple) -> bool:
    return any(name == entry or (not strict and name.startswith(entry + ".")) for entry, strict in entries)


def may_unpickle(module: str) -> bool:
    """Whether a request may name ``module`` (NDIF imports it while unpickling the request).

    >>> may_unpickle("torch.nn.functional"), may_unpickle("einops.einops"), may_unpickle("dataclasses")
    (True, True, False)
    >>> may_unpickle("nnsight"), may_unpickle("nnsight.tracing.tracer"), may_unpickle("transformers")
    (False, True, False)
    """
    return _matches(module, MODULES + DESERIALIZATION + NNSIGHT_OWN)


def may_import(module: str) -> bool:
    """Whether code running in a request may import ``module``.

    >>> may_import("torch"), may_import("math"), may_import("nnsight"), may_import("functools")
    (True, True, False, False)
    """
    return _matches(module, MODULES)


def plain(obj: Any) -> Any:
    """``obj`` as data a server may unpickle: every dataclass instance a ``SimpleNamespace`` of its fields
    (its methods stay here: a shipped step reads fields), through lists, tuples and dicts.

    >>> from mechkit.model.headspec import Head
    >>> plain([Head(3, 1), {"k": (Head(0, 2),)}])
    [namespace(layer=3, head=1), {'k': (namespace(layer=0, head=2),)}]
    """
    import dataclasses
    from types import SimpleNamespace

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return SimpleNamespace(**{f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(plain(x) for x in obj)
    if type(obj) is dict:
        return {k: plain(v) for k, v in obj.items()}
    return obj


def _guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """``__import__`` inside shipped code, as the server's: whitelisted absolute imports only."""
    if level or not may_import(name):
        raise ModuleNotFoundError(f"Module {name} is not whitelisted on the NDIF server", name=name)
    return __import__(name, globals, locals, fromlist, level)


def server_builtins() -> dict:
    """The builtins code in a request sees on the server: the whitelisted ones, imports guarded."""
    import builtins

    found = {name: getattr(builtins, name) for name in BUILTINS if hasattr(builtins, name)}
    found["__import__"] = _guarded_import
    return found


def _checked(what: str, name: str, ok: bool) -> None:
    if not ok:
        raise NotWhitelisted(f"the request {what} {name}, which an NDIF server refuses (not in its whitelist)", FIX)


def server_unpickler(base: type, named: set[str]) -> type:
    """An unpickler (subclass of nnsight's ``base``) that refuses a request as NDIF's whitelist would: a
    global outside the modules it may name or a builtin outside its builtins, a module object outside
    them, and a function shipped as bytecode (NDIF's Python need not be ours: nnsight ships source).
    Functions shipped by source get the server's builtins (:func:`server_builtins`). The modules a request
    named (globals and module objects) are added to ``named``."""

    class ServerUnpickler(base):
        def find_class(self, module: str, name: str) -> Any:
            named.add(module)
            _checked("names", f"{module}.{name}", may_unpickle(module))
            if module == "builtins":
                _checked("names the builtin", name, name in BUILTINS)
            found = super().find_class(module, name)
            if (module, name) == ("cloudpickle.cloudpickle", "subimport"):
                return _subimport(found, named)
            if (module, name) == ("cloudpickle.cloudpickle", "_builtin_type"):
                return _builtin_type(found)
            if (module, name) == ("nnsight.intervention.serialization", "_load_function"):
                return _load_function(found)
            return found

    return ServerUnpickler


def _subimport(real: Any, named: set[str]) -> Any:
    def subimport(name: str) -> Any:
        named.add(name)
        _checked("carries the module", name, may_unpickle(name))
        return real(name)

    return subimport


def _builtin_type(real: Any) -> Any:
    def builtin_type(name: str) -> Any:
        _checked("carries a function as bytecode, built by", f"types.{name}", name != "CodeType")
        return real(name)

    return builtin_type


def _load_function(real: Any) -> Any:
    import types

    def load_function(*args: Any) -> Any:
        fn = real(*args)
        # A function takes its builtins from its globals when it is made: make it again with the server's.
        again = types.FunctionType(fn.__code__, {"__builtins__": server_builtins()}, fn.__name__, fn.__defaults__,
                                   fn.__closure__)
        again.__kwdefaults__, again.__annotations__ = fn.__kwdefaults__, fn.__annotations__
        return again

    return load_function
