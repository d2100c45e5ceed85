"""The fields of a ``scheduler.json`` checked before a :class:`~mechkit.adapt.scheduler.Scheduler` is built from it.

A scheduler file decides which blocks run under a latency budget, so a field out of its type or range does not
fail: it runs silently wrong. A foreign ``schema`` was read as a scheduler, ``adherence: 2.0`` reported a target
no margin can meet, ``signal: null`` on a file of several tasks made every input run the static plan, and a
``keep`` of 0 or a negative ``margin`` ran plans no calibration chose. Every field the loader reads is checked
here, each refused in one line that names the file and the field (``candidates[2].plan.tokens.keep``). A key the
loader does not read (``"Heads"`` for ``"heads"``, a field of another version) is refused at every level with the
keys it knows, as it was ignored and its plan ran without it; a layer key is ASCII digits in canonical form (``"²"``
passed ``str.isdigit`` and failed ``int``), and head and channel indices (``tokens.heads`` too) are bounded by the
widths of the model the file records (``tokens.heads: [99]`` failed with an IndexError at the first forward).

>>> check_scheduler_data({"schema": "mechkit.other/1"}, "s.json")
Traceback (most recent call last):
mechkit.errors.MechkitError: s.json: schema is 'mechkit.other/1', not 'mechkit.adapt.scheduler/v1': not a scheduler saved by mechkit adapt — pass the scheduler.json of a `mechkit adapt` run as it wrote it, or calibrate one again with `mechkit adapt --model ...`
"""

from __future__ import annotations

import math
import re
from typing import Any

from mechkit.adapt.tokens import RANKS
from mechkit.errors import MechkitError

SCHEMA = "mechkit.adapt.scheduler/v1"  # what a scheduler.json says it is
SELECT = ("logprob", "accuracy")
"""What ranks plans within a budget: the calibration prompts' mean answer log-prob (smooth, the
default: a few calibration prompts make exact-match accuracy a coarse, noisy step) or accuracy;
the other breaks ties."""

FIX = ("pass the scheduler.json of a `mechkit adapt` run as it wrote it, or calibrate one again with "
       "`mechkit adapt --model ...`")
MISSING = object()
LAYER_KEY = re.compile(r"(0|[1-9][0-9]*)")  # what ExecutionPlan.as_dict writes for a layer: str(int), ASCII only
# The keys each level of a file holds, as Scheduler.as_dict and the as_dict of its parts write them.
KNOWN = {
    "the file": ("schema", "tasks", "margin", "adherence", "min_cv", "min_confidence", "select", "cost", "signal",
                 "candidates", "model"),
    "model": ("architecture", "vocab_size", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_model", "d_mlp",
              "head_counts", "mlp_widths", "dtype", "device"),  # scheduler.structure_identity
    "cost": ("beta_attn", "beta_mlp", "rho", "gamma", "eta", "dense_a", "dense_b", "n_layers", "noise", "fit_error",
             "under"),
    "signal": ("layer", "classes", "mean", "scale", "coef", "intercept", "cv_accuracy"),
    "candidate": ("plan", "source", "accuracy", "logprob", "bias"),
    "plan": ("name", "layers", "attn_layers", "mlp_layers", "heads", "mlp", "tokens"),
    "tokens": ("layer", "keep", "rank", "heads", "first", "tail"),
}


class _File:
    """One file's checks: each refusal names ``where`` and the field."""

    def __init__(self, where: str):
        self.where = where

    def bad(self, field: str, problem: str) -> None:
        raise MechkitError(f"{self.where}: {field} {problem}", FIX)

    def get(self, d: dict, key: str, field: str, required: bool = True) -> Any:
        if key not in d:
            if required:
                self.bad(field, "is missing")
            return MISSING
        return d[key]

    def number(self, value: Any, field: str, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
        """A finite int or float (never a bool) inside the bounds."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.bad(field, f"is {value!r}, not a finite number")
        outside = (low is not None and (value <= low if low_open else value < low)) or \
                  (high is not None and (value >= high if high_open else value > high))
        if outside:
            span = f"{'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, " \
                   f"{'inf' if high is None else f'{high:g}'}{')' if high_open else ']'}"
            self.bad(field, f"is {value!r}, outside {span}")
        return value

    def whole(self, value: Any, field: str, low: int = 0, high: int | None = None) -> int:
        """An int (never a bool) from ``low`` to ``high`` (exclusive)."""
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(field, f"is {value!r}, not a whole number")
        if value < low or (high is not None and value >= high):
            self.bad(field, f"is {value}, outside {low}..{'' if high is None else high - 1}")
        return value

    def whole_list(self, value: Any, field: str, high: int | None = None) -> list[int]:
        if not isinstance(value, list):
            self.bad(field, f"is {value!r}, not a list of whole numbers")
        for i, x in enumerate(value):
            self.whole(x, f"{field}[{i}]", 0, high)
        if len(set(value)) != len(value):
            self.bad(field, "repeats an index")
        return value

    def text(self, value: Any, field: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or (choices is None and not value):
            self.bad(field, f"is {value!r}, not text")
        if choices is not None and value not in choices:
            self.bad(field, f"is {value!r}, not one of {', '.join(choices)}")
        return value

    def mapping(self, value: Any, field: str, level: str | None = None) -> dict:
        """A JSON object; with ``level`` (a key of :data:`KNOWN`) holding none but that level's keys."""
        if not isinstance(value, dict):
            self.bad(field, f"is {type(value).__name__}, not a JSON object")
        unknown = [k for k in value if k not in KNOWN[level]] if level else []
        if unknown:
            self.bad(field, f"holds the unknown key {unknown[0]!r} (the keys it may hold: {', '.join(KNOWN[level])})")
        return value

    def vector(self, value: Any, field: str, size: int | None = None) -> list:
        if not isinstance(value, list) or not value:
            self.bad(field, "is not a non-empty list of numbers")
        if size is not None and len(value) != size:
            self.bad(field, f"holds {len(value)} numbers, not {size}")
        for i, x in enumerate(value):
            self.number(x, f"{field}[{i}]")
        return value


def check_scheduler_data(data: Any, where: str) -> None:
    """Refuse (one :class:`~mechkit.errors.MechkitError` line naming ``where`` and the field) scheduler data
    whose schema, types or ranges are not those ``mechkit adapt`` writes."""
    f = _File(where)
    f.mapping(data, "the file", "the file")
    if data.get("schema") != SCHEMA:
        f.bad("schema", f"is {data.get('schema')!r}, not {SCHEMA!r}: not a scheduler saved by mechkit adapt")
    model = data.get("model")
    if not isinstance(model, dict) or not model.get("architecture"):
        # its plans name layers and heads of a model it does not say: on any other one they would run silently
        raise MechkitError(f"{where} records no model it was calibrated on, so it cannot be checked against this one",
                           "calibrate a scheduler on this model with `mechkit adapt --model ...` and use its "
                           "scheduler.json")
    f.mapping(model, "model", "model")
    tasks = f.get(data, "tasks", "tasks")
    if not isinstance(tasks, list) or not tasks:
        f.bad("tasks", f"is {tasks!r}, not a non-empty list of task ids")
    for i, t in enumerate(tasks):
        f.text(t, f"tasks[{i}]")
    if len(set(tasks)) != len(tasks):
        f.bad("tasks", "repeats a task")
    shape = model
    n_layers = shape.get("n_layers") if isinstance(shape.get("n_layers"), int) else None
    for key, low, high, low_open, high_open in (("margin", 0, None, False, False), ("adherence", 0, 1, True, True),
                                                ("min_cv", 0, 1, False, False), ("min_confidence", 0, 1, False, False)):
        if data.get(key) is not None or (key in data and key in ("min_cv", "min_confidence")):
            f.number(data[key], key, low, high, low_open, high_open)
    if "select" in data:
        f.text(data["select"], "select", SELECT)
    _cost(f, f.mapping(f.get(data, "cost", "cost"), "cost", "cost"), n_layers)
    signal = f.get(data, "signal", "signal", required=False)
    if signal in (None, MISSING):
        if len(tasks) > 1:  # adapt fits one on every file of two tasks or more: without it, every input runs static
            f.bad("signal", f"is null, and a scheduler of {len(tasks)} tasks reads the task from its signal "
                  "(without one every input would run the static plan)")
    else:
        _signal(f, f.mapping(signal, "signal", "signal"), tasks, n_layers, shape.get("d_model"))
    candidates = f.get(data, "candidates", "candidates")
    if not isinstance(candidates, list) or not candidates:
        f.bad("candidates", "is not a non-empty list of plans")
    widths = {key: _widths(shape, key, n_layers) for key in ("heads", "mlp")}
    for i, c in enumerate(candidates):
        _candidate(f, f.mapping(c, f"candidates[{i}]", "candidate"), f"candidates[{i}]", tasks, n_layers, widths)
    if not any(isinstance(c.get("accuracy"), dict) and all(t in c["accuracy"] for t in tasks) for c in candidates):
        f.bad("candidates", "hold no plan scored on every task (the static plan needs one)")


def _widths(model: dict, key: str, n_layers: int | None) -> list[int] | None:
    """Per layer, the query heads (``key`` "heads") or MLP channels ("mlp") of the model the file records: its
    ``head_counts`` / ``mlp_widths``, or a file's one ``n_heads`` / ``d_mlp`` for every layer; None where unsaid."""
    per_layer, whole = ("head_counts", "n_heads") if key == "heads" else ("mlp_widths", "d_mlp")
    counts = model.get(per_layer)
    if isinstance(counts, list) and len(counts) == n_layers and all(type(n) is int and n >= 0 for n in counts):
        return counts
    n = model.get(whole)
    return [n] * n_layers if type(n) is int and n >= 1 and n_layers is not None else None


def _cost(f: _File, cost: dict, n_layers: int | None) -> None:
    for key in ("beta_attn", "beta_mlp", "gamma", "eta"):  # fitted non-negative: shares of a forward, overheads
        f.number(f.get(cost, key, f"cost.{key}"), f"cost.{key}", 0)
    for key in ("dense_a", "dense_b"):
        f.number(f.get(cost, key, f"cost.{key}"), f"cost.{key}")
    layers = f.whole(f.get(cost, "n_layers", "cost.n_layers"), "cost.n_layers", 1)
    if n_layers is not None and layers != n_layers:
        f.bad("cost.n_layers", f"is {layers}, and the model it records has {n_layers} blocks")
    for key, high in (("rho", 1), ("noise", None), ("fit_error", None), ("under", None)):
        if key in cost:
            f.number(cost[key], f"cost.{key}", 0, high)


def _signal(f: _File, signal: dict, tasks: list, n_layers: int | None, d_model: Any) -> None:
    f.whole(f.get(signal, "layer", "signal.layer"), "signal.layer", 0, None if n_layers is None else n_layers - 1)
    classes = f.get(signal, "classes", "signal.classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) or \
            len(set(classes)) != len(classes) or set(classes) != set(tasks):
        f.bad("signal.classes", f"is {classes!r}, not the scheduler's tasks {tasks!r}")
    size = d_model if isinstance(d_model, int) and not isinstance(d_model, bool) else None
    mean = f.vector(f.get(signal, "mean", "signal.mean"), "signal.mean", size)
    scale = f.vector(f.get(signal, "scale", "signal.scale"), "signal.scale", len(mean))
    for i, x in enumerate(scale):
        f.number(x, f"signal.scale[{i}]", 0, low_open=True)
    coef = f.get(signal, "coef", "signal.coef")
    if not isinstance(coef, list) or len(coef) != len(classes):
        f.bad("signal.coef", f"is not {len(classes)} rows (one per class)")
    for i, row in enumerate(coef):
        f.vector(row, f"signal.coef[{i}]", len(mean))
    f.vector(f.get(signal, "intercept", "signal.intercept"), "signal.intercept", len(classes))
    f.number(f.get(signal, "cv_accuracy", "signal.cv_accuracy"), "signal.cv_accuracy", 0, 1)


def _candidate(f: _File, c: dict, field: str, tasks: list, n_layers: int | None, widths: dict) -> None:
    _plan(f, f.mapping(f.get(c, "plan", f"{field}.plan"), f"{field}.plan", "plan"), f"{field}.plan", n_layers, widths)
    f.text(f.get(c, "source", f"{field}.source"), f"{field}.source")
    for key, low, high in (("accuracy", 0, 1), ("logprob", None, 0)):
        scores = f.get(c, key, f"{field}.{key}", required=key == "accuracy")
        if scores is MISSING:
            continue
        f.mapping(scores, f"{field}.{key}")
        if key == "accuracy" and not scores:
            f.bad(f"{field}.accuracy", "scores no task")
        for task, value in scores.items():
            if task not in tasks:
                f.bad(f"{field}.{key}", f"scores {task!r}, not one of the scheduler's tasks")
            f.number(value, f"{field}.{key}[{task!r}]", low, high)
    if "bias" in c:
        f.number(c["bias"], f"{field}.bias")


def _plan(f: _File, plan: dict, field: str, n_layers: int | None, widths: dict) -> None:
    if "name" in plan and not isinstance(plan["name"], str):
        f.bad(f"{field}.name", f"is {plan['name']!r}, not text")
    for key in ("layers", "attn_layers", "mlp_layers"):
        if key in plan:
            f.whole_list(plan[key], f"{field}.{key}", n_layers)
    for key in ("heads", "mlp"):
        units = f.mapping(plan.get(key, {}), f"{field}.{key}")
        for layer, idx in units.items():
            in_range = isinstance(layer, str) and LAYER_KEY.fullmatch(layer) and (n_layers is None or int(layer) < n_layers)
            if not in_range:
                f.bad(f"{field}.{key}", f"names layer {layer!r}, not a block of the model (a layer number in ASCII "
                      f"digits{'' if n_layers is None else f', 0..{n_layers - 1}'})")
            f.whole_list(idx, f"{field}.{key}[{layer!r}]", widths[key][int(layer)] if widths[key] else None)
    tokens = plan.get("tokens")
    if tokens is None:
        return
    t, where = f.mapping(tokens, f"{field}.tokens", "tokens"), f"{field}.tokens"
    layer = f.whole(f.get(t, "layer", f"{where}.layer"), f"{where}.layer", 0, None if n_layers is None else n_layers - 1)
    f.number(f.get(t, "keep", f"{where}.keep"), f"{where}.keep", 0, 1, low_open=True)
    if "rank" in t:
        f.text(t["rank"], f"{where}.rank", RANKS)
    if "heads" in t:
        f.whole_list(t["heads"], f"{where}.heads", widths["heads"][layer] if widths["heads"] else None)
    if "first" in t:
        f.whole(t["first"], f"{where}.first", 0)
    if "tail" in t:
        f.whole(t["tail"], f"{where}.tail", 1)
