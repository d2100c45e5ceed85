"""The whole study for one target: features, Algorithm 1, and (``validate``) the fine-tunes.

:func:`selection_study` embeds the target and its pool and runs Algorithm 1 (cheap: forward passes
only). :func:`validation_study` fine-tunes every condition of :mod:`mechkit.taskselect.conditions` at
each seed and every candidate alone (the transfer study), all as independent units through
``map_units`` (the run's executor and step cache), and aggregates them into the Table 3.1 shape and the
Spearman correlations of single-task gain with similarity and with coverage, per representation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import mean, pstdev
from typing import TYPE_CHECKING, Any

import numpy as np

from mechkit.taskselect.conditions import METHODS, conditions
from mechkit.taskselect.representations import REPRESENTATIONS, TaskFeatures, task_features
from mechkit.taskselect.select import Selection, greedy_stop, prefix_curve, select_tasks
from mechkit.taskselect.validate import TrainConfig, finetune_units, spearman, unit_key

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass(frozen=True)
class FeatureConfig:
    """How tasks are embedded (recorded in the report)."""

    representation: str = "hidden"
    n: int = 32
    layer: int = -1
    position: str = "last"
    seed: int = 0
    estimator: str = "ledoit-wolf"
    shots: int = 5
    center: bool = True
    rank: int = 8  # lora-grad: the validation's LoRA rank and alpha
    lora_alpha: float = 16.0
    grad_blocks: int = 0  # lora-grad: the last blocks whose B gradients count (0: all)


def features(handle: ModelHandle, tasks: Sequence[str], cfg: FeatureConfig,
             representation: str | None = None) -> dict[str, TaskFeatures]:
    return task_features(handle, tasks, representation or cfg.representation, n=cfg.n, layer=cfg.layer,
                         position=cfg.position, seed=cfg.seed, shots=cfg.shots, center=cfg.center,
                         rank=cfg.rank, lora_alpha=cfg.lora_alpha, grad_blocks=cfg.grad_blocks)


def run_selection(feats: dict[str, TaskFeatures], target: str, pool: Sequence[str], p: float,
                  estimator: str) -> Selection:
    """Algorithm 1 on precomputed features."""
    return select_tasks(feats[target].points, {t: feats[t].points for t in pool},
                        {t: feats[t].vector for t in pool}, feats[target].vector, p=p, estimator=estimator)


def reselector(feats: dict[str, TaskFeatures], target: str, p: float, estimator: str) -> Callable[[list[str]], list]:
    """The stopping rule on another order (No Con.): prefix coverage, then Algorithm 1's lines 3–6."""
    def run(order: list[str]) -> list[str]:
        curve = prefix_curve(feats[target].points, {t: feats[t].points for t in order}, order, estimator)
        return greedy_stop(order, curve, p)[0]
    return run


def selection_study(handle: ModelHandle, target: str, pool: Sequence[str], p: float, cfg: FeatureConfig,
                    have: dict[str, TaskFeatures] | None = None) -> tuple[dict, dict[str, TaskFeatures]]:
    """Selection results (JSON-able) and the features they came from (``have``: features already
    computed for every task of the study, so several targets embed each task once)."""
    feats = {t: have[t] for t in [target, *pool]} if have else features(handle, [target, *pool], cfg)
    sel = run_selection(feats, target, pool, p, cfg.estimator)
    names, sims = _similarities(feats)
    return {"selection": sel.as_dict(), "heatmap": {"tasks": names, "cosine": sims}}, feats


def _similarities(feats: dict[str, TaskFeatures]) -> tuple[list[str], list[list[float]]]:
    from mechkit.taskselect.coverage import similarity_matrix

    return similarity_matrix({t: f.vector for t, f in feats.items()})


def validation_units(selection: Selection, reselect: Callable, config: TrainConfig, seeds: Sequence[int],
                     draws: int, transfer_seeds: int, no_div_size: int | None) -> list[dict]:
    """Every fine-tune of the study as a unit: conditions × seeds, then each candidate alone."""
    units = []
    for seed in seeds:
        for c in conditions(selection, reselect, config.budget, draws, seed, no_div_size):
            units.append({"kind": "condition", "method": c.method, "label": c.label, "tasks": list(c.tasks),
                          "counts": list(c.counts), "seed": seed})
    for seed in list(seeds)[:transfer_seeds]:
        for task in selection.order:
            units.append({"kind": "single", "method": "single", "label": task, "tasks": [task],
                          "counts": [config.budget], "seed": seed})
    return units


def run_units(map_units: Callable, config: TrainConfig, units: list[dict], checkpoints: str | None,
              on_result: Callable | None = None) -> list[dict]:
    """The units' scores through the run's executor; units with the same training set run once."""
    keys = [unit_key(tuple(u["tasks"]), tuple(u["counts"]), u["seed"], config) for u in units]
    distinct = dict(zip(keys, units, strict=True))
    got = map_units(finetune_units, (config, checkpoints), list(distinct.values()), list(distinct), on_result)
    by_key = dict(zip(distinct, got, strict=True))
    return [{**u, "scores": by_key[k]} for u, k in zip(units, keys, strict=True)]


def method_table(done: list[dict], columns: Sequence[str]) -> dict[str, dict[str, dict]]:
    """Table 3.1's row for this target: method -> column -> mean ± std over seeds (and random draws)."""
    table: dict[str, dict[str, dict]] = {}
    for method in METHODS:
        rows = [u for u in done if u["kind"] == "condition" and u["method"] == method]
        if rows:
            table[method] = {c: _pm([u["scores"][c] for u in rows]) for c in columns}
    return table


def _pm(xs: list[float]) -> dict[str, Any]:
    return {"mean": mean(xs), "std": pstdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def transfer(done: list[dict], columns: Sequence[str], measures: dict[str, Selection]) -> dict:
    """Single-candidate gains over no fine-tuning, and their Spearman ρ with each representation's
    similarity and single-task coverage (``measures``: representation -> its selection)."""
    base = {c: mean(u["scores"][c] for u in done if u["method"] == "None") for c in columns}
    singles = [u for u in done if u["kind"] == "single"]
    if not singles:
        return {}
    tasks = list(dict.fromkeys(u["label"] for u in singles))
    gain = {c: {t: mean(u["scores"][c] for u in singles if u["label"] == t) - base[c] for t in tasks}
            for c in columns}
    rho = {}
    for rep, sel in measures.items():
        rho.update(rho_table(rep, sel, gain, tasks))
    return {"gain": gain, "rho": rho, "tasks": tasks}


def rho_table(rep: str, sel: Selection, gain: dict[str, dict[str, float]], tasks: Sequence[str]) -> dict:
    """``{"rep | column": {"similarity": ρ, "coverage": ρ}}``: Spearman ρ of each column's single-candidate
    gain (``gain[column][task]``) with the representation's similarity and log coverage alone."""
    out = {}
    for c, by_task in gain.items():
        g = [by_task[t] for t in tasks]
        out[f"{rep} | {c}"] = {"similarity": spearman(g, [sel.similarity[t] for t in tasks]),
                               "coverage": spearman(g, [float(np.log(sel.single[t])) for t in tasks])}
    return out


def features_by_representation(handle: ModelHandle, tasks: Sequence[str], cfg: FeatureConfig,
                               have: dict[str, TaskFeatures]) -> dict[str, dict[str, TaskFeatures]]:
    """Every representation's features of ``tasks``; ``hidden`` and ``pc1`` share their points, so
    one is derived from the other (``have`` holds ``cfg.representation``'s)."""
    from mechkit.taskselect.representations import first_component

    out = {cfg.representation: have}
    if cfg.representation in ("hidden", "pc1"):
        other = "pc1" if cfg.representation == "hidden" else "hidden"
        out[other] = {t: TaskFeatures(f.points, first_component(f.points) if other == "pc1" else f.points.mean(0))
                      for t, f in have.items()}
    for rep in REPRESENTATIONS:
        if rep not in out:
            out[rep] = features(handle, tasks, cfg, rep)
    return {rep: out[rep] for rep in REPRESENTATIONS}


def measures_by_representation(target: str, pool: Sequence[str], p: float, estimator: str,
                               by_rep: dict[str, dict[str, TaskFeatures]]) -> dict[str, Selection]:
    """Algorithm 1's similarity and single coverage under every representation (for the ρ table)."""
    return {rep: run_selection(feats, target, pool, p, estimator) for rep, feats in by_rep.items()}


__all__ = ["FeatureConfig", "features_by_representation", "measures_by_representation", "method_table", "reselector",
           "rho_table", "run_selection", "run_units", "selection_study", "transfer", "validation_units"]
