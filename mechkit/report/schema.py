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
from collections.abc import Mapping
from datetime import UTC, date, datetime
from importlib import metadata
from pathlib import PurePath
from typing import Any

from mechkit import __version__
from mechkit.errors import MechkitError

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


def to_jsonable(obj: Any, nonfinite: str = "null") -> Any:
    """Return ``obj`` as plain JSON data (dict/list/str/int/float/bool/None).

    JSON has no NaN or infinity: with ``nonfinite="null"`` both become ``None`` (written ``null``);
    with ``"keep"`` they stay floats, so that :func:`validate_report` can refuse them naming where
    they are (what :func:`build_report` and the report writer do: a NaN metric is never silently
    written as ``null``). numpy scalars and arrays and torch tensors all offer ``.tolist()``, which
    is used without importing either library. Tuple keys such as ``(17, 3)`` become ``"17.3"``, the
    layer.head name grammar.

    >>> to_jsonable({"acc": float("nan"), (17, 3): (1, 2)})
    {'acc': None, '17.3': [1, 2]}
    >>> to_jsonable({"acc": float("nan")}, nonfinite="keep")
    {'acc': nan}
    """
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}, not {nonfinite!r}")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)  # IntEnum and other int subclasses become plain ints
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) or nonfinite == "keep" else None
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value, nonfinite)
    if isinstance(obj, Mapping):
        return {_key(k): to_jsonable(v, nonfinite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, nonfinite) for v in obj]
    if isinstance(obj, (set, frozenset)):
        items = [to_jsonable(v, nonfinite) for v in obj]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (datetime, date)):
        return obj.isoformat()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name), nonfinite) for f in dataclasses.fields(obj)}
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    tolist = getattr(obj, "tolist", None)  # numpy arrays/scalars, torch tensors
    if callable(tolist):
        detach = getattr(obj, "detach", None)  # a tensor that requires grad refuses .tolist()
        if callable(detach):
            obj = detach()
        return to_jsonable(obj.tolist(), nonfinite)
    raise TypeError(f"cannot store a {type(obj).__qualname__} in a report: convert it to numbers or text")


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, tuple):
        return ".".join(str(to_jsonable(p)) for p in k)
    return str(to_jsonable(k))


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
        "plugin_version": str(plugin_version),
        "mechkit_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": to_jsonable(model, keep),
        "params": to_jsonable(params, keep),
        "seed": int(seed),
        "results": to_jsonable(results, keep),
        "artifacts": [str(a) for a in artifacts],
        "timings": to_jsonable(timings, keep),
        "environment": environment(),
    }
    if finding is not None:
        report["finding"] = str(finding)
    if views:
        report["views"] = to_jsonable(views)
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
