"""A pruning study: every number the ``prune`` plugin reports, for one model and a set of tasks.

:class:`PruneStudy` holds what all rows share — calibration prompts and their unit statistics,
held-out prompts of each task (any prompt that also calibrates is dropped, so no row is scored
on what guided it), held-out text for perplexity, and the timed batch — and measures:

- :meth:`~PruneStudy.row`: one guide at one sparsity level, as a physically sliced copy (removed
  units zeroed, mean-compensated, or with the projections that read them refitted by least squares,
  :mod:`mechkit.pruning.reconstruct`): held-out accuracy per task, perplexity, parameters, FLOPs per
  token and forward latency against the dense model, timed both ways (last-position logits and
  every position), and the seconds the reconstruction took;
- :meth:`~PruneStudy.budget`: the plan within a cost budget (:mod:`mechkit.pruning.budget`), then
  its row, re-measured with a little more pruning while timing noise puts it over the budget;
- :meth:`~PruneStudy.save`: the pruned copy of a row, written in safetensors.

Rows are independent once the guides' scores are known: :meth:`~PruneStudy.shared` gives what a
grid of rows shares (the scores, measured sensitivities, the study's :attr:`~PruneStudy.config` and a
fingerprint of its calibration), so another process holding the same model rebuilds the study and
measures rows (:mod:`mechkit.pruning.grid`, the ``prune`` plugin's ``--executor ray``).

Expensive steps go through ``step(key, compute)``, by default just ``compute()``; a plugin passes
its resumable ``RunContext.step``, so an interrupted run resumes at the last finished step. What a
step returns may come back through JSON (lists for arrays), so values are normalised after it.

>>> import mechkit as mk
>>> from mechkit.pruning import PruneStudy
>>> m = mk.load_model("tiny:llama")
>>> study = PruneStudy(m, ["capitalize"], n_calib=2, n=2, shots=2, repeats=1, timing_batch=2)
>>> row = study.row("wanda", {"neurons": 0.25})
>>> row["params"] < study.dense()["params"] and row["speedup"] > 0
True
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mechkit.errors import MechkitError
from mechkit.eval.evaluation import evaluate, task_prompts
from mechkit.io.atomic import dir_mode
from mechkit.io.leftovers import make_prepared_dir, release_prepared
from mechkit.io.remove import discard_tree
from mechkit.pruning.budget import cost_ratio_fn, masked_accuracy, search
from mechkit.pruning.calibration import calibrate
from mechkit.pruning.cost import (
    flops_per_token,
    heldout_text,
    latency,
    n_params,
    perplexity,
    timing_reference,
)
from mechkit.pruning.guides import Scores
from mechkit.pruning.pipeline import circuit_scores, guide_scores
from mechkit.pruning.plan import UnitsToRemove
from mechkit.pruning.reconstruct import METHODS, Fit
from mechkit.pruning.reconstruct import reconstruct as refit
from mechkit.pruning.select import make_plan
from mechkit.pruning.sensitivity import layer_sensitivity
from mechkit.pruning.slicing import prune_copy, save_pruned

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

Step = Callable[[str, Callable[[], Any]], Any]
"""``step(key, compute)``: run ``compute()`` (or return its stored result under ``key``)."""

BUDGET_RETRIES = 3  # re-measures of the budget row before reporting it as not met
LATENCY_AIM = 0.95  # a latency budget's search aims at this share of it: measured latency is noisy
TASK_SCORED = ("attribution", "ablation", "induction", "combined")  # guides built on attribution scores
MEASURED = ("gradient", "ablation")  # guides whose own scores cost passes over the calibration prompts


def compute_now(_key: str, compute: Callable[[], Any]) -> Any:
    """The default step: compute now, keep nothing."""
    return compute()


def budget_fix(targets: list[str], candidates: list[dict], unit: str = "latency", protects: bool = False) -> str:
    """The fix for a budget no plan reaches: raise it (to about what the cheapest plan reached). Adding unit types
    to --target is not offered: whether pruning more kinds reaches the budget is not known without searching
    them (``--target heads`` under ``--budget 0.2`` was told to add neurons and layers, which reached 0.29).

    >>> budget_fix(["neurons"], [{"cost_ratio": 0.62}], "flops")
    'raise --budget (the cheapest plan tried reached 0.62)'
    >>> budget_fix(["neurons", "heads", "layers"], [])
    'raise --budget'
    """
    ratios = [c["cost_ratio"] for c in candidates if isinstance(c.get("cost_ratio"), int | float)]
    if ratios and min(ratios) >= 1:  # --budget stays below 1: raising it cannot reach a plan no faster than dense
        other = "--budget-unit flops, or " if unit == "latency" else ""
        if protects:  # --protect-top-k may keep every unit the targets hold: nothing else would help
            return ("no plan tried removed anything or was cheaper than the dense model: lower --protect-top-k, "
                    "which keeps the top heads and the layers holding them (--protect-top-k 0 keeps none)")
        return (f"no plan tried was cheaper than the dense model (the cheapest reached {min(ratios):.2f} of its "
                f"{unit}), so no --budget below 1 is met: pass {other}--sparsity instead of --budget")
    fix = "raise --budget" + (f" (the cheapest plan tried reached {min(ratios):.2f})" if ratios else "")
    if unit == "latency" and ratios:  # measured afresh each run: a budget just above this figure may miss it again
        fix += ("; latency is measured again each run, so leave a margin above that figure, or pass --budget-unit "
                "flops, which is the same every run")
    return fix


def unsearched(targets: Sequence[str]) -> tuple[str, str] | None:
    """Why ``--budget`` has no plan to search for ``targets`` (each of its mixes prunes neurons or layers, so
    ``--target heads`` alone gave none: no candidate, and a "raise --budget" no budget met), and the fix;
    ``None`` where some mix fits.

    >>> unsearched(["heads"])[1]
    'pass --sparsity instead of --budget, or add neurons or layers to --target to search their mixes with heads'
    >>> unsearched(["neurons"]) is None
    True
    """
    from mechkit.pruning.budget import MIXES

    if any(set(mix) <= set(targets) for mix in MIXES.values()):
        return None
    return (f"--budget searches the mixes {', '.join(MIXES)}, each pruning neurons or layers, and --target "
            f"{','.join(targets)} prunes neither, so no plan would be searched",
            f"pass --sparsity instead of --budget, or add neurons or layers to --target to search their mixes with "
            f"{' and '.join(targets)}")


@dataclass(frozen=True)
class PruneConfig:
    """The settings of :class:`PruneStudy` (what the ``prune`` plugin builds from its options); the
    defaults are the study's own. Each is described on :class:`PruneStudy`."""

    targets: Sequence[str] = ("neurons",)
    n_calib: int = 16
    n: int = 30
    shots: int = 10
    seed: int = 0
    allocation: str = "global"
    gqa: str = "slot"
    reconstruct: str = "lsq"
    sequential: bool = False
    ridge: float = 1e-2
    text_weight: float = 0.5
    guide_text_weight: float = 0.5
    protect_top_k: int = 10
    repeats: int = 7
    timing: str = "last"
    timing_batch: int = 8
    batch_size: int = 16


class PruneStudy:
    """Calibration, held-out sets and measured rows of pruned copies of ``handle`` for ``tasks``.

    ``config`` is a :class:`PruneConfig`; keywords instead build one (``PruneStudy(m, tasks, n_calib=3)``).
    ``targets`` are the unit types a budget search may prune; ``n_calib`` calibration prompts per
    task (scores and budget search) and ``n`` held-out prompts per task (evaluation only), both with
    ``shots`` demonstrations, seeded from ``seed`` (calibration at an offset, see
    :func:`~mechkit.pruning.calibrate`), mixed with generic text at ``text_weight`` (statistics and
    reconstruction) and ``guide_text_weight`` (the gradient guides' scores). ``allocation``
    and ``gqa`` are :func:`~mechkit.pruning.make_plan`'s (a guide written ``GUIDE@ALLOCATION``
    overrides the allocation); ``protect_top_k`` is the induction guides'. ``reconstruct`` is what
    replaces removed units: ``"none"`` (zero), ``"mean"`` (their calibration mean, a bias) or
    ``"lsq"`` (:func:`~mechkit.pruning.reconstruct` with ``ridge``, ``sequential`` or one-shot); a
    row may override it. Latency is the median of ``repeats``
    interleaved forwards of ``timing_batch`` held-out prompts, ``timing`` ``"last"`` (last-position
    logits: answering a prompt, a generation's prefill) or ``"all"`` (every position) — the one that
    gives the speedup and the budget; the other is reported too.
    """

    def __init__(self, handle: ModelHandle, tasks: Sequence[str], config: PruneConfig | None = None, *,
                 step: Step = compute_now, **settings: Any):
        config = dataclasses.replace(config or PruneConfig(), **settings)
        (targets, n_calib, n, shots, seed, allocation, gqa, reconstruct, sequential, ridge, text_weight,
         guide_text_weight, protect_top_k, repeats, timing, timing_batch, batch_size) = dataclasses.astuple(config)
        # the arguments that rebuild this study on the same model elsewhere (a Ray worker): PruneStudy(m, **config)
        self.config = {"tasks": list(tasks), **dataclasses.asdict(config), "targets": list(targets)}
        self.handle, self.tasks, self.targets = handle, list(tasks), list(targets)
        self.seed, self.allocation, self.gqa = seed, allocation, gqa
        self.reconstruct, self.sequential, self.ridge = _method(reconstruct), sequential, ridge
        self.protect_top_k, self.repeats, self.timing = protect_top_k, repeats, timing
        self.batch_size = batch_size
        self.step = step
        self.calib = calibrate(handle, self.tasks, n_calib, shots, seed, text_weight=text_weight)
        self.guide_text_weight = guide_text_weight
        self._batches = None
        test = task_prompts(self.tasks, n, shots, seed, None)
        calib_texts = {c.text for c in self.calib.prompts}
        self.test = {t: [q for q in ps if q.text not in calib_texts] for t, ps in test.items()}
        self.text, self.text_source = heldout_text()
        self.timing_texts = [q.text for ps in self.test.values() for q in ps][:timing_batch]
        self._scores: dict[str, Scores] = {}
        self._sensitivity: dict[str, np.ndarray] = {}
        self._attribution: Scores | None = None
        self._circuit: dict | None = None
        self._timed: tuple[ModelHandle, str] | None = None

    def scores(self, guide: str) -> Scores:
        """The scores of ``guide`` (a name, no ``@allocation``) on the calibration prompts, computed once.

        The attribution scores, the heads' circuit scores and the gradient and ablation guides' scores
        are steps: every task-scored guide reuses one attribution pass, and the induction guides one
        circuit pass.
        """
        if guide not in self._scores:
            if guide in ("induction", "combined") and self._circuit is None:
                circuit = self.step("circuit", lambda: circuit_scores(self.handle, seed=self.seed))
                self._circuit = {k: _array(v) for k, v in circuit.items()}
            if guide in TASK_SCORED and self._attribution is None:
                raw = self.step("scores|attribution", lambda: _scores_dict(
                    guide_scores(self.handle, "attribution", self.calib, text_weight=self.guide_text_weight)))
                self._attribution = Scores(_array(raw["mlp"]), _array(raw["heads"]), _array(raw["layers"]),
                                           "attribution")
            if guide in MEASURED:  # a backward or an ablation per unit: worth keeping
                raw = self.step(f"scores|{guide}", lambda: _scores_dict(self._guide_scores(guide)))
                self._scores[guide] = Scores(_array(raw["mlp"]), _array(raw["heads"]), _array(raw["layers"]), guide)
            else:
                self._scores[guide] = self._guide_scores(guide)
        return self._scores[guide]

    def _guide_scores(self, guide: str) -> Scores:
        return guide_scores(self.handle, guide, self.calib, seed=self.seed, protect_top_k=self.protect_top_k,
                            circuit=self._circuit, attribution=self._attribution, text_weight=self.guide_text_weight)

    def sensitivity(self, guide: str) -> np.ndarray:
        """Measured per-layer MLP sensitivity under ``guide``'s channel order (a step, computed once)."""
        if guide not in self._sensitivity:
            values = self.step(f"sensitivity|{guide}", lambda: layer_sensitivity(
                self.handle, self.scores(guide).mlp, self.calib).tolist())
            self._sensitivity[guide] = _array(values)
        return self._sensitivity[guide]

    def shared(self, guides: Sequence[str], levels: Sequence[dict[str, float]]) -> dict:
        """What every row of ``guides`` × ``levels`` shares, computed here once, as plain lists: the
        study's :attr:`config`, each guide's scores, the measured sensitivities the allocation needs,
        and the calibration's :meth:`fingerprint`. :meth:`adopt` takes them in another process.

        >>> import mechkit as mk
        >>> m = mk.load_model("tiny:llama")
        >>> study = PruneStudy(m, ["capitalize"], n_calib=2, n=2, shots=2)
        >>> sorted(study.shared(["random", "wanda@uniform"], [{"neurons": 0.2}])["scores"])
        ['random', 'wanda']
        """
        scores, sensitivity = {}, {}
        for guide in guides:
            name, _, alloc = guide.partition("@")
            scores[name] = _scores_lists(self.scores(name))
            if (alloc or self.allocation) == "sensitivity" and any(level.get("neurons") for level in levels):
                sensitivity[name] = self.sensitivity(name).tolist()
        return {"config": self.config, "scores": scores, "sensitivity": sensitivity,
                "calibration": self.fingerprint()}

    def adopt(self, shared: dict) -> None:
        """Take the scores and sensitivities of :meth:`shared` (computed by the study it came from) as this
        study's own; one line when this study calibrated differently (another model, other weights)."""
        if shared["calibration"] != self.fingerprint():
            raise MechkitError("this process calibrated the pruning study differently from the run (other "
                               "weights, or torch on another number of threads)",
                               "load the same model with the same torch threads as the run")
        self._scores.update({name: _scores_from(raw) for name, raw in shared["scores"].items()})
        self._sensitivity.update({name: _array(v) for name, v in shared["sensitivity"].items()})

    def fingerprint(self) -> str:
        """SHA-256 of the calibration prompts and their unit statistics: equal wherever the study is built
        from the same model, options and seed (calibration is deterministic)."""
        import hashlib

        import torch

        stats = self.calib.stats
        digest = hashlib.sha256("\n".join(self.calib.texts + self.calib.generic).encode())
        for tensor in (stats.mlp_mean, stats.mlp_sq, stats.head_mean, stats.head_sq, stats.block_influence):
            digest.update(tensor.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
        digest.update(str(stats.n_tokens).encode())
        return digest.hexdigest()

    def plan(self, guide: str, level: dict[str, float], reconstruct: str | None = None,
             strict: bool = True) -> UnitsToRemove:
        """The plan of ``guide`` (``GUIDE@ALLOCATION`` overrides the study's allocation) at ``level``;
        it compensates unless ``reconstruct`` (default: the study's) is ``"none"``. ``strict``: a level the
        protected heads keep from being met is refused (the budget search instead takes what it can remove)."""
        name, _, alloc = guide.partition("@")
        alloc = alloc or self.allocation
        sens = self.sensitivity(name) if alloc == "sensitivity" and level.get("neurons") else None
        method = _method(reconstruct or self.reconstruct)
        return make_plan(self.scores(name), self.handle.anatomy, level, alloc, self.gqa, method != "none", sens,
                         strict=strict)

    def fits(self, plan: UnitsToRemove, reconstruct: str | None = None, sequential: bool | None = None) -> dict[str, Fit]:
        """The least-squares refits of ``plan`` on the calibration tokens (none unless the method is lsq),
        sequential or one-shot as ``sequential`` (default: the study's) says."""
        if _method(reconstruct or self.reconstruct) != "lsq":
            return {}
        if self._batches is None:
            self._batches = self.calib.token_batches(self.handle)
        return refit(self.handle, plan, self._batches, self.ridge, self.sequential if sequential is None else sequential)

    def prune(self, plan: UnitsToRemove, reconstruct: str | None = None, sequential: bool | None = None) -> ModelHandle:
        """The physically pruned copy of ``plan``, reconstructed as ``reconstruct`` (default: the study's) says."""
        return prune_copy(self.handle, plan, self.calib.stats, self.fits(plan, reconstruct, sequential))

    def reconstruction(self, reconstruct: str | None = None) -> str:
        """A label of the reconstruction: ``none``, ``mean``, ``lsq`` or ``lsq-seq``, with the ridge."""
        method = _method(reconstruct or self.reconstruct)
        if method != "lsq":
            return method
        return f"lsq{'-seq' if self.sequential else ''} ridge={self.ridge:g}"

    def measure(self, handle: ModelHandle, plan: UnitsToRemove | None = None) -> dict:
        """Held-out accuracy per task and their mean, perplexity, parameters and FLOPs per token of a
        (pruned) ``handle``; ``plan`` is recorded beside them."""
        metrics = evaluate(handle, self.test, self.batch_size)
        acc = {t: metrics[t]["accuracy"] for t in self.tasks}
        return {"accuracy": acc, "mean_accuracy": sum(acc.values()) / len(acc),
                "perplexity": perplexity(handle, self.text), "params": n_params(handle),
                "flops_per_token": flops_per_token(handle), "plan": plan.as_dict() if plan else None}

    def dense(self) -> dict:
        """The dense model's :meth:`measure` (a step); its latency is :meth:`dense_latency`."""
        return self.step("dense", lambda: self.measure(self.handle))

    @property
    def timed(self) -> ModelHandle:
        """The dense model as timed (:func:`~mechkit.pruning.cost.timing_reference`: for a dispatched model a
        plain copy on its main device where that fits, as its pruned copies); :attr:`dense_timing` says how."""
        if self._timed is None:
            self._timed = timing_reference(self.handle)
        return self._timed[0]

    @property
    def dense_timing(self) -> str:
        self.timed  # noqa: B018 - computed once
        return self._timed[1]

    def dense_latency(self) -> float:
        """The dense model's median forward seconds on the timed batch, at the study's timing."""
        return latency([self.timed], self.timing_texts, repeats=self.repeats, last=self.timing == "last")[0]

    def row(self, guide: str, level: dict[str, float], reconstruct: str | None = None) -> dict:
        """One measured pruned copy (a step): :meth:`measure` plus latency against the dense model,
        interleaved on the same batch — ``latency_ratio`` and ``speedup`` at the study's timing,
        ``speedup_other_timing`` at the other — and ``reconstruct_s``, the seconds the least-squares
        refit took. ``reconstruct`` overrides the study's method for this row."""
        measured = self.step(self.row_key(guide, level, reconstruct),
                             lambda: self.measure_row(guide, level, reconstruct))
        return self.labelled(guide, level, measured, reconstruct)

    def row_key(self, guide: str, level: dict[str, float], reconstruct: str | None = None) -> str:
        """The step key of :meth:`row`: the same wherever the row is measured, so a run resumes across
        executors."""
        return f"row|{guide}|{self.allocation}|{sorted(level.items())}|{self.reconstruction(reconstruct)}"

    def labelled(self, guide: str, level: dict[str, float], measured: dict, reconstruct: str | None = None) -> dict:
        """A row as :meth:`row` reports it: ``guide``, ``sparsity``, ``reconstruct``, then ``measured``."""
        return {"guide": guide, "sparsity": level, "reconstruct": self.reconstruction(reconstruct), **measured}

    def measure_row(self, guide: str, level: dict[str, float], reconstruct: str | None = None) -> dict:
        """What :meth:`row` keeps as its step: the pruned copy's :meth:`measure`, its latency interleaved
        with the dense model's in this process (so the ratios hold wherever it runs) and the refit's
        seconds."""
        import time

        plan = self.plan(guide, level, reconstruct)
        start = time.perf_counter()
        fits = self.fits(plan, reconstruct)
        took = time.perf_counter() - start
        pruned = prune_copy(self.handle, plan, self.calib.stats, fits)
        out = self.measure(pruned, plan)
        out["reconstruct_s"] = took
        last = self.timing == "last"
        dense_t, pruned_t = latency([self.timed, pruned], self.timing_texts, repeats=self.repeats, last=last)
        other_d, other_p = latency([self.timed, pruned], self.timing_texts,
                                   repeats=max(3, self.repeats // 2), last=not last)
        out.update(latency_s=pruned_t, dense_latency_s=dense_t, latency_ratio=pruned_t / dense_t,
                   speedup=dense_t / pruned_t, timing=self.timing, speedup_other_timing=other_d / other_p)
        return out

    def budget(self, guide: str, budget: float, unit: str = "latency",
               on_step: Callable[[str, dict, float], None] | None = None) -> dict:
        """The plan of ``guide`` that keeps the most calibration accuracy within ``budget`` × the dense
        cost (``unit`` ``"latency"`` or ``"flops"``), and its measured row.

        The search (:func:`mechkit.pruning.budget.search`, a step; ``on_step(mix, sparsity, ratio)``
        sees each bisection) aims at 95% of a latency budget, since measured latency is noisy. The
        reported row must meet the budget itself: while it does not, the sparsity grows by 5% (+0.01)
        and the row is measured again, at most :data:`BUDGET_RETRIES` times; ``met`` says whether it
        did. Returns the search's ``candidates``, the ``chosen`` one, ``measured_ratio``, ``met`` and
        ``chosen_row``; raises :class:`MechkitError` when no mix reaches the budget.
        """
        none = unsearched(self.targets)
        if none is not None:  # before any work: no mix to search, so no budget would be met
            raise MechkitError(*none)
        cost = cost_ratio_fn(self.handle, unit, self.timing_texts, repeats=max(3, self.repeats // 2),
                             last=self.timing == "last")
        acc = masked_accuracy(self.handle, self.calib, self.batch_size,
                              self.prune if self.reconstruct == "lsq" else None)

        def compute() -> list[dict]:
            margin = LATENCY_AIM if unit == "latency" else 1.0
            found = search(lambda sparsity: self.plan(guide, sparsity, strict=False), self.calib.stats, budget * margin,
                           self.targets, cost, acc, on_step=on_step)
            return [{"mix": c.mix, "sparsity": c.sparsity, "cost_ratio": c.cost_ratio,
                     "calib_accuracy": c.calib_accuracy} for c in found]

        candidates = self.step(f"budget|{guide}|{budget}|{unit}", compute)
        within = [c for c in candidates if c["calib_accuracy"] is not None]
        if not within:
            raise MechkitError(f"no plan of {', '.join(self.targets)} reaches {budget} of the dense {unit}",
                               budget_fix(self.targets, candidates, unit,
                                          guide.partition("@")[0] in ("induction", "combined") and self.protect_top_k > 0))
        chosen = max(within, key=lambda c: c["calib_accuracy"])
        sparsity = dict(chosen["sparsity"])
        for _ in range(BUDGET_RETRIES):  # the reported row must meet the budget; noise can put it just over
            row = self.row(guide, sparsity)
            measured = row["latency_ratio"] if unit == "latency" else \
                row["flops_per_token"] / flops_per_token(self.handle)
            if measured <= budget:
                break
            sparsity = {k: min(v * 1.05 + 0.01, 0.95) for k, v in sparsity.items()}
        return {"budget": budget, "unit": unit, "guide": guide, "candidates": candidates, "chosen": chosen,
                "measured_ratio": measured, "met": measured <= budget, "chosen_row": row}

    def pruned(self, row: dict) -> ModelHandle:
        """The pruned copy a row measured, rebuilt from its recorded plan and reconstruction."""
        label = str(row.get("reconstruct", self.reconstruct))  # "mean", "lsq-seq ridge=0.01", ...
        method = label.split(" ")[0]
        return self.prune(UnitsToRemove.from_dict(row["plan"]), method.split("-")[0], method == "lsq-seq")

    def save(self, row: dict, out_dir: str | Path | None = None) -> Path:
        """Write :meth:`pruned` of ``row`` with :func:`~mechkit.pruning.save_pruned` to ``out_dir``, or to a
        fresh temporary directory (removed again if the save fails) for a caller to move. That directory is
        named with this process's pid (:func:`mechkit.io.leftovers.make_prepared_dir`): a run killed before the
        report moved it in left a whole model in ``$TMPDIR`` for good, which the next save, ``cache list`` and
        ``cache clear leftovers`` now find; a killed run's folders are removed as the next one is made. The folder's
        lock is held until the report moved it in (:func:`mechkit.report.writer.move_prepared` lets it go)."""
        pruned = self.pruned(row)
        if out_dir is not None:
            return save_pruned(pruned, out_dir)
        tmp = make_prepared_dir()
        try:
            os.chmod(tmp, dir_mode())  # mkdtemp's 0700 would stay: the folder is kept as the user's model/
            return save_pruned(pruned, tmp)
        except BaseException:
            discard_tree(tmp)
            release_prepared(tmp)
            raise


def _method(name: str) -> str:
    if name not in METHODS:
        raise MechkitError(f"unknown reconstruction {name!r}", f"use one of: {', '.join(METHODS)}")
    return name


def _array(value) -> np.ndarray:
    return np.asarray(value, dtype=float)


def _scores_dict(s: Scores) -> dict:
    return {"mlp": s.mlp.tolist(), "heads": s.heads.tolist(), "layers": s.layers.tolist()}


def _scores_lists(s: Scores) -> dict:
    """Every field of ``s`` as plain lists, with the arrays' dtypes (:func:`_scores_from` undoes it exactly)."""
    return {**_scores_dict(s), "dtypes": [str(s.mlp.dtype), str(s.heads.dtype), str(s.layers.dtype)],
            "guide": s.guide, "protected_heads": [list(h) for h in s.protected_heads]}


def _scores_from(raw: dict) -> Scores:
    mlp, heads, layers = (np.asarray(raw[k], dtype=d) for k, d in zip(("mlp", "heads", "layers"), raw["dtypes"],
                                                                      strict=True))
    return Scores(mlp, heads, layers, raw["guide"], tuple(tuple(h) for h in raw["protected_heads"]))
