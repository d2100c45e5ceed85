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

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.taskselect.study import FeatureConfig


def load_report(path: str | Path) -> dict:
    """A select-tasks ``report.json`` (``path`` is the file or its run directory), checked for gains."""
    path = Path(path)
    path = path / "report.json" if path.is_dir() else path
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise MechkitError(f"cannot read {path}: {err}", "pass a select-tasks run directory or its report.json") \
            from None
    if report.get("plugin") != "select-tasks":
        raise MechkitError(f"{path} is a {report.get('plugin')!r} report, not select-tasks",
                           "pass a select-tasks run directory")
    if not any((r.get("transfer") or {}).get("gain") for r in report["results"]["targets"].values()):
        raise MechkitError(f"{path} has no transfer gains", "run select-tasks --validate --transfer-seeds 1 first")
    return report


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
