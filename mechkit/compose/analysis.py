"""The whole composition analysis over one model: what the ``compose`` plugin runs, part by part.

:class:`ComposeStudy` holds the options every part shares and runs each of the four parts
(:data:`~mechkit.compose.settings.PARTS`) on a list of composites:

- :meth:`~ComposeStudy.settings` (parts ``study`` and ``steps``): every setting of
  :func:`~mechkit.compose.study.evaluate_cell` over the shots grid and the prompt seeds, for one
  or several models, with the summary over seeds (:func:`~mechkit.compose.study.summarize`);
- :meth:`~ComposeStudy.components` (part ``components``): each head's and MLP block's ablation
  effect on the composite and on each simple task, ranked by the composite-specific effect, the
  ranks of the top induction and previous-token heads, and the top heads checked exactly;
- :meth:`~ComposeStudy.strengthen` (part ``strengthen``): the selected heads scaled (or given
  their mean composite-in-context output), strength chosen on dev prompts, held-out composite
  accuracy against the same treatment of random heads.

Prompt seeds, all from ``seed`` s: study s..s+seeds-1; component effects s+1000; dev s+2000;
test s+3000 (queries seen in the effect or dev prompts are left out); vector contexts s+4000
(:data:`OFFSETS`). Every long unit goes through ``step(key, compute)`` (by default just
``compute()``; a plugin passes its resumable ``RunContext.step``), so an interrupted run resumes
at the last finished unit (what a step returns is JSON-able, so it reads back the same);
``on_unit(description)`` is called before each unit (a progress bar).

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> study = ComposeStudy(m, ["capitalize+swap"], shots=[0, 2], n=2, seeds=1, top_k=2, verify=0,
...                      n_effect=2, n_seqs=4, seg_len=5)
>>> sorted(study.settings({"tiny": m})["summary"]["tiny"]["capitalize+swap"])
['0', '2']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import torch

from mechkit.actvec import mean_head_outputs, score_edited
from mechkit.compose.components import (
    ComponentEffects,
    component_effects,
    composite_specific,
    exact_head_effects,
    ranks_of,
)
from mechkit.compose.settings import PARTS, composite_task, study_prompts
from mechkit.compose.stepwise import decoded_length, steps_prompts
from mechkit.compose.strengthen import (
    TREATMENTS,
    choose_strength,
    head_vector_edits,
    random_draws,
    scale_heads,
)
from mechkit.compose.study import evaluate_cell, summarize
from mechkit.errors import MechkitError
from mechkit.eval import check_context, encode_rows, mean_std, score_prompts
from mechkit.heads import Head, compute_scores, top_heads
from mechkit.heads.scores import grid_list
from mechkit.model.checks.identity import identity_tag

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

__all__ = ["OFFSETS", "ComposeStudy", "compare", "held_out", "treat"]

OFFSETS = {"effects": 1000, "dev": 2000, "test": 3000, "contexts": 4000}
Step = Callable[[str, Callable[[], Any]], Any]


def compute_now(_key: str, compute: Callable[[], Any]) -> Any:
    """The default step: compute now, keep nothing."""
    return compute()


def held_out(make: Callable[[int], list], n: int, avoid: set[str]) -> tuple[list, bool]:
    """``n`` prompts from ``make(pool)`` whose queries are not in ``avoid`` (fewer where the task has
    too few queries), and True; where none is left (tiny query spaces), the first ``n`` and False."""
    pool = make(n + len(avoid))
    kept = [q for q in pool if q.query not in avoid][:n]
    return (kept, True) if kept else (pool[:n], False)


@dataclass(frozen=True)
class ComposeConfig:
    """The settings of :class:`ComposeStudy` (what the ``compose`` plugin builds from its options); the
    defaults are the study's own, each described there."""

    shots: Sequence[int] = (0, 2, 5, 10)
    n: int = 5
    seeds: int = 3
    seed: int = 0
    words: bool = False
    effect_shots: int | None = None
    n_effect: int = 6
    method: str = "attribution"
    mlp_ablation: str = "mean"
    contrast: str = "max"
    top_k: int = 5
    verify: int = 3
    n_seqs: int = 20
    seg_len: int = 25
    strengths: Sequence[float] = (1.25, 1.5, 2.0)
    draws: int = 3
    n_dev: int = 5
    n_test: int = 8
    n_contexts: int = 8
    batch_size: int = 16


class ComposeStudy:
    """The four parts of the composition analysis of ``handle`` on the composites ``pairs``.

    ``config`` is a :class:`ComposeConfig`; keywords instead build one (``ComposeStudy(m, pairs, n=2)``).

    ``shots`` is the grid of demonstrations K (the component and strengthening prompts use
    ``effect_shots``, by default the grid's largest); ``n`` queries per setting, composite, K and
    seed, over ``seeds`` prompt seeds from ``seed``; ``words`` adds the seeds' word-level accuracy.
    ``method``, ``mlp_ablation`` and ``contrast`` are the component effects' (:mod:`~mechkit.compose.components`),
    on ``n_effect`` prompts per set; ``top_k`` heads are selected, ``verify`` of them checked by
    exact ablation; ``n_seqs``/``seg_len`` are the induction and previous-token scores'. Strengthening
    tries ``strengths`` on ``n_dev`` dev prompts and scores ``n_test`` held-out ones, against
    ``draws`` random head sets; the vector treatment averages ``n_contexts`` prompts.
    """

    def __init__(self, handle: ModelHandle, pairs: Sequence[str], config: ComposeConfig | None = None, *,
                 step: Step = compute_now, on_unit: Callable[[str], None] = lambda _description: None,
                 **settings: Any):
        config = dataclasses.replace(config or ComposeConfig(), **settings)
        (shots, n, seeds, seed, words, effect_shots, n_effect, method, mlp_ablation, contrast, top_k, verify, n_seqs,
         seg_len, strengths, draws, n_dev, n_test, n_contexts, batch_size) = (
            getattr(config, f.name) for f in dataclasses.fields(config))
        total = sum(handle.anatomy.head_counts)
        if top_k * 2 > total:  # the random baseline needs top_k heads outside the selected ones
            raise MechkitError(f"--top-k {top_k} leaves too few other heads for random draws ({total} heads)",
                               f"use --top-k up to {total // 2}")
        self.handle, self.pairs = handle, [composite_task(p).id for p in pairs]
        self.shots = sorted(set(shots))
        self.top = self.shots[-1]
        self.effect_shots = self.top if effect_shots is None else effect_shots
        self.n, self.seeds, self.seed, self.words = n, seeds, seed, words
        self.n_effect, self.method, self.mlp_ablation, self.contrast = n_effect, method, mlp_ablation, contrast
        self.top_k, self.verify, self.n_seqs, self.seg_len = top_k, verify, n_seqs, seg_len
        self.strengths, self.draws = sorted(strengths), draws
        self.n_dev, self.n_test, self.n_contexts, self.batch_size = n_dev, n_test, n_contexts, batch_size
        self.step, self.on_unit = step, on_unit

    def units(self, parts: Sequence[str], n_models: int = 1, treatments: Sequence[str] = ("scale",)) -> int:
        """How many units (progress steps) :meth:`run` goes through for ``parts``."""
        count = 0
        if "study" in parts or "steps" in parts:
            grid = len(self.shots) if "study" in parts else 1
            count += n_models * len(self.pairs) * grid * self.seeds
        if "components" in parts or "strengthen" in parts:
            count += 1 + len(self.pairs) * (4 if self.method == "attribution" and self.verify else 3)
        if "strengthen" in parts:
            count += len(self.pairs) * (1 + len(treatments) * (1 + self.draws) + ("vector" in treatments))
        return count

    def check_fits(self, parts: Sequence[str], models: dict[str, ModelHandle] | None = None) -> None:
        """Refuse, before any work, prompts longer than a model's context at the largest K the parts use
        (the grid's for the study, ``effect_shots`` for the components and strengthening): the defaults on
        a 512-token model (tiny:gpt2) were refused only at K = 10, after every smaller K's cells were
        computed. The fix names the largest K whose prompts fit (:func:`_most_that_fit`), with the grid's smaller
        K for the study: ``--shots 100`` on a 512-token model was told ``use --shots 0`` although 60 fits."""
        wanted = ([self.top] if {"study", "steps"} & set(parts) else []) + \
            ([self.effect_shots] if {"components", "strengthen"} & set(parts) else [])
        steps = "steps" in parts
        for spec, handle in (models or {self.handle.spec: self.handle}).items():
            if handle.context_length is None:
                continue

            @cache  # the fix's search and the check ask for the same K again
            def longest(k: int, decode: bool = False, handle: ModelHandle = handle) -> int:
                """The longest sequence at K: the prompts, and with ``decode`` the study's greedy decoding too
                (``--words``; the steps part, counted at every K as it grows with K), which runs past the
                prompt by an answer's tokens: ``--shots 0,2,5,8`` suggested on tiny:gpt2 was an IndexError."""
                prompts = [p for pair in self.pairs for s in range(self.seeds)
                           for ps in study_prompts(pair, self.n, k, self.seed + s).values() for p in ps]
                most = max(len(row.ids) for row in encode_rows(handle.text_tokenizer(), prompts, None))
                decoded = (prompts if decode and self.words else []) + (
                    [p for pair in self.pairs for s in range(self.seeds)
                     for p in steps_prompts(pair, self.n, k, self.seed + s)] if decode and steps and k > 0 else [])
                return max([most, *(decoded_length(handle, p) for p in decoded)])

            for k in sorted(set(wanted), reverse=True):
                decode = k == self.top and bool({"study", "steps"} & set(parts))  # the study's K, not only effects'
                if longest(k, decode) <= handle.context_length:
                    continue
                most = _most_that_fit(k, lambda x, f=longest, d=decode, limit=handle.context_length: f(x, d) <= limit)
                where, more = f"{spec}'s context holds {handle.context_length} tokens", ""
                if decode and longest(k) <= handle.context_length:
                    where += ", counting the answer tokens greedy decoding writes (steps, --word-match)"
                if most is None:
                    fix = f"use a model with a longer context (even 0-shot prompts are {longest(0, decode)} tokens)"
                elif k == self.top:  # the grid's K that fit; where the largest K that does is not among them, it too
                    grid = [x for x in self.shots if x <= most and longest(x, decode) <= handle.context_length]
                    fix = f"use --shots {','.join(map(str, grid or [most]))}"
                    if grid and most not in grid:
                        more = f" (or --shots {','.join(map(str, [*grid, most]))}: {most} is the most shots that fit)"
                else:
                    fix = f"use --effect-shots {most} or fewer"
                check_context(handle, longest(k, decode), f"{fix}: {where}{more}")

    def run(self, parts: Sequence[str], models: dict[str, ModelHandle] | None = None,
            treatments: Sequence[str] = ("scale",)) -> dict:
        """The parts asked for: ``{"study", "components", "strengthen"}`` as present. ``models`` (spec ->
        handle, this study's model among them) are the study's; the others use this model only."""
        unknown = [t for t in treatments if t not in TREATMENTS]
        if unknown or set(parts) - set(PARTS):
            raise MechkitError(f"unknown treatment or part: {', '.join(unknown or sorted(set(parts) - set(PARTS)))}",
                               f"use treatments among {', '.join(TREATMENTS)} and parts among {', '.join(PARTS)}")
        out: dict = {}
        if "study" in parts or "steps" in parts:
            out["study"] = self.settings(models or {self.handle.spec: self.handle}, steps="steps" in parts,
                                         grid="study" in parts)
        if "components" in parts or "strengthen" in parts:
            out["components"] = self.components()
        if "strengthen" in parts:
            out["strengthen"] = self.strengthen(out["components"], treatments)
        return out

    # ---- study and steps -------------------------------------------------------------------------------
    def settings(self, models: dict[str, ModelHandle], steps: bool = False, grid: bool = True) -> dict:
        """Every setting's accuracy per (model, composite, K, seed) cell, and their summary over seeds.

        ``grid=False`` measures only the grid's largest K; ``steps`` adds the intermediate-step
        setting there."""
        plan = [(spec, pair, k, self.seed + s) for spec in models for pair in self.pairs
                for k in (self.shots if grid else [self.top]) for s in range(self.seeds)]
        # each model's identity in its steps' keys: the run's resume key holds only --models' names, so a
        # directory changed between a kill and the rerun would otherwise resume on the old model's cells
        tags = {spec: identity_tag(handle) for spec, handle in models.items()}
        cells = []
        for spec, pair, k, seed in plan:
            with_steps = steps and k == self.top
            self.on_unit(f"study {pair} K={k} seed {seed}")
            metrics = self.step(f"study|{spec}@{tags[spec]}|{pair}|{k}|{seed}|{with_steps}", partial(
                evaluate_cell, models[spec], pair, k, seed, self.n, steps=with_steps, batch_size=self.batch_size,
                words=self.words))
            cells.append({"model": spec, "pair": pair, "shots": k, "seed": seed, "metrics": metrics})
        return {"cells": cells, "summary": summarize(cells)}

    # ---- components ------------------------------------------------------------------------------------
    def effect_sets(self, pair: str) -> dict[str, list]:
        """The component-effect prompt sets of a composite: ``composite`` and each component's own."""
        task, seed = composite_task(pair), self.seed + OFFSETS["effects"]
        sets = {"composite": task.prompts(n=self.n_effect, shots=self.effect_shots, seed=seed, setting="composite")}
        per = task.prompts(n=self.n_effect, shots=self.effect_shots, seed=seed, setting="simple")
        for i, c in enumerate(task.components):
            sets[c] = per[i * self.n_effect:(i + 1) * self.n_effect]
        return sets

    def components(self) -> dict:
        """Per composite: the effects, the composite-specific effect of every head and MLP block, the
        selected heads, the reference heads' ranks and (attribution) the exact check of the top heads."""
        self.on_unit("induction and previous-token scores")
        scores = self.step("head-scores", lambda: compute_scores(self.handle, self.n_seqs, self.seg_len, self.seed))
        reference = {kind: top_heads(scores[kind], self.top_k) for kind in ("induction", "previous-token")}
        return {"scores": scores, "pairs": {pair: self._pair_components(pair, reference) for pair in self.pairs}}

    def _pair_components(self, pair: str, reference: dict[str, list[Head]]) -> dict:
        a, task, sets = self.handle.anatomy, composite_task(pair), self.effect_sets(pair)
        effects = {}
        for name, prompts in sets.items():
            self.on_unit(f"effects {pair}: {name}")
            effects[name] = ComponentEffects.from_dict(self.step(f"effects|{pair}|{name}", lambda prompts=prompts: (
                component_effects(self.handle, prompts, self.method, self.mlp_ablation, self.batch_size).as_dict())))
        simple = [effects[c] for c in task.components]
        cs_heads = composite_specific(effects["composite"].heads, [e.heads for e in simple], self.contrast)
        cs_mlps = composite_specific(effects["composite"].mlps, [e.mlps for e in simple], self.contrast)
        row = {"components": list(task.components), "how": task.how,
               "effects": {name: e.as_dict() | {"heads": grid_list(e.heads, a)} for name, e in effects.items()},
               "composite_specific_heads": grid_list(cs_heads, a), "composite_specific_mlps": cs_mlps.tolist(),
               "selected": [{**h.to_dict(), "cs": float(cs_heads[h.layer, h.head])}
                            for h in top_heads(cs_heads.tolist(), self.top_k)],
               "mlp_ranking": [{"layer": int(i), "cs": float(cs_mlps[i])} for i in (-cs_mlps).argsort()],
               "reference_heads": {}}
        for kind, heads in reference.items():
            ranks = ranks_of(cs_heads, heads)
            row["reference_heads"][kind] = {
                "heads": [h.to_dict() for h in heads], "cs_ranks": ranks,
                "composite_ranks": ranks_of(-effects["composite"].heads, heads),
                "mean_percentile": sum(100.0 * r / sum(a.head_counts) for r in ranks) / len(ranks)}
        if self.method == "attribution" and self.verify > 0:
            check = top_heads(cs_heads.tolist(), self.verify)
            self.on_unit(f"exact check {pair}")
            exact = self.step(f"verify|{pair}", lambda: {
                name: exact_head_effects(self.handle, prompts, check, self.batch_size) for name, prompts in sets.items()})
            exact_cs = composite_specific(exact["composite"], [exact[c] for c in task.components], self.contrast)
            row["verified"] = [{**h.to_dict(), "cs_attribution": float(cs_heads[h.layer, h.head]),
                                "cs_exact": float(v), **{f"effect_{name}": exact[name][i] for name in sets}}
                               for i, (h, v) in enumerate(zip(check, exact_cs, strict=True))]
        return row

    # ---- strengthening ---------------------------------------------------------------------------------
    def strengthen(self, components: dict, treatments: Sequence[str] = ("scale",)) -> dict:
        """Per composite: clean held-out scores, then each treatment of the selected heads (from
        :meth:`components`) and of ``draws`` random head sets, compared (:func:`compare`)."""
        return {pair: self._pair_strengthen(index, pair, components["pairs"][pair], treatments)
                for index, pair in enumerate(self.pairs)}

    def _pair_strengthen(self, index: int, pair: str, components: dict, treatments: Sequence[str]) -> dict:
        a, task, bs = self.handle.anatomy, composite_task(pair), self.batch_size
        selected = [Head(h["layer"], h["head"]) for h in components["selected"]]
        draws = random_draws(a.n_layers, a.head_counts, len(selected), self.draws, self.seed * 100 + index, selected)

        def composite(n: int, offset: str) -> list:
            return task.prompts(n=n, shots=self.effect_shots, seed=self.seed + OFFSETS[offset], setting="composite")

        seen = {q.query for q in composite(self.n_effect, "effects")}
        dev, dev_held = held_out(partial(composite, offset="dev"), self.n_dev, seen)
        test, test_held = held_out(partial(composite, offset="test"), self.n_test, seen | {q.query for q in dev})
        per = task.prompts(n=self.n_test, shots=self.effect_shots, seed=self.seed + OFFSETS["test"], setting="simple")
        test_sets = {"composite": test, **{c: per[i * self.n_test:(i + 1) * self.n_test]
                                           for i, c in enumerate(task.components)}}
        self.on_unit(f"strengthen {pair}: clean")
        clean = self.step(f"clean|{pair}", lambda: {name: _score(self.handle, ps, bs) for name, ps in test_sets.items()})
        out = {"selected": [str(h) for h in selected], "draws": [[str(h) for h in d] for d in draws],
               "n_dev": len(dev), "n_test": len(test), "held_out": dev_held and test_held, "clean": clean}
        means = None
        if "vector" in treatments:
            contexts = task.prompts(n=self.n_contexts, shots=self.effect_shots, seed=self.seed + OFFSETS["contexts"],
                                    setting="composite-in-context")
            self.on_unit(f"strengthen {pair}: mean head outputs")
            means = torch.tensor(self.step(f"means|{pair}", lambda: mean_head_outputs(self.handle, contexts, bs).tolist()))
        for treatment in treatments:
            groups = []
            for g, heads in enumerate([selected, *draws]):
                label = "selected" if g == 0 else f"random {g}"
                self.on_unit(f"strengthen {pair}: {treatment}, {label}")
                sets = test_sets if g == 0 else {"composite": test}  # side effects: the selected heads only
                groups.append({"heads": [str(h) for h in heads], "label": label, **self.step(
                    f"{treatment}|{pair}|{g}",
                    partial(treat, self.handle, treatment, heads, means, dev, sets, self.strengths, bs))})
            out[treatment] = compare(clean, groups)
        return out


def _score(handle: ModelHandle, prompts: Sequence, batch_size: int) -> dict:
    return score_prompts(handle, prompts, batch_size=batch_size).as_dict()


def treat(handle: ModelHandle, treatment: str, heads: Sequence[Head], means: torch.Tensor | None, dev: Sequence,
          test_sets: dict[str, Sequence], strengths: Sequence[float], batch_size: int = 16) -> dict:
    """Choose the strength of ``treatment`` (``scale`` or ``vector``) of ``heads`` on ``dev``, then
    score each of ``test_sets`` with it: ``{"strength", "dev": {strength: score}, "test": {name: score}}``."""
    def scored(prompts: Sequence, strength: float) -> dict:
        if treatment == "scale":
            with scale_heads(handle, heads, strength):
                return _score(handle, prompts, batch_size)
        edited = score_edited(handle, prompts, [head_vector_edits(handle, means, heads, strength)], batch_size)[0]
        return {"accuracy": edited.accuracy, "logprob": edited.logprob, "n": len(prompts)}

    dev_scores = {s: scored(dev, s) for s in strengths}
    best = choose_strength({s: (v["accuracy"], v["logprob"]) for s, v in dev_scores.items()})
    return {"strength": best, "dev": {str(s): v for s, v in dev_scores.items()},
            "test": {name: scored(ps, best) for name, ps in test_sets.items()}}


def compare(clean: dict, groups: list[dict]) -> dict:
    """The selected heads' treatment (``groups[0]``) vs the random sets' (the rest) on the held-out
    composite prompts: accuracies, their change from ``clean`` and the change of answer log-prob.

    >>> s = lambda acc, lp: {"composite": {"accuracy": acc, "logprob": lp}}
    >>> c = compare(s(0.25, -2.0), [{"strength": 2.0, "test": s(0.5, -1.0)}, {"strength": 1.5, "test": s(0.25, -2.5)}])
    >>> c["selected"]["delta"], c["random_delta"], c["selected"]["delta_logprob"], c["random_delta_logprob"]
    (0.25, 0.0, 1.0, -0.5)
    """
    base, base_lp = clean["composite"]["accuracy"], clean["composite"]["logprob"]
    sel = groups[0]
    rand = [g["test"]["composite"] for g in groups[1:]]
    rm, rs = mean_std([r["accuracy"] for r in rand])
    return {"clean": base, "clean_logprob": base_lp,
            "selected": {"strength": sel["strength"], "accuracy": sel["test"]["composite"]["accuracy"],
                         "delta": sel["test"]["composite"]["accuracy"] - base,
                         "delta_logprob": sel["test"]["composite"]["logprob"] - base_lp,
                         "simple": {n: v for n, v in sel["test"].items() if n != "composite"}},
            "random_mean": rm, "random_std": rs, "random_delta": rm - base,
            "random_delta_logprob": mean_std([r["logprob"] for r in rand])[0] - base_lp,
            "groups": groups}


def _most_that_fit(k: int, fits: Callable[[int], bool]) -> int | None:
    """The largest K below ``k`` whose prompts fit (``fits``), else None: a binary search (prompts grow with K),
    whose answer is one ``fits`` said yes to, so a fix naming it runs as written."""
    if not fits(0):
        return None
    low, high = 0, k - 1  # fits(low) holds
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
