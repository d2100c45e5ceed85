"""The ``mechkit.report/v1`` schema: build a report dict, make it strict JSON, check it.

A report is the one artifact every run leaves behind, and scripts read it back months later, so the
shape is checked here once rather than trusted everywhere. JSON has no NaN or infinity, and a metric
that came out NaN is a broken run, not a missing value: :func:`validate_report` (run by the report
writer, by ``build_report(..., nonfinite="error")`` and by readers) refuses any non-finite number with
one line naming its dotted key path (``results.losses[3] is nan``). ``None`` (``null``) stays the way
to say "not computed". Nothing here imports torch or numpy:
tensors and arrays are recognised by duck typing (``.tolist()``), so building a report stays cheap.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import platform
import sys
from collections.abc import Mapping
from datetime import UTC, date, datetime
from importlib import metadata
from pathlib import PurePath
from typing import Any

from mechkit import __version__
from mechkit.errors import MechkitError
from mechkit.io.runfile import MAX_RUN_FILE_BYTES

SCHEMA = "mechkit.report/v1"

# key -> accepted types, in the order a reader meets them in the contract.
_REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "plugin": (str,),
    "plugin_version": (str,),
    "mechkit_version": (str,),
    "created": (str,),
    "model": (dict,),
    "params": (dict,),
    "seed": (int,),
    "results": (dict,),
    "artifacts": (list,),
    "timings": (dict,),
    "environment": (dict,),
}


NONFINITE = ("null", "keep")


MAX_REPORT_BYTES = MAX_RUN_FILE_BYTES  # a run's largest report is about 1 MB: the writer refuses more, a reader too
MAX_INT = int(sys.float_info.max)  # the largest integer a reader takes: each turns numbers into floats
MAX_DEPTH = 100  # containers inside containers a report may hold: a run's deepest (views) is 4; past it, no report


class UnstorableError(MechkitError, TypeError):
    """A value a report cannot hold, named by its key path: a type JSON has no form for, a container that holds
    itself, or one nested past :data:`MAX_DEPTH` (these raised a RecursionError traceback from ``mk.run`` and
    ``write_report``). A :class:`TypeError` too, as the unstorable-type refusal always was."""


class _Bad(Exception):
    """Raised inside the walk, the key path prepended on the way out (no path is built on the way down)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why, self.path = why, ""

    def under(self, key: str) -> _Bad:
        self.path = key + self.path
        return self


def to_jsonable(obj: Any, nonfinite: str = "null") -> Any:
    """Return ``obj`` as plain JSON data (dict/list/str/int/float/bool/None).

    JSON has no NaN or infinity: with ``nonfinite="null"`` both become ``None`` (written ``null``);
    with ``"keep"`` they stay floats, so that :func:`validate_report` can refuse them naming where
    they are (what :func:`build_report` and the report writer do: a NaN metric is never silently
    written as ``null``). numpy scalars and arrays and torch tensors all offer ``.tolist()``, which
    is used without importing either library. Tuple keys such as ``(17, 3)`` become ``"17.3"``, the
    layer.head name grammar. A value no report can hold raises :class:`UnstorableError` naming its key path.

    >>> to_jsonable({"acc": float("nan"), (17, 3): (1, 2)})
    {'acc': None, '17.3': [1, 2]}
    >>> to_jsonable({"acc": float("nan")}, nonfinite="keep")
    {'acc': nan}
    >>> loop = {"a": [1]}
    >>> loop["a"].append(loop)
    >>> try:
    ...     to_jsonable(loop)
    ... except UnstorableError as err:
    ...     print(err.problem)
    report value a[1] holds itself (a container that contains itself has no JSON form)
    """
    return _jsonable_at("", obj, nonfinite)


def _jsonable_at(name: str, obj: Any, nonfinite: str) -> Any:
    """:func:`to_jsonable` of the report key ``name`` (``"results"``), which leads the path a refusal names and
    counts as one level, as it is in the whole report the writer converts again."""
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}, not {nonfinite!r}")
    try:
        return _plain(obj, nonfinite, 1 if name else 0, set())
    except (RecursionError, MemoryError) as err:  # a value's own methods that no read above bounds
        where = f"report value {name}" if name else "the report value"
        raise UnstorableError(f"{where} could not be converted ({type(err).__name__})", "store numbers, text, "
                              "lists and dicts (keep large or nested data in a file of the run)") from None
    except _Bad as bad:
        path = (name + bad.path).lstrip(".")
        if len(path) > 120:  # a path 100 containers deep is no line to read
            path = f"{path[:60]}…{path[-40:]}"
        where = f"report value {path}" if path else "the report value"
        raise UnstorableError(f"{where} {bad.why}", "store numbers, text, lists and dicts (keep large or nested "
                              "data in a file of the run)") from None


def _plain(obj: Any, nonfinite: str, depth: int, seen: set[int]) -> Any:
    kind = type(obj)
    if kind is float:  # the common cases first, by exact type: a subclass's own methods are never asked below
        return obj if nonfinite == "keep" or math.isfinite(obj) else None
    if kind is int and -MAX_INT <= obj <= MAX_INT:
        return obj
    if kind is str and obj.isascii():
        return obj
    if obj is None or isinstance(obj, bool):
        return bool(obj) if obj is not None else None
    if isinstance(obj, str):
        return _text(obj)
    if isinstance(obj, int):
        value = _read(lambda: int.__index__(obj))  # the int itself: a subclass's own __abs__ or __int__ is not asked
        if abs(value) > MAX_INT:  # written, it was a report no reader takes (or past 4300 digits, a ValueError)
            raise _Bad("is an integer too large for a number in a report (past 1.8e308)")
        return value
    if isinstance(obj, float):
        value = float.__float__(obj)  # a subclass's own __float__ is not asked
        return value if math.isfinite(value) or nonfinite == "keep" else None
    if isinstance(obj, enum.Enum):
        if depth >= MAX_DEPTH:  # an Enum whose value is another such Enum, and so on
            raise _Bad(f"is nested more than {MAX_DEPTH} containers deep")
        return _plain(_member_value(obj), nonfinite, depth + 1, seen)
    if isinstance(obj, PurePath):
        return _text(_read(lambda: str(obj)))
    if isinstance(obj, (datetime, date)):
        return _text(_read(obj.isoformat))
    if isinstance(obj, (bytes, bytearray)):
        return (bytes.decode if isinstance(obj, bytes) else bytearray.decode)(obj, "utf-8", "replace")
    if isinstance(obj, complex):
        return _real(obj, nonfinite, depth, seen)
    if isinstance(obj, (Mapping, list, tuple, set, frozenset)) or dataclasses.is_dataclass(obj):
        return _container(obj, nonfinite, depth, seen)
    listed = _read(lambda: _tolist(obj))  # numpy arrays/scalars, torch tensors
    if listed is not _NO_LIST:
        if type(listed) is type(obj):  # np.longdouble's and np.clongdouble's tolist() give themselves back
            value = _read(lambda: complex(listed))
            if math.isinf(value.real) and _read(lambda: bool(abs(listed.real) < float("inf"))):
                raise _Bad("is a number too large for a report (past 1.8e308, the largest float)")
            return _real(value, nonfinite, depth, seen)
        if depth >= MAX_DEPTH:  # a .tolist() that returns another such object, and so on
            raise _Bad(f"is nested more than {MAX_DEPTH} containers deep")
        return _plain(listed, nonfinite, depth + 1, seen)
    raise _Bad(f"is of type {type(obj).__qualname__}, which a report cannot store: convert it to numbers or text")


def _real(value: complex, nonfinite: str, depth: int, seen: set[int]) -> Any:
    """A complex number with no imaginary part as its real part; JSON has no form for one that has. Its parts are
    read as complex's own: a subclass whose ``real`` returned itself looped to a RecursionError."""
    real, imag = complex.real.__get__(value), complex.imag.__get__(value)
    if imag != 0:
        raise _Bad(f"is the complex number {complex.__repr__(value)}, which JSON has no form for: store its real "
                   "and imaginary parts as two numbers")
    return _plain(real, nonfinite, depth, seen)


def _member_value(member: enum.Enum) -> Any:
    """The value an Enum member was given, read as Enum's own (``_value_``): a member class whose ``value``
    property raised or returned the member itself was a traceback from ``mk.run``, after the work."""
    return _read(lambda: object.__getattribute__(member, "_value_"))


def _container(obj: Any, nonfinite: str, depth: int, seen: set[int]) -> Any:
    """A dict, list, tuple, set or dataclass, each member converted; itself refused if it is on the path that
    led here (a cycle) or nested past :data:`MAX_DEPTH`."""
    if isinstance(obj, type):
        raise _Bad(f"is the class {obj.__qualname__}, which a report cannot store: convert it to numbers or text")
    if depth >= MAX_DEPTH:
        raise _Bad(f"is nested more than {MAX_DEPTH} containers deep")
    if id(obj) in seen:
        raise _Bad("holds itself (a container that contains itself has no JSON form)")
    seen.add(id(obj))
    try:
        if isinstance(obj, (list, tuple, set, frozenset)):
            values = _members(_read(lambda: list(obj)), nonfinite, depth, seen)
            if isinstance(obj, (set, frozenset)):
                try:
                    return sorted(values)
                except TypeError:
                    return values
            return values
        if isinstance(obj, Mapping):
            items = _read(lambda: [(k, v) for k, v in obj.items()])  # unpacked inside: a 3-tuple is one line
        else:
            items = _read(lambda: [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)])
        return _keyed(items, nonfinite, depth, seen)
    finally:
        seen.discard(id(obj))


def _members(values: list, nonfinite: str, depth: int, seen: set[int]) -> list:
    """A sequence's members converted, the plain numbers and text of a long list at the cost of a type test."""
    out = []
    for i, v in enumerate(values):
        kind = type(v)
        if kind is float and (nonfinite == "keep" or math.isfinite(v)) or kind is int and -MAX_INT <= v <= MAX_INT:
            out.append(v)
        else:
            try:
                out.append(_plain(v, nonfinite, depth + 1, seen))
            except _Bad as bad:
                raise bad.under(f"[{i}]") from None
    return out


def _keyed(items: list, nonfinite: str, depth: int, seen: set[int]) -> dict:
    """A mapping's (or dataclass's) items converted, keys as their text; two keys of one text refused."""
    out, given = {}, {}
    for k, v in items:
        key = _key(k, depth)
        if key in given:  # {1: a, "1": b}: the JSON object keeps one, the other was lost unsaid
            raise _Bad(f"has two keys that are both {key!r} in JSON ({_shown(given[key])} and {_shown(k)})")
        given[key] = k
        try:
            out[key] = _plain(v, nonfinite, depth + 1, seen)
        except _Bad as bad:
            raise bad.under(f".{key}") from None
    return out


_NO_LIST = object()


def _shown(value: Any) -> str:
    """``repr(value)`` for a message, or its type's name where its own ``__repr__`` raises."""
    try:
        return repr(value)[:60]
    except Exception:  # noqa: BLE001 - a value whose repr raises is named by its type
        return f"a {type(value).__name__}"


def _tolist(obj: Any) -> Any:
    """``obj.tolist()`` (detached first: a tensor that requires grad refuses it), else :data:`_NO_LIST`."""
    tolist = getattr(obj, "tolist", None)
    if not callable(tolist):
        return _NO_LIST
    detach = getattr(obj, "detach", None)
    return detach().tolist() if callable(detach) else tolist()


def _read(members: Any) -> Any:
    """``members()``, the values of a container or array, or :class:`_Bad` naming what it raised (a mapping whose
    ``items()`` raises was a traceback from ``mk.run``, after the work)."""
    try:
        return members()
    except _Bad:
        raise
    except Exception as err:  # noqa: BLE001 - whatever it raises, it is one line naming where
        try:
            said = str(err)[:80]
        except Exception:  # noqa: BLE001 - an exception whose own text raises
            said = "?"
        raise _Bad(f"could not be read ({type(err).__name__}: {said})") from None


def _text(text: str) -> str:
    """``text`` where UTF-8 holds it; a lone surrogate (a file name decoded with ``surrogateescape``) failed the
    write of report.json with a UnicodeEncodeError, after the work."""
    if not isinstance(text, str):  # what a date's own isoformat() or a path's __fspath__ gave back
        raise _Bad(f"gave {type(text).__name__} where text was due (a method of its own returned no str)")
    text = str.__str__(text)  # a str subclass's own encode() or __str__ is never asked
    try:
        str.encode(text, "utf-8")
    except UnicodeEncodeError as err:
        raise _Bad(f"is text with a character UTF-8 cannot hold ({text[err.start]!r} at {err.start})") from None
    return text


def _key(k: Any, depth: int = 0) -> str:
    """The text of the dict key ``k`` (``(17, 3)`` is ``"17.3"``); what it cannot be is said as the key's."""
    try:
        return _read(lambda: _key_text(k, depth))
    except _Bad as bad:
        if bad.why.startswith("has a key"):
            raise
        raise _Bad(f"has a key that {bad.why}") from None


def _key_text(k: Any, depth: int) -> str:
    if isinstance(k, str):
        return _text(k)
    if isinstance(k, tuple):
        if depth >= MAX_DEPTH:
            raise _Bad(f"has a key nested more than {MAX_DEPTH} tuples deep")
        return ".".join(_key(p, depth + 1) for p in k)
    if isinstance(k, float):
        return float.__repr__(float.__float__(k))  # nan, inf and -inf as such: all were "None", one key for three
    if isinstance(k, enum.Enum):
        if depth >= MAX_DEPTH:
            raise _Bad(f"has a key nested more than {MAX_DEPTH} values deep")
        return _key(_member_value(k), depth + 1)  # an Enum of (17, 3) is "17.3", as the tuple is
    if k is None or isinstance(k, (bool, int, PurePath, bytes)) or callable(getattr(k, "tolist", None)):
        return _text(str(_plain(k, "keep", depth, set())))
    raise _Bad(f"is of type {type(k).__qualname__}, which a report cannot store: use text or numbers as keys")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions a rerun needs, read from package metadata (importing torch here would cost seconds)."""
    return {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "transformers": _dist_version("transformers"),
        "mechkit": __version__,
        "platform": platform.platform(),
    }


def build_report(
    *,
    plugin: str,
    plugin_version: str,
    model: dict,
    params: dict,
    seed: int,
    results: dict,
    artifacts: list[str],
    timings: dict,
    nonfinite: str = "null",
    finding: str | None = None,
    views: dict | None = None,
) -> dict[str, Any]:
    """Assemble a valid ``mechkit.report/v1`` dict; every value is converted to strict JSON.

    ``finding`` is the plugin's one- or two-sentence statement of what the run found (numbers
    included); it is stored as the report's optional ``finding`` string when given. ``views`` (optional)
    holds what the page draws interactively: :func:`mechkit.report.views.views_of` the figures.

    ``nonfinite="error"`` refuses a NaN or infinite number anywhere with a :class:`MechkitError`
    naming its key path (see :func:`validate_report`); the default ``"null"`` writes it as ``null``
    (the contract reports had before; a caller that means "not computed" should pass ``None``).

    >>> r = build_report(plugin="ablate", plugin_version="0.1", model={"name": "tiny"}, params={},
    ...                  seed=0, results={"acc": 1.0}, artifacts=[], timings={"run_s": 0.1})
    >>> r["schema"]
    'mechkit.report/v1'
    """
    if nonfinite not in ("null", "error"):
        raise ValueError(f"nonfinite must be 'null' or 'error', not {nonfinite!r}")
    keep = "keep" if nonfinite == "error" else "null"
    report = {
        "schema": SCHEMA,
        "plugin": plugin,
        "plugin_version": _jsonable_at("plugin_version", str(plugin_version), "null"),
        "mechkit_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": _jsonable_at("model", model, keep),
        "params": _jsonable_at("params", params, keep),
        "seed": int(seed),
        "results": _jsonable_at("results", results, keep),
        "artifacts": [str(a) for a in artifacts],
        "timings": _jsonable_at("timings", timings, keep),
        "environment": environment(),
    }
    if finding is not None:
        report["finding"] = _jsonable_at("finding", str(finding), "null")
    if views:
        report["views"] = _jsonable_at("views", views, "null")
    validate_report(report)
    return report


def _first_non_finite(d: Any) -> tuple[str, float] | None:
    """The dotted key path (``results.table[2].acc``) and value of the first NaN or ±inf, else None."""
    stack: list[tuple[str, Any]] = [("", d)]
    while stack:  # iterative: a deeply nested report is no recursion limit here
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, value
        if isinstance(value, dict):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))  # depth first, in order: the first bad value is the one named
    return None


def validate_report(d: Any) -> None:
    """Raise :class:`MechkitError` naming the first missing or invalid key, or the key path of a NaN or
    infinite number; return ``None`` if valid.

    >>> try:
    ...     validate_report({"results": {"losses": [0.5, float("nan")]}})
    ... except MechkitError as err:
    ...     print(err.problem)
    report value results.losses[1] is nan (JSON has no NaN or infinity)
    """
    if not isinstance(d, dict):
        raise MechkitError(f"a report must be a JSON object, not {type(d).__name__}")
    bad = _first_non_finite(d)
    if bad is not None:
        raise MechkitError(f"report value {bad[0]} is {bad[1]} (JSON has no NaN or infinity)",
                           "the run computed a NaN/infinite metric — a model with NaN weights, a diverged "
                           "fine-tune, or a scale so large the activations overflow; check those inputs (plugin "
                           "authors: store None for 'not computed')")
    for key, types in _REQUIRED.items():
        if key not in d:
            raise MechkitError(f"report is missing the key '{key}'", f"expected schema {SCHEMA}")
        value = d[key]
        if not isinstance(value, types) or isinstance(value, bool):
            want = " or ".join(t.__name__ for t in types)
            raise MechkitError(f"report key '{key}' must be {want}, not {type(value).__name__}")
    if d["schema"] != SCHEMA:
        raise MechkitError(
            f"report schema is '{d['schema']}', not '{SCHEMA}'", "read it with the mechkit that wrote it"
        )
    try:
        datetime.fromisoformat(d["created"].replace("Z", "+00:00"))
    except ValueError:
        raise MechkitError(f"report key 'created' is not an ISO-8601 time: {d['created']!r}") from None
    for i, name in enumerate(d["artifacts"]):
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise MechkitError(f"report key 'artifacts[{i}]' must be a plain file name, not {name!r}")
    if d.get("finding") is not None and not isinstance(d["finding"], str):
        raise MechkitError(f"report key 'finding' must be a string, not {type(d['finding']).__name__}")
    for name, value in d["timings"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise MechkitError(f"report key 'timings.{name}' must be a number (seconds, or MB for peak_*), "
                               f"not {value!r}")
