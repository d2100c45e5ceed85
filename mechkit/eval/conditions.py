"""The conditions of a head experiment: which heads each one changes, and the accuracy table over them.

``ablate`` and ``shuffle`` compare the selected heads with random heads of the same number (never one
of the selected), the way Song, Xu & Zhong do; the draws, the permutations and the averages over them
live here once, so the plugins only choose options and shape what a reader sees.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.model.headspec import Head, HeadSelection


def ablation_conditions(selection: HeadSelection, n_layers: int, n_heads: int | Sequence[int], ks: Sequence[int],
                        scores: dict | None, seed: int, baseline_seeds: int) -> list[tuple]:
    """``(name, heads, seed, k)`` per condition: the clean model, then for each k the selected heads and
    ``baseline_seeds`` draws of as many random heads (none when 0), seeded ``seed * 1000 + draw``."""
    from mechkit.model.headspec import random_heads

    conditions = [("clean", [], None, None)]
    for k in ks:
        target = selection.resolve(n_layers, n_heads, scores=scores, top_k=k, seed=seed)
        conditions.append(("target", target, None, k))
        for draw in range(baseline_seeds):
            draw_seed = seed * 1000 + draw
            others = random_heads(n_layers, n_heads, len(target), draw_seed, exclude=target)
            conditions.append(("random", others, draw_seed, k))
    return conditions


def shuffle_conditions(target: list[Head], n_layers: int, n_heads: int | Sequence[int], seeds: int, seed: int) -> list[tuple]:
    """``(name, {destination: source head}, seed)`` per condition: clean; per seed the selected heads
    permuted among themselves (``target``), given random other heads' weights (``outside``), and as many
    random heads permuted among themselves (``random``)."""
    from mechkit.interventions import permutation
    from mechkit.model.headspec import random_heads

    conditions: list[tuple] = [("clean", {}, None)]
    for s in range(seeds):
        draw_seed = seed * 1000 + s
        others = random_heads(n_layers, n_heads, len(target), draw_seed, exclude=target)
        conditions.append(("target", permutation(target, draw_seed), draw_seed))
        conditions.append(("outside", dict(zip(target, others, strict=True)), draw_seed))
        conditions.append(("random", permutation(others, draw_seed), draw_seed))
    return conditions


def check_shuffle_heads(total: int, named: int, spec: str) -> None:
    """Refuse a shuffle that cannot mean anything, before any head score is computed: it needs 2 heads
    to permute among and 2 others for the random baseline, and a selection of one head would stay as it is."""
    from mechkit.errors import HeadSpecError

    if total < 4:
        raise HeadSpecError(f"a shuffle needs at least 4 heads (2 to permute among and 2 others for the random "
                            f"baseline); this model has {total}", "run shuffle on a model with more heads "
                            "(a pruned model: the dense one)")
    if named < 2:
        raise HeadSpecError(f"--heads {spec} names {named} head: a shuffle permutes weights among heads, so one "
                            "head would be left as it is", "name at least 2 heads (--heads 0.1,0.2), or rank "
                            "them with --top-k 2 or more (--heads induction --top-k 2)")


def shuffle_spec_problem(selection: HeadSelection | None, top_k: int | None) -> tuple[str, str] | None:
    """``(problem, fix)`` for a ``--heads`` that names at most one head, said from the options alone and so before
    the model loads (``shuffle``'s check_options refuses it; None: fine, or only the model can tell)
    on any model: its distinct named heads plus ``top_k`` per ranked item (score or random), where no
    ``layer:L`` item lets the model's width decide and ``top_k`` is given (the default is 2 or more on every
    model a shuffle runs on). ``--heads induction --top-k 1`` was refused only after the load and the scoring.

    >>> from mechkit.model.headspec import parse_spec
    >>> shuffle_spec_problem(parse_spec("random"), 1)[1]
    'pass --top-k 2 or more (--heads random --top-k 2), or name at least 2 heads (--heads 0.1,0.2)'
    >>> shuffle_spec_problem(parse_spec("induction,0.1"), 1) is None  # 2 heads, or 1 where they meet: the model says
    True
    """
    items = set(selection.items) if selection is not None else set()
    ranked = [item for item in items if item[0] in ("score", "random")]
    if not items or any(item[0] == "layer" for item in items) or (ranked and top_k is None):
        return None
    most = len({item[1:] for item in items if item[0] == "pair"}) + (top_k or 0) * len(ranked)
    if most >= 2:
        return None
    spec = f"--heads {selection.spec}"
    if ranked:
        return (f"{spec} --top-k {top_k} names at most {most} head: a shuffle permutes weights among heads, so one "
                f"head would be left as it is", f"pass --top-k 2 or more ({spec} --top-k 2), or name at least 2 "
                "heads (--heads 0.1,0.2)")
    return (f"{spec} names 1 head: a shuffle permutes weights among heads, so one head would be left as it is",
            "name at least 2 heads (--heads 0.1,0.2), or rank them (--heads induction)")


def ablation_units(handle: ModelHandle, shared: tuple, units: list) -> Iterator[dict]:
    """Each unit a list of heads to ablate (empty: the clean model) -> ``evaluate``'s metrics per task.

    ``shared`` is ``(prompts, batch_size, mode, reference, seed)``; the ablation is undone before the
    next unit, so a unit's metrics never depend on the units run before it (any worker, any chunk)."""
    from mechkit.eval.evaluation import evaluate
    from mechkit.interventions import ablate

    prompts, batch_size, mode, reference, seed = shared
    for heads in units:
        if not heads:
            yield evaluate(handle, prompts, batch_size)
            continue
        with ablate(handle, heads, mode=mode, reference=reference, seed=seed):
            metrics = evaluate(handle, prompts, batch_size)
        yield metrics


def accuracy_table(conditions: list[dict], tasks: list[str], ks: Sequence[int]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"k=K": {task: {clean, target, random_mean, random_std}}}`` from ablation conditions with metrics
    (the random draws' mean and population std; ``None`` without draws)."""
    from mechkit.eval.evaluation import mean_std

    table = {}
    for k in ks:
        row = {}
        for task in tasks:
            clean = conditions[0]["metrics"][task]["accuracy"]
            target = [c["metrics"][task]["accuracy"] for c in conditions if c["name"] == "target" and c["k"] == k]
            rand = [c["metrics"][task]["accuracy"] for c in conditions if c["name"] == "random" and c["k"] == k]
            rm, rs = mean_std(rand) if rand else (None, None)
            row[task] = {"clean": clean, "target": target[0], "random_mean": rm, "random_std": rs}
        table[f"k={k}"] = row
    return table
