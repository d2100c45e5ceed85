"""From scores to a plan: which units go at a given sparsity, per layer or globally.

``allocation="uniform"`` removes the same fraction from every layer. ``"global"`` ranks units of all
layers together on the scores as they are — meaningful for the task-attribution guides, whose
scores are estimated loss changes in the same units everywhere, so layers that matter less give
more. ``"global-z"`` ranks per-layer z-scores (the combined guide's habit).

Heads under grouped-query attention are removed in *slots*: slot k of a layer removes the k-th
least important query head of every KV group (see :mod:`mechkit.model.edit.surgery` for why the count
must match across groups). ``gqa="group"`` removes whole KV groups instead. At least one slot (or
group) per layer and one MLP channel per layer always stay: a layer with nothing left should be
removed as a layer.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np

from mechkit.errors import MechkitError
from mechkit.pruning.guides import Scores, check_guide, zscore_rows
from mechkit.pruning.plan import UnitsToRemove

if TYPE_CHECKING:
    from mechkit.model.anatomy import Anatomy

TARGETS = ("neurons", "heads", "layers")
ALLOCATIONS = ("uniform", "global", "global-z", "sensitivity")


def parse_sparsity(text: str | float, targets: list[str]) -> dict[str, float]:
    """``"0.3"`` (every target) or ``"neurons=0.3,heads=0.2"`` → ``{target: fraction}``."""
    out: dict[str, float] = {}
    try:
        if isinstance(text, float | int) or "=" not in str(text):
            out = dict.fromkeys(targets, float(text))
        else:
            for part in str(text).split(","):
                key, value = part.split("=")
                out[key.strip()] = float(value)
    except ValueError:
        raise MechkitError(f"malformed --sparsity {text!r}", "use a fraction like 0.3 or neurons=0.3,heads=0.2") from None
    for key, value in out.items():
        if key not in TARGETS:
            raise MechkitError(f"unknown pruning target {key!r}", f"use {', '.join(TARGETS)}")
        if not 0 < value < 1:  # 0 (or -0.0, or 1e-400) prunes nothing: a row equal to dense, labelled pruned
            where = f" for {key}" if "=" in str(text) else ""  # a plain fraction is every target's, not one's
            raise MechkitError(f"sparsity {value}{where} is outside (0, 1)", "use a fraction like 0.3")
    return out


def parse_levels(text: str, targets: list[str]) -> list[dict[str, float]]:
    """The sparsity levels of a sweep: a comma list of fractions is one level per fraction, each for
    every target; ``target=fraction`` pairs are one level (see :func:`parse_sparsity`).

    >>> parse_levels("0.1,0.2", ["neurons", "heads"])
    [{'neurons': 0.1, 'heads': 0.1}, {'neurons': 0.2, 'heads': 0.2}]
    >>> parse_levels("neurons=0.3,heads=0.2", ["neurons"])
    [{'neurons': 0.3, 'heads': 0.2}]
    """
    if "=" in text:
        return [parse_sparsity(text, targets)]
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MechkitError(f"malformed --sparsity {text!r}", "use fractions like 0.2,0.3 or neurons=0.3,heads=0.2") from None
    return [parse_sparsity(v, targets) for v in dict.fromkeys(values)]  # 0.2,0.2: one level, not two rows


def parse_targets(text: str) -> list[str]:
    """A comma list of unit types to prune, each one of :data:`TARGETS`, repeats dropped.

    A repeat would prune nothing more, but the report would list its rows twice.

    >>> parse_targets("neurons, heads, neurons")
    ['neurons', 'heads']
    """
    targets = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise MechkitError(f"unknown --target {text!r}", f"use a comma list of {', '.join(TARGETS)}")
    return targets


def parse_guides(text: str) -> list[str]:
    """A comma list of guides, each a known guide, optionally ``GUIDE@ALLOCATION``, checked.

    An empty list comes back empty (the caller says what to pass instead). A repeat is dropped (it measured the
    same rows twice, listed twice in the report), and ``GUIDE@`` with no allocation is refused (it ran under the
    default, labelled ``GUIDE@``).

    >>> parse_guides("attribution@sensitivity,random,random")
    ['attribution@sensitivity', 'random']
    """
    guides = list(dict.fromkeys(g.strip() for g in text.split(",") if g.strip()))
    for g in guides:
        name, at, alloc = g.partition("@")
        check_guide(name)
        if at and alloc not in ALLOCATIONS:
            what = f"unknown allocation {alloc!r}" if alloc else "no allocation after @"
            raise MechkitError(f"{what} in --guide {g!r}", f"use {name}@ALLOCATION with ALLOCATION one of "
                               f"{', '.join(ALLOCATIONS)}, or {name} alone for --allocation's")
    return guides


def select_neurons(scores: np.ndarray, fraction: float, allocation: str,
                   layer_fractions: np.ndarray | None = None, skip: frozenset[int] = frozenset()) -> dict[int, list[int]]:
    """The MLP channels to remove, per layer; none in the layers ``skip`` (removed whole), whose channels would
    count toward the fraction and remove nothing."""
    L, d = scores.shape
    if layer_fractions is not None:  # per-layer budgets (e.g. from measured sensitivity)
        ks = _counts([0.0 if layer in skip else f * d for layer, f in enumerate(layer_fractions)], d - 1)
        return {layer: sorted(np.argsort(scores[layer], kind="stable")[:k].tolist()) for layer, k in enumerate(ks)
                if k}
    if allocation == "uniform":
        k = min(int(round(fraction * d)), d - 1)
        return {layer: sorted(np.argsort(scores[layer], kind="stable")[:k].tolist()) for layer in range(L)
                if k and layer not in skip}
    ranked = zscore_rows(scores) if allocation == "global-z" else scores
    total = int(round(fraction * (L - len(skip)) * d))
    order = np.argsort(ranked, axis=None, kind="stable")
    removed: dict[int, list[int]] = {}
    for flat in order:
        if total == 0:
            break
        layer, j = divmod(int(flat), d)
        if layer not in skip and len(removed.get(layer, [])) < d - 1:
            removed.setdefault(layer, []).append(j)
            total -= 1
    return {layer: sorted(v) for layer, v in removed.items()}


def _counts(shares: list[float], cap: int) -> list[int]:
    """Whole counts for ``shares`` (each at most ``cap``) summing to their rounded total, the remainders going to
    the largest fractional parts: each rounded alone, 0.4 channels in each of 4 layers removed none of the 1.6
    asked, and a sensitivity-spread level removed nothing its label promised."""
    total = min(int(round(sum(shares))), cap * len(shares))
    counts = [min(int(x), cap) for x in shares]
    for i in sorted(range(len(shares)), key=lambda i: shares[i] - int(shares[i]), reverse=True):
        if sum(counts) >= total:
            break
        if counts[i] < cap:
            counts[i] += 1
    return counts


def _slots(scores: np.ndarray, anatomy: Anatomy, gqa: str) -> list[tuple[float, int, list[int]]]:
    """Removable head slots per layer, in the order they must go: (cost, layer, heads)."""
    g, n_kv = anatomy.n_groups, anatomy.n_kv_heads
    out = []
    for layer in range(scores.shape[0]):
        row = scores[layer]
        if gqa == "group" and g > 1:
            groups = sorted(range(n_kv), key=lambda k: row[k * g:(k + 1) * g].sum())
            for k in groups[:-1]:
                out.append((float(row[k * g:(k + 1) * g].sum()), layer, list(range(k * g, (k + 1) * g))))
            continue
        if g == 1:  # multi-head attention: any head on its own, least important first
            order = sorted(range(anatomy.n_heads), key=lambda h: row[h])
            out.extend((float(row[h]), layer, [h]) for h in order[:-1])
            continue
        per_group = [sorted(range(k * g, (k + 1) * g), key=lambda h: row[h]) for k in range(n_kv)]
        for slot in range(g - 1):
            heads = [grp[slot] for grp in per_group]
            out.append((float(sum(row[h] for h in heads)), layer, heads))
    return out


def select_heads(scores: np.ndarray, anatomy: Anatomy, fraction: float, allocation: str,
                 gqa: str = "slot", skip: frozenset[int] = frozenset(),
                 protected: frozenset[tuple[int, int]] = frozenset()) -> dict[int, list[int]]:
    """The heads to remove, per layer; none in the layers ``skip`` (removed whole: see :func:`select_neurons`),
    and no slot holding a ``protected`` (layer, head)."""
    def free(slot: tuple) -> bool:
        return slot[1] not in skip and not any((slot[1], h) in protected for h in slot[2])

    slots = [s for s in _slots(scores, anatomy, gqa) if free(s)]
    per_layer: dict[int, list] = {}
    for cost, layer, heads in slots:
        per_layer.setdefault(layer, []).append((cost, heads))
    target = int(round(fraction * (anatomy.n_layers - len(skip)) * anatomy.n_heads))
    removed: dict[int, list[int]] = {}
    if allocation == "uniform":
        size = len(slots[0][2]) if slots else 1
        k = int(round(fraction * anatomy.n_heads / size))
        for layer, items in per_layer.items():
            for _, heads in items[:k]:
                removed.setdefault(layer, []).extend(heads)
        return {layer: sorted(v) for layer, v in removed.items()}
    if allocation == "global-z":
        scores = zscore_rows(scores)
        per_layer = {}
        for cost, layer, heads in _slots(scores, anatomy, gqa):
            if free((cost, layer, heads)):
                per_layer.setdefault(layer, []).append((cost, heads))
    nxt = dict.fromkeys(per_layer, 0)
    count = 0
    while count < target:  # greedy: the cheapest next slot of any layer (slots go in order)
        options = [(per_layer[layer][i][0], layer) for layer, i in nxt.items() if i < len(per_layer[layer])]
        if not options:
            break
        _, layer = min(options)
        heads = per_layer[layer][nxt[layer]][1]
        removed.setdefault(layer, []).extend(heads)
        nxt[layer] += 1
        count += len(heads)
    return {layer: sorted(v) for layer, v in removed.items()}


def select_layers(scores: np.ndarray, fraction: float, keep: frozenset[int] = frozenset()) -> list[int]:
    """The blocks to remove whole, the least important first; none of ``keep`` (those holding protected heads)."""
    k = min(int(round(fraction * len(scores))), len(scores) - 1)
    order = [layer for layer in np.argsort(scores, kind="stable").tolist() if layer not in keep]
    return sorted(order[:k])


def make_plan(scores: Scores, anatomy: Anatomy, sparsity: dict[str, float], allocation: str = "uniform",
              gqa: str = "slot", compensate: bool = True, sensitivity: np.ndarray | None = None,
              strict: bool = False) -> UnitsToRemove:
    """The plan removing the least important units at ``sparsity`` per target.

    ``allocation="sensitivity"`` needs ``sensitivity`` (per-layer MLP sensitivity, see
    :mod:`mechkit.pruning.sensitivity`) and spreads MLP channels by it; heads then go globally.
    """
    if allocation not in ALLOCATIONS:
        raise MechkitError(f"unknown allocation {allocation!r}", f"use {', '.join(ALLOCATIONS)}")
    plan = UnitsToRemove(compensate=compensate)
    fractions = None
    if allocation == "sensitivity" and not sparsity.get("neurons"):
        allocation = "global"
    protected = frozenset(map(tuple, scores.protected_heads))  # never removed, whatever the fraction
    if sparsity.get("layers"):  # first: the heads and channels of a layer removed whole are no more to remove
        keep = frozenset(layer for layer, _ in protected)  # a layer removed whole takes its protected heads along
        plan.layers = select_layers(scores.layers, sparsity["layers"], keep)
        if strict and keep:
            _refuse_short({0: plan.layers}, {0: select_layers(scores.layers, sparsity["layers"])},
                          sparsity["layers"], len(protected), "layers",
                          others=_others_run(scores, anatomy, sparsity, allocation, gqa, protected))
    skip = frozenset(plan.layers)
    if allocation == "sensitivity":
        if sensitivity is None:
            raise MechkitError("allocation 'sensitivity' needs measured layer sensitivities",
                               "compute them with mechkit.pruning.sensitivity.layer_sensitivity")
        from mechkit.pruning.sensitivity import allocate

        kept = [layer for layer in range(len(sensitivity)) if layer not in skip]  # spread over the layers kept
        fractions = np.zeros(len(sensitivity))
        fractions[kept] = allocate(np.asarray(sensitivity)[kept], sparsity.get("neurons", 0.0))
        allocation = "global"
    if sparsity.get("neurons"):
        plan.mlp = select_neurons(scores.mlp, sparsity["neurons"], allocation, fractions, skip)
    if sparsity.get("heads"):
        plan.heads = select_heads(scores.heads, anatomy, sparsity["heads"], allocation, gqa, skip, protected)
        if strict and protected:
            _refuse_short(plan.heads, select_heads(scores.heads, anatomy, sparsity["heads"], allocation, gqa, skip),
                          sparsity["heads"], len(protected), others=sum(map(bool, sparsity.values())) > 1)
    return plan


def _others_run(scores: Scores, anatomy: Anatomy, sparsity: dict[str, float], allocation: str, gqa: str,
                protected: frozenset) -> bool:
    """Whether the targets beside ``layers`` could run under the same protection: "drop layers from --target" is
    offered only then (with heads that protection also blocks, dropping layers led to the heads' refusal next,
    neurons beside them or not)."""
    if not sparsity.get("heads"):
        return bool(sparsity.get("neurons"))
    count = sum(map(len, select_heads(scores.heads, anatomy, sparsity["heads"], allocation, gqa).values()))
    kept = sum(map(len, select_heads(scores.heads, anatomy, sparsity["heads"], allocation, gqa,
                                     protected=protected).values()))
    return kept >= count


def _refuse_short(units: dict[int, list[int]], unguarded: dict[int, list[int]], fraction: float, n: int,
                  target: str = "heads", others: bool = True) -> None:
    """Refuse (one line) a level the protected heads keep from being met: the plan had removed protected heads,
    or the layers holding them (``--protect-top-k`` promises never), and removing only the others falls short.
    ``others``: --target names more than ``target``, so dropping it leaves a run (alone, it left --target empty)."""
    got, asked = sum(map(len, units.values())), sum(map(len, unguarded.values()))
    if got < asked:
        why = (f"with the {n} that --protect-top-k keeps only {got} can go" if target == "heads" else
               f"only {got} hold none of the {n} heads --protect-top-k keeps (a layer goes whole, its heads with it)")
        raise MechkitError(f"--sparsity {target}={fraction:g} asks for {asked} {target}, and {why}",
                           f"lower --sparsity {target} to remove at most {got}, or lower --protect-top-k "
                           "(--protect-top-k 0 keeps none)" if got else
                           f"lower --protect-top-k (it keeps all the {target} that could go; --protect-top-k 0 keeps "
                           "none)" + (f", or drop {target} from --target" if others else ""))


def removes_nothing(anatomy: Anatomy, level: dict[str, float], allocation: str = "uniform",
                    gqa: str = "slot") -> tuple[str, str] | None:
    """Why a fraction in ``level`` removes no unit of this model, and the fix (the level with each such fraction
    raised to one that removes a unit, the others kept: layers first, since those kept decide the heads and
    channels left to remove); ``None`` where each removes some. Known from the shape alone, before any work: a
    --sparsity rounding to no unit gave a row labelled with it, a "pruned" model equal to the dense one.

    >>> from types import SimpleNamespace as NS
    >>> a = NS(n_layers=2, n_heads=4, n_groups=1, n_kv_heads=4, d_mlp=64)
    >>> removes_nothing(a, {"layers": 0.1})
    ('--sparsity layers=0.1 removes no layer of this 2-layer model', 'give it 0.5 or more (--sparsity layers=0.5)')
    """
    found = _too_few(anatomy, level, allocation, gqa)
    return None if found is None else (found[0], _fix_text(level, found[1], "more", "raise"))


def _too_few(anatomy: Anatomy, level: dict[str, float], allocation: str,
             gqa: str) -> tuple[str, dict[str, float] | str] | None:
    """:func:`removes_nothing`'s why and its fixed level (or ``"drop X from --target"`` where no fraction helps)."""
    L, H, d = anatomy.n_layers, anatomy.n_heads, anatomy.d_mlp
    whole = allocation == "uniform"  # "sensitivity" spreads one rounded total, as "global" does (_counts)
    size = (anatomy.n_groups if gqa == "group" and anatomy.n_groups > 1 else anatomy.n_kv_heads
            if anatomy.n_groups > 1 else 1)
    fixed, said = dict(level), []
    for target in ("layers", "neurons", "heads"):
        fraction = level.get(target, 0)
        if not fraction:
            continue
        kept = L - min(int(round(fixed.get("layers", 0) * L)), L - 1)
        n, unit, where = {"layers": (L, "layer", f"this {L}-layer model"),
                          "neurons": (d if whole else kept * d, "MLP channel",
                                      "this model's layers" if whole else "this model"),
                          "heads": (H / size if whole else kept * H, "head",
                                    "this model's layers" if whole else "this model")}[target]
        if target == "layers" and L == 1:
            return (f"--sparsity layers={fraction:g} removes no layer of this 1-layer model: a model keeps at least "
                    "one", _drop("layers", level, anatomy, gqa))
        if target == "heads" and H == 1 or target == "neurons" and d == 1:
            return (f"--sparsity {target}={fraction:g} removes no {unit} of this model: each layer keeps at least one, "
                    "and has one", _drop(target, level, anatomy, gqa))
        removed = min(int(round(fraction * L)), L - 1) if target == "layers" else int(round(fraction * n))
        if removed > 0 or not n:
            continue
        if 1 / n >= 1:  # no fraction below 1 reaches one unit
            return (f"--sparsity {target}={fraction:g} removes no {unit} of {where}, and no fraction below 1 would",
                    _drop(target, level, anatomy, gqa))
        fixed[target] = float(f"{1 / n:.3g}")
        said.append(f"--sparsity {target}={fraction:g} removes no {unit} of {where}")
    return ("; ".join(said), fixed) if said else None


def _drop(target: str, level: dict[str, float], anatomy: Anatomy, gqa: str) -> str:
    """The fix for a target this model cannot lose a unit of: drop it where other targets remain, else name a unit
    type it can lose (dropping the only target left ``--target`` empty, which is refused)."""
    if any(t != target and v for t, v in level.items()):
        return f"drop {target} from --target"
    can = {"layers": anatomy.n_layers > 1, "neurons": anatomy.d_mlp > 1,
           "heads": anatomy.n_heads > 1 and not (gqa == "group" and anatomy.n_kv_heads == 1)}
    others = [t for t in TARGETS if t != target and can.get(t)]
    return (f"prune what this model can lose instead: --target {others[0]}" if others else
            "this model has no unit mechkit can prune: choose another model")


def _fix_text(level: dict[str, float], fixed: dict[str, float] | str, way: str, verb: str) -> str:
    """``give it F or {way}`` (one fraction changed) or ``{verb} A and B``, then the pairs to pass."""
    if isinstance(fixed, str):
        return fixed
    changed = [t for t in fixed if fixed[t] != level.get(t)]
    them = f"give it {fixed[changed[0]]:g} or {way}" if len(changed) == 1 else f"{verb} " + " and ".join(changed)
    return f"{them} (--sparsity {_pairs(fixed)})"


def _pairs(level: dict[str, float]) -> str:
    return ",".join(f"{t}={v:g}" for t, v in level.items())


def past_reach(anatomy: Anatomy, level: dict[str, float], allocation: str = "uniform",
               gqa: str = "slot") -> tuple[str, str] | None:
    """Why a fraction in ``level`` asks for more units than this model can lose, and the fix (each such fraction
    lowered to the most it can remove, the others kept); ``None`` where each can be met. A model keeps a layer,
    each layer an MLP channel, and each layer a head per key/value group (``--gqa slot``) or one group (``--gqa
    group``): ``--sparsity heads=0.9`` removed 4 of 8 heads under a row labelled 0.9. Counted as the selectors
    count (:func:`select_heads`, :func:`select_neurons`): ``uniform`` per layer, the others over the layers kept.

    >>> from types import SimpleNamespace as NS
    >>> a = NS(n_layers=2, n_heads=4, n_groups=2, n_kv_heads=2, d_mlp=64)
    >>> past_reach(a, {"heads": 0.9})[1]
    'give it 0.5 or less (--sparsity heads=0.5)'
    >>> past_reach(a, {"heads": 0.6}) is None   # one slot of two heads per layer: rounding, not a cap
    True
    """
    found = _too_many(anatomy, level, allocation, gqa)
    return None if found is None else (found[0], _fix_text(level, found[1], "less", "lower"))


def _too_many(anatomy: Anatomy, level: dict[str, float], allocation: str,
              gqa: str) -> tuple[str, dict[str, float]] | None:
    """:func:`past_reach`'s why and its fixed level."""
    L, H, d = anatomy.n_layers, anatomy.n_heads, anatomy.d_mlp
    g, n_kv = anatomy.n_groups, anatomy.n_kv_heads
    size, why = ((g, "each layer keeps a key/value group") if gqa == "group" and g > 1 else
                 (n_kv, "each key/value group keeps a head") if g > 1 else (1, "each layer keeps a head"))
    kept = L - min(int(round(level.get("layers", 0) * L)), L - 1)
    per_layer = allocation == "uniform"
    fixed, said = dict(level), []
    for target, fraction in level.items():
        if target == "layers":  # (steps, most steps, units per step, n units, why, unit)
            steps, most, unit_size, n, reason, unit = round(fraction * L), L - 1, 1, L, "a model keeps a layer", "layers"
        elif target == "neurons":
            n = d if per_layer else kept * d
            steps, most, unit_size, reason, unit = round(fraction * n), n - (1 if per_layer else kept), 1, \
                "each layer keeps an MLP channel", "MLP channels"
        else:
            n = H if per_layer else kept * H
            steps = round(fraction * H / size) if per_layer else round(fraction * n)
            most = (H - size) // size if per_layer else (H - size) * kept
            unit_size, reason, unit = size if per_layer else 1, why, "heads"
        if steps <= most or most <= 0:  # none at all is removes_nothing's to say
            continue
        fixed[target] = _at_most(most, n // unit_size)
        of = (f"of each layer's {n} {unit}" if per_layer and target != "layers" else f"of this model's {n} {unit}"
              if target == "layers" or kept == L else f"of the {n} {unit} in the {kept} layer{'s' * (kept > 1)} kept")
        said.append(f"--sparsity {target}={fraction:g} asks for {steps * unit_size} {of}, and {reason}, so at most "
                    f"{most * unit_size} can go")
    return ("; ".join(said), fixed) if said else None


def _fit(anatomy: Anatomy, level: dict[str, float], allocations: tuple[str, ...],
         gqa: str) -> tuple[str, dict[str, float] | str, list[str]] | None:
    """The problems of ``level`` (both checks, under every guide's allocation), the level fitted to pass them all
    (or a ``drop X from --target``), and the checks that found them; ``None`` where it passes. Raising or lowering
    layers changes the layers kept, and so what the heads and channels can lose; a fraction one allocation takes
    another may not (``uniform`` counts per layer): the fixes repeat until every check passes."""
    found = [(name, check(anatomy, level, alloc, gqa)) for alloc in allocations
             for name, check in (("few", _too_few), ("many", _too_many))]
    if all(f is None for _, f in found):
        return None
    why = "; ".join(dict.fromkeys(f[0] for _, f in found if f is not None))
    checks = list(dict.fromkeys(name for name, f in found if f is not None))
    drop = next((f[1] for _, f in found if f is not None and isinstance(f[1], str)), None)
    if drop is not None:
        return why, drop, ["few"]
    fixed: dict[str, float] = dict(level)
    for _ in range(6):
        changed = False
        for alloc in allocations:
            for check in (_too_few, _too_many):
                got = check(anatomy, fixed, alloc, gqa)
                if got is not None:
                    if isinstance(got[1], str):
                        return why, got[1], ["few"]
                    fixed, changed = got[1], True
        if not changed:
            break
    return why, fixed, checks


def _effect(anatomy: Anatomy, level: dict[str, float], allocations: tuple[str, ...], gqa: str) -> tuple:
    """What ``level`` removes, as counts per target under each allocation (the selectors' rounding): two levels
    with one effect are one plan under two labels."""
    L, H, d = anatomy.n_layers, anatomy.n_heads, anatomy.d_mlp
    g, n_kv = anatomy.n_groups, anatomy.n_kv_heads
    size = g if gqa == "group" and g > 1 else n_kv if g > 1 else 1
    layers = min(int(round(level.get("layers", 0) * L)), L - 1)
    kept = L - layers
    out = []
    for alloc in allocations:
        uniform = alloc == "uniform"
        neurons = (min(int(round(level.get("neurons", 0) * d)), d - 1) if uniform else
                   int(round(level.get("neurons", 0) * kept * d)))
        heads = (int(round(level.get("heads", 0) * H / size)) if uniform else int(round(level.get("heads", 0) * kept * H)))
        out.append((layers, neurons, heads))
    return tuple(out)


def same_effect(anatomy: Anatomy, levels: list[dict[str, float]], allocations: str | tuple[str, ...] = "uniform",
                gqa: str = "slot") -> tuple[str, str] | None:
    """Two levels of a sweep that remove the same units of this model (``--sparsity 0.3,0.5`` on a 2-layer model
    removes one layer at each): one plan under two labels, two rows and a finding comparing them. The fix keeps the
    first of each.

    >>> from types import SimpleNamespace as NS
    >>> same_effect(NS(n_layers=2, n_heads=4, n_groups=1, n_kv_heads=4, d_mlp=64), [{"layers": .3}, {"layers": .5}])
    ('--sparsity 0.3 and 0.5 remove the same units of this model', 'keep one (--sparsity 0.3)')
    """
    allocations = (allocations,) if isinstance(allocations, str) else tuple(dict.fromkeys(allocations))
    seen: dict[tuple, float] = {}
    twins = []
    for level in levels:
        value = next(iter(level.values()))
        effect = _effect(anatomy, level, allocations, gqa)
        if effect in seen:
            twins.append((seen[effect], value))
        else:
            seen[effect] = value
    if not twins:
        return None
    said = "; ".join(f"--sparsity {a:g} and {b:g} remove the same units of this model" for a, b in twins)
    return said, f"keep one (--sparsity {','.join(f'{v:g}' for v in seen.values())})"


def _passes(anatomy: Anatomy, level: dict[str, float], allocations: tuple[str, ...], gqa: str) -> bool:
    return all(_too_few(anatomy, level, a, gqa) is None and _too_many(anatomy, level, a, gqa) is None
               for a in allocations)


def fit_levels(anatomy: Anatomy, levels: list[dict[str, float]], allocation: str | tuple[str, ...] = "uniform",
               gqa: str = "slot") -> tuple[str, str] | None:
    """Why some level of a sweep removes no unit of a target, or asks for more than this model can lose (both
    checks, :func:`removes_nothing` and :func:`past_reach`, every level, under each guide's ``allocation``), and one
    fix that passes them all; ``None`` where every level passes. One level gets its ``TARGET=F`` pairs; several
    levels (a list of fractions, each every target's) get the whole list back, each bad level replaced by one
    fraction that passes for every target (or, where none does, the advice to run it on its own with pairs). A
    target this model cannot lose a unit of is dropped, and the rest fitted in the same fix.

    >>> from types import SimpleNamespace as NS
    >>> a = NS(n_layers=2, n_heads=4, n_groups=2, n_kv_heads=2, d_mlp=128)
    >>> fit_levels(a, [{"neurons": 0.999, "heads": 0.2}])[1]
    'lower neurons to 0.99 and raise heads to 0.5 (--sparsity neurons=0.99,heads=0.5)'
    >>> b = NS(n_layers=2, n_heads=8, n_groups=4, n_kv_heads=2, d_mlp=128)
    >>> fit_levels(b, [{"heads": 0.3}, {"heads": 0.9}])[1]
    'use 0.75 for 0.9 (--sparsity 0.3,0.75)'
    >>> fit_levels(NS(n_layers=1, n_heads=4, n_groups=2, n_kv_heads=2, d_mlp=128), [{"layers": 0.5, "heads": 0.9}])[1]
    'drop layers from --target, and lower heads to 0.5 (--target heads --sparsity heads=0.5)'
    """
    allocations = (allocation,) if isinstance(allocation, str) else tuple(dict.fromkeys(allocation))
    whys, dropped, current = [], [], [dict(level) for level in levels]
    for _ in range(len(TARGETS)):  # a target no fraction helps: dropped, the rest fitted without it
        found = [_fit(anatomy, level, allocations, gqa) for level in current]
        whys += [part for f in found if f is not None for part in f[0].split("; ") if part not in whys]
        drops = [f[1] for f in found if f is not None and isinstance(f[1], str)]
        if not drops:
            break
        named = [m[1] for m in map(_DROP.match, drops) if m]
        if not named:  # the level's only target: another unit type, its fractions fitted to it too
            return "; ".join(whys), _instead(anatomy, current, drops[0], allocations, gqa)
        dropped += [t for t in dict.fromkeys(named) if t not in dropped]
        current = [{t: v for t, v in level.items() if t not in dropped} for level in current]
    if not whys:
        return None
    fix = _fitted_text(anatomy, current, allocations, gqa, own_words=not dropped)
    if not dropped:
        return "; ".join(whys), fix or "choose another --sparsity"
    rest = [t for t in current[0]]
    said = f"drop {' and '.join(dropped)} from --target" + (f", and {fix}" if fix else "")
    values = _flag_text(fix) if fix else _list_text(anatomy, current, allocations, gqa)
    return "; ".join(whys), f"{_strip_flag(said)} (--target {','.join(rest)} --sparsity {values})"


def _list_text(anatomy: Anatomy, levels: list[dict[str, float]], allocations: tuple[str, ...], gqa: str) -> str:
    """Levels that pass, as ``--sparsity`` text: pairs for one, else the list with the levels that remove what an
    earlier one removes left out (a target dropped or swapped can make two levels one plan: refused next)."""
    if len(levels) == 1:
        return _pairs(levels[0])
    kept: dict[tuple, float] = {}
    for level in levels:
        kept.setdefault(_effect(anatomy, level, allocations, gqa), next(iter(level.values())))
    return ",".join(f"{v:g}" for v in kept.values())


_DROP = re.compile(r"drop (\w+) from --target$")
_INSTEAD = re.compile(r"--target (\w+)$")


def _instead(anatomy: Anatomy, levels: list[dict[str, float]], drop: str, allocations: tuple[str, ...],
             gqa: str) -> str:
    """``drop`` (the only target cannot lose a unit: "prune ... instead: --target X") with the levels' fractions
    given to X and fitted to it, so the fix runs as given (the user's own ``--sparsity`` named the old target, or
    asked X for more than it can lose)."""
    other = _INSTEAD.search(drop)
    if other is None:  # no unit type to prune at all
        return drop
    moved = [{other[1]: next(iter(level.values()))} for level in levels]
    fix = _fitted_text(anatomy, moved, allocations, gqa, own_words=False)
    values = _flag_text(fix) if fix else _list_text(anatomy, moved, allocations, gqa)
    return f"prune what this model can lose instead (--target {other[1]} --sparsity {values})"


def _flag_text(fix: str) -> str:
    """The ``--sparsity`` value a fix text ends with (``... (--sparsity V)``)."""
    return fix.rsplit("(--sparsity ", 1)[1].rstrip(")")


def _strip_flag(text: str) -> str:
    """A fix text without its closing ``(--sparsity V)`` (given once, with --target, by the caller)."""
    return text.rsplit(" (--sparsity ", 1)[0]


def _fitted_text(anatomy: Anatomy, levels: list[dict[str, float]], allocations: tuple[str, ...],
                 gqa: str, own_words: bool = True) -> str | None:
    """The fix for ``levels`` with no target to drop, ending ``(--sparsity V)``; ``None`` where they pass.
    ``own_words``: one check's one change in :func:`removes_nothing`'s or :func:`past_reach`'s words ("give it
    F or more"); else each change named ("lower heads to F"), as after a dropped target, where "it" is unclear."""
    found = [(level, _fit(anatomy, level, allocations, gqa)) for level in levels]
    bad = [(level, f) for level, f in found if f is not None]
    if not bad:
        return None
    if len(levels) == 1:
        level, (_, fixed, checks) = bad[0]
        if own_words and len(checks) == 1 and len(allocations) == 1 and fixed == (_too_few if checks == ["few"] else _too_many)(
                anatomy, level, allocations[0], gqa)[1]:  # one check, one pass: its own words
            return _fix_text(level, fixed, "more" if checks == ["few"] else "less",
                             "raise" if checks == ["few"] else "lower")
        return _both_text(level, fixed)
    values, replaced, alone = [], [], []
    for level, f in found:
        old = next(iter(level.values()))
        if f is None:
            values.append(old)
            continue
        fixed = f[1]
        options = sorted(dict.fromkeys([old, *fixed.values()]), key=lambda v: (abs(v - old), v))
        single = next((v for v in options if _passes(anatomy, dict.fromkeys(level, v), allocations, gqa)), None)
        if single is None:
            alone.append((old, fixed))
        else:
            values.append(single)
            replaced.append((single, old))
    effects: dict[tuple, float] = {}  # a replacement removing what another level removes: one plan, two rows
    for v in values:
        effects.setdefault(_effect(anatomy, dict.fromkeys(levels[0], v), allocations, gqa), v)
    rest = ",".join(f"{v:g}" for v in effects.values())
    if not alone:
        said = []
        for single, old in replaced:
            twin = effects[_effect(anatomy, dict.fromkeys(levels[0], single), allocations, gqa)]
            said.append(f"use {single:g} for {old:g}" if twin == single else
                        f"drop {old:g} (the most it can remove, {single:g}, removes what {twin:g} does)")
        return f"{', '.join(said)} (--sparsity {rest})"
    runs = " and ".join(f"--sparsity {_pairs(fixed)}" for _, fixed in alone)
    which = ", ".join(f"{old:g}" for old, _ in alone)
    return (f"no one fraction passes for every target at {which}: run it on its own with a fraction per target "
            f"({runs})" + (f", and the others as the list (--sparsity {rest})" if rest else ""))


def _both_text(level: dict[str, float], fixed: dict[str, float]) -> str:
    """``lower A to F and raise B to G (--sparsity ...)``: the fitted level, each change said."""
    changes = [f"{'lower' if fixed[t] < level[t] else 'raise'} {t} to {fixed[t]:g}" for t in fixed
               if fixed[t] != level.get(t)]
    return f"{' and '.join(changes)} (--sparsity {_pairs(fixed)})"


def _at_most(count: int, n: int) -> float:
    """The shortest fraction that removes exactly ``count`` of ``n`` (cut down, never rounded up past it).

    >>> _at_most(2, 3), _at_most(2000, 3000), _at_most(1, 2)
    (0.66, 0.6666, 0.5)
    """
    for places in range(2, 10):
        value = math.floor(count / n * 10**places) / 10**places
        if int(round(value * n)) == count:
            return value
    return count / n
