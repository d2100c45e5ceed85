"""Does the metric predict transfer, under another representation? ρ from an existing report.

The transfer study of ``select-tasks --validate`` (``--transfer-seeds``) fine-tunes each candidate
alone and records its gain on the target; the fine-tunes are the expensive part, the features are
not. :func:`report_rho` reads a report's gains and recomputes Spearman ρ of gain with similarity and
with log coverage alone under any representation, without fine-tuning again. It rebuilds the run's
feature settings exactly: the same tasks (every target and candidate of the study, so centring on
the study's mean is the same), examples (``n``, ``seed``), layer, position, estimator, p, and, for
``lora-grad``, the validation's LoRA rank and alpha. On the report's model it gives the run's own ρ
for the representations the run had.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError, first_line

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.taskselect.study import FeatureConfig


def load_report(path: str | Path) -> dict:
    """A select-tasks ``report.json`` (``path`` is the file or its run directory), checked for gains."""
    from mechkit.io.runfile import MAX_RUN_FILE_BYTES, read_run_file

    fix = "pass a select-tasks run directory or its report.json"
    path, data = read_run_file(path, MAX_RUN_FILE_BYTES, fix=fix)  # settled; never a FIFO, never past a link
    try:
        report = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise MechkitError(f"cannot read {path}: {first_line(err, 160)}", fix) from None
    if not isinstance(report, dict) or report.get("plugin") != "select-tasks":
        kind = f"a {report.get('plugin')!r} report" if isinstance(report, dict) else "no report"
        raise MechkitError(f"{path} is {kind}, not select-tasks",
                           "pass a select-tasks run directory")
    check_shape(report, path)
    if not any((r.get("transfer") or {}).get("gain") for r in report["results"]["targets"].values()):
        raise MechkitError(f"{path} has no transfer gains", "run select-tasks --validate --transfer-seeds 1 first")
    return report


def check_shape(report: dict, path: Path) -> None:
    """One line for a report without the fields ρ is rebuilt from (a damaged or hand-edited file), rather
    than a KeyError deep in the recomputation."""
    def damaged(what: str) -> MechkitError:
        return MechkitError(f"{path} is not a whole select-tasks report: {what}",
                            "pass the report.json its run wrote, or run select-tasks again")

    results, model = report.get("results"), report.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("spec"), str):
        raise damaged("no model.spec")
    if not isinstance(results, dict) or not isinstance(results.get("features"), dict) \
            or not isinstance(results.get("targets"), dict) or not results["targets"]:
        raise damaged("no results.features or results.targets")
    for target, r in results["targets"].items():
        sel = r.get("selection") if isinstance(r, dict) else None
        if not isinstance(sel, dict) or not isinstance(sel.get("order"), list) \
                or not isinstance(sel.get("p"), int | float):
            raise damaged(f"target {target!r} has no selection order and p")
        moved = r.get("transfer") or {}
        if not isinstance(moved, dict):
            raise damaged(f"target {target!r}: transfer is not an object")
        tasks, gains = moved.get("tasks", []), moved.get("gain") or {}
        if not isinstance(tasks, list) or not isinstance(gains, dict) or any(
                not isinstance(g, dict) or set(g) != set(tasks) or not set(tasks) <= set(sel["order"])
                for g in gains.values()):
            raise damaged(f"target {target!r}: transfer gains are not one per selected task")


def feature_config(report: dict, representation: str, grad_blocks: int | None = None) -> FeatureConfig:
    """The run's :class:`~mechkit.taskselect.study.FeatureConfig` with ``representation``; the LoRA
    rank and alpha of ``lora-grad`` are the validation's (older reports recorded them there only)."""
    from mechkit.taskselect.study import FeatureConfig

    names = {f.name for f in dataclasses.fields(FeatureConfig)}
    recorded = {k: v for k, v in report["results"]["features"].items() if k in names}
    train = next((r["config"] for r in report["results"]["targets"].values() if r.get("config")), {})
    for key in ("rank", "lora_alpha"):
        if key in train:
            recorded[key] = train[key]
    for f in dataclasses.fields(FeatureConfig):  # a hand-edited value: one line, not a TypeError later
        kind = (int, float) if isinstance(f.default, float) else type(f.default)
        if f.name in recorded and not isinstance(recorded[f.name], kind):
            raise MechkitError(f"the report's features.{f.name} is {recorded[f.name]!r}, not a {type(f.default).__name__}",
                               "pass the report.json its run wrote, or run select-tasks again")
    if grad_blocks is not None:
        recorded["grad_blocks"] = grad_blocks
    return FeatureConfig(**{**recorded, "representation": representation})


def study_tasks(report: dict) -> list[str]:
    """Every task the run embedded, in its order: each target, then its candidates."""
    targets = report["results"]["targets"]
    return list(dict.fromkeys(t for target, r in targets.items() for t in (target, *r["selection"]["order"])))


def report_rho(handle: ModelHandle, report: dict, representation: str,
               grad_blocks: int | None = None) -> dict[str, dict[str, dict]]:
    """``{target: {"rep | column": {"similarity": ρ, "coverage": ρ}}}`` for the report's transfer gains
    under ``representation`` (the report's model in ``handle``)."""
    from mechkit.taskselect.representations import check_examples
    from mechkit.taskselect.study import features, rho_table, run_selection

    cfg = feature_config(report, representation, grad_blocks)
    check_examples(representation, cfg.n)
    feats = features(handle, study_tasks(report), cfg)
    out = {}
    for target, r in report["results"]["targets"].items():
        moved = r.get("transfer") or {}
        if not moved.get("gain"):
            continue
        sel = run_selection(feats, target, r["selection"]["order"], r["selection"]["p"], cfg.estimator)
        out[target] = rho_table(representation, sel, moved["gain"], moved["tasks"])
    return out


__all__ = ["feature_config", "load_report", "report_rho", "study_tasks"]
