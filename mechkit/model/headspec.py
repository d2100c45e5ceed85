"""Heads and the one ``--heads`` parser shared by every plugin, the CLI and the Python API.

Spec grammar (comma-separated items, 0-based)::

    17.3,18.6        explicit heads (layer.head)
    layer:17         every head of layer 17
    induction        top-k heads by induction score (also previous-token, duplicate-token)
    random           k random heads (seeded)
"""

from __future__ import annotations

import functools
import math
import numbers
import random as _random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mechkit.errors import HeadSpecError, MechkitError

SCORE_KINDS = ("induction", "previous-token", "duplicate-token")
_PAIR = re.compile(r"^(\d+)\.(\d+)$")
_LAYER = re.compile(r"^layer:(\d+)$")
_FIX = "use induction, previous-token, duplicate-token, random, layer:L, or layer.head pairs like 17.3,18.6"


@dataclass(frozen=True, order=True)
class Head:
    """One attention head; ``str(head)`` is its stable name ``"17.3"``."""

    layer: int
    head: int

    def __post_init__(self) -> None:
        """Whole numbers of at least 0 (NumPy's included, kept as ``int``): ``Head("a", 0)`` or ``Head(-1, 0)``
        would otherwise be carried into a run and fail far from here, or index from the end."""
        for name in ("layer", "head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise HeadSpecError(f"head ({self.layer!r}, {self.head!r}) is not a pair of integers",
                                    "give heads as Head(layer, head) with whole numbers, e.g. Head(1, 2)")
            if value < 0:  # an index from the end would pick the last layer's head silently
                raise HeadSpecError(f"head {self.layer}.{self.head} is out of range: layers and heads count from 0",
                                    "give heads as Head(layer, head) with whole numbers of at least 0, e.g. Head(1, 2)")
            object.__setattr__(self, name, int(value))

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def name(self) -> str:
        return str(self)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "head": self.head}

    @classmethod
    def from_dict(cls, d: Mapping) -> Head:
        return cls(int(d["layer"]), int(d["head"]))


HeadCounts = int | Sequence[int]  # heads per layer: one count for every layer, or one per layer (heads pruned)


def per_layer(n_layers: int, n_heads: HeadCounts) -> list[int]:
    """Each layer's head count from one count for all or a per-layer sequence (``Anatomy.head_counts``).

    >>> per_layer(2, 3), per_layer(2, (2, 4))
    ([3, 3], [2, 4])
    """
    if isinstance(n_heads, int):
        return [n_heads] * n_layers
    counts = [int(n) for n in n_heads]
    if len(counts) != n_layers:
        raise ValueError(f"{len(counts)} head counts for {n_layers} layers")
    return counts


def all_heads(n_layers: int, n_heads: HeadCounts) -> list[Head]:
    return [Head(layer, h) for layer, n in enumerate(per_layer(n_layers, n_heads)) for h in range(n)]


def top_heads(scores: Sequence[Sequence[float]], k: int) -> list[Head]:
    """The ``k`` highest-scoring heads of a ``[layer][head]`` score grid, best first; a cell with no head
    (NaN or None: a layer that kept fewer heads) is never ranked."""
    flat = [(float(s), Head(layer, h)) for layer, row in enumerate(scores) for h, s in enumerate(row)
            if s is not None and math.isfinite(float(s))]
    flat.sort(key=lambda item: (-item[0], item[1]))
    return [head for _, head in flat[:k]]


def default_top_k(n_layers: int, n_heads: HeadCounts, at_most: int = 10) -> int:
    """The default number of ranked heads an analysis takes: ``at_most``, but never more than half the
    model's heads, so the other half is left for the random-heads baseline it is compared with (a tiny
    model with 8 heads gets 4).

    >>> default_top_k(30, 9), default_top_k(2, 4), default_top_k(2, (1, 2), at_most=5)
    (10, 4, 1)
    """
    return max(1, min(at_most, sum(per_layer(n_layers, n_heads)) // 2))


def random_heads(n_layers: int, n_heads: HeadCounts, k: int, seed: int = 0, exclude: Sequence[Head] = ()) -> list[Head]:
    """``k`` distinct random heads, never one of ``exclude`` (the baseline for a targeted ablation)."""
    excluded = set(exclude)
    pool = [h for h in all_heads(n_layers, n_heads) if h not in excluded]
    if k > len(pool):
        if excluded:  # the baseline of a selection: lowering k to len(pool) would not leave len(pool) others
            total = len(pool) + len(excluded & set(all_heads(n_layers, n_heads)))
            raise HeadSpecError(f"cannot draw {k} random heads: only {len(pool)} remain beside the "
                                f"{total - len(pool)} selected", f"select at most {total // 2} of the model's "
                                f"{total} heads (a lower --top-k, or fewer heads in --heads)")
        raise HeadSpecError(f"cannot draw {k} random heads: only {len(pool)} remain after exclusions",
                            f"lower --top-k (top_k= in Python) to at most {len(pool)}")
    return sorted(_random.Random(seed).sample(pool, k))


@dataclass(frozen=True)
class HeadSelection:
    """A ``--heads`` spec parsed once: what it names, whether it needs scores, and how k applies.

    :func:`parse_spec` builds it from the text (the one place the grammar is read); everything after
    that (checking ranges on a model, resolving against scores for each k) works on this object, so a
    run reads its spec once however many ks, draws and interventions follow.

    >>> sel = parse_spec("induction, 17.3")
    >>> sel.needs_scores, sel.ranked, sel.spec
    (True, True, 'induction, 17.3')
    """

    spec: str
    items: tuple[tuple, ...]  # ("pair", layer, head) | ("layer", layer, text) | ("random",) | ("score", kind)

    @property
    def needs_scores(self) -> bool:
        """Whether it ranks heads by a score (the caller supplies or computes scores)."""
        return any(item[0] == "score" for item in self.items)

    @property
    def ranked(self) -> bool:
        """Whether k applies (a score-ranked or random item); else it ablates what it names."""
        return any(item[0] in ("score", "random") for item in self.items)

    def resolve(self, n_layers: int, n_heads: HeadCounts, *, scores: Mapping[str, Sequence[Sequence[float]]] | None = None,
                top_k: int | None = None, seed: int = 0, exclude: Sequence[Head] = ()) -> list[Head]:
        """The sorted, de-duplicated heads it names on a model of this shape, taking ``top_k`` per ranked item
        (``None``: :func:`default_top_k`, 10 but at most half the model's heads)."""
        top_k = check_top_k(top_k, n_layers, n_heads)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            # random.Random("x") takes any text, and Random(-1) draws what Random(1) draws
            raise HeadSpecError(f"seed must be a whole number of at least 0, not {seed!r}", "pass seed=0, say")
        seed = int(seed)  # random.Random refuses a NumPy integer
        heads: list[Head] = []
        for item in self.items:
            heads.extend(_resolve_item(item, n_layers, n_heads, scores, top_k, seed, exclude))
        return _validated(heads, n_layers, n_heads)

    def count(self, n_layers: int, n_heads: HeadCounts, top_k: int | None = None, seed: int = 0) -> int:
        """How many heads it names with ``top_k``, raising :class:`HeadSpecError` now, before scores are
        computed, where k or a range cannot hold (scores stand in as zeros: which heads a score picks is
        not known yet, how many is)."""
        counts = per_layer(n_layers, n_heads)
        placeholder = {kind: [[0.0] * n + [math.nan] * (max(counts) - n) for n in counts] for kind in SCORE_KINDS}
        return len(self.resolve(n_layers, n_heads, scores=placeholder, top_k=top_k, seed=seed))

    def check_baseline(self, n_layers: int, n_heads: HeadCounts, ks: Sequence[int] = (10,), seed: int = 0,
                       other: str = "", flag: str = "--top-k", scores: Any = None, late: bool = False,
                       scoring: Sequence[str] = ()) -> None:
        """Refuse a k whose random baseline (as many heads, none of the selected) cannot be drawn: on a small
        model the default k can name half its heads or more. Early (before the scores are computed) only where
        it fails whatever the scores pick: the fewest heads the spec can name (two ranked items may pick the
        same heads, or the heads it names); ``late`` (with the ``scores``, before the draws), where the heads
        it resolves to leave too few. The fix is a k that holds whatever the scores pick
        (each ranked item's k heads apart from the rest): the k of the draw's failure ("at most 3") was often
        the one given. ``flag`` is the option the ks came from: a k of ``--sweep`` is lowered there
        (``--top-k`` beside ``--sweep`` is refused, so a fix naming it did not run). ``scoring`` are the flags
        given that only score heads (``--n-seqs``, ``--seg-len``, ``--from``): a fix that drops every
        score-ranked item drops them too (the run refuses them as ignored once no head is ranked by a score)."""
        total = sum(per_layer(n_layers, n_heads))
        for k in ks:
            if not late:
                self.count(n_layers, n_heads, k, seed)  # ranges and k, before scores
                named, least = self._fewest(n_layers, n_heads, k, seed), " at least" if self.needs_scores else ""
            else:
                named, least = len(self.resolve(n_layers, n_heads, scores=scores, top_k=k, seed=seed)), ""
            if named > total - named:
                raise HeadSpecError(f"--heads {self.spec} names{least} {named} of the model's {total} heads, leaving "
                                    f"{total - named} to draw a random baseline of {named} other heads from",
                                    self._baseline_fix(n_layers, n_heads, ks, other, flag, scoring))

    def _explicit(self, n_layers: int, n_heads: HeadCounts) -> set[Head]:
        """The heads it names one by one (pairs and whole layers), whatever k and the scores."""
        fixed = [i for i in self.items if i[0] in ("pair", "layer")]
        return set(HeadSelection(self.spec, tuple(fixed)).resolve(n_layers, n_heads)) if fixed else set()

    def _fewest(self, n_layers: int, n_heads: HeadCounts, k: int, seed: int) -> int:
        """The fewest heads it can name with ``k``: what needs no scores (explicit heads, a seeded random draw),
        or k where a score's top k may all fall among them (and among each other's)."""
        known = [i for i in self.items if i[0] != "score"]
        named = len(HeadSelection(self.spec, tuple(known)).resolve(n_layers, n_heads, top_k=k, seed=seed)) \
            if known else 0
        return max(named, min(k, sum(per_layer(n_layers, n_heads)))) if self.needs_scores else named

    def safe_top_k(self, n_layers: int, n_heads: HeadCounts) -> int:
        """The largest k whose selection leaves a random baseline whatever the scores pick: its explicit heads
        and each distinct ranked item's k heads, all apart, at most half the model's heads (0: none does).

        >>> parse_spec("induction,previous-token").safe_top_k(2, 4), parse_spec("0.0,induction").safe_top_k(2, 4)
        (2, 3)
        """
        ranked = len({i for i in self.items if i[0] in ("score", "random")})
        room = sum(per_layer(n_layers, n_heads)) // 2 - len(self._explicit(n_layers, n_heads))
        return max(0, room // ranked) if ranked else 0

    def _baseline_fix(self, n_layers: int, n_heads: HeadCounts, ks: Sequence[int], other: str, flag: str,
                      scoring: Sequence[str] = ()) -> str:
        """What lets the baseline be drawn: at most half the heads named, said where the count comes from (an
        explicit spec names its heads itself: ``--top-k`` changed nothing; a ranked one, a k that holds for
        all its ranked items), and only ``other`` where no count can (a one-head model: ``--top-k 0`` was
        suggested, below its minimum)."""
        most = sum(per_layer(n_layers, n_heads)) // 2
        if most == 0:
            return (f"{other.removeprefix(', or ')} (a random baseline needs a model of 2 heads or more)" if other
                    else "use a model of 2 heads or more: a random baseline needs heads the selection leaves")
        safe = self.safe_top_k(n_layers, n_heads)
        if not self.ranked:
            return f"name at most {most} heads in --heads{other}"
        if safe == 0:
            return self._fewer_ranked_fix(n_layers, n_heads, most, flag, scoring) + other
        lower = (f"--top-k {safe}" if flag == "--top-k" else
                 f"{flag} values of at most {safe}, e.g. {flag} {_sweep_example(ks, safe)}")
        return f"name at most {most} heads ({lower}){other}"

    def _fewer_ranked_fix(self, n_layers: int, n_heads: HeadCounts, most: int, flag: str,
                          scoring: Sequence[str] = ()) -> str:
        """Where no k holds with every ranked item (each takes k heads apart from the rest and the named ones): the
        spec with as many ranked items as the room left by its named heads allows, at k = 1, or with none. "drop a
        ranked item" kept a k that still named more than half the heads; and a spec left with no score-ranked
        item drops the ``scoring`` flags too (``--n-seqs`` kept was refused as ignored, so the fix did not run)."""
        explicit = [i for i in self.items if i[0] in ("pair", "layer")]
        ranked = list(dict.fromkeys(i for i in self.items if i[0] in ("score", "random")))
        room = most - len(self._explicit(n_layers, n_heads))
        if room >= 1:
            kept = ranked[:room]
            lower = f"{flag} 1"
            unscored = f" and drop {_listed(scoring)}" if scoring and not any(i[0] == "score" for i in kept) else ""
            return (f"keep at most {room} ranked item{'s' if room > 1 else ''} in --heads, each at {lower} "
                    f"(e.g. --heads {_spec_text(explicit + kept)} {lower}){unscored}")
        drop = _listed([flag, *scoring])
        if room < 0 or not explicit:
            return f"name at most {most} heads one by one in --heads, without its ranked items (and drop {drop})"
        return f"drop the ranked items from --heads and drop {drop}: --heads {_spec_text(explicit)}"

    def check(self, n_layers: int, n_heads: HeadCounts, ks: Sequence[int] = (10,), seed: int = 0) -> None:
        """:meth:`count` for each of ``ks``: every k a run will take holds on this model."""
        for k in ks:
            self.count(n_layers, n_heads, k, seed)

    def ks(self, n_layers: int, n_heads: HeadCounts, sweep: Sequence[int] | None, top_k: int, seed: int = 0) -> list[int]:
        """The head counts a run goes through: each of ``sweep`` (else ``top_k``) for a ranked spec, checked;
        for an explicit spec (``17.3,layer:2``), the one count it names."""
        if self.ranked:
            ks = list(sweep or ()) or [top_k]
            self.check(n_layers, n_heads, ks, seed)
            return ks
        return [len(self.resolve(n_layers, n_heads, seed=seed))]

    def phrase(self, n: int) -> str | None:
        """How a sentence names ``n`` heads it selected ("the top-5 induction heads"), or None for a list."""
        if len(self.items) == 1 and self.items[0][0] == "score" and self.items[0][1] != "duplicate-token":
            return f"the top-{n} {self.items[0][1]} heads"
        if self.items == (("random",),):
            return f"{n} random heads"
        if len(self.items) == 1 and self.items[0][0] == "layer":
            return f"the {n} heads of layer {self.items[0][2].removeprefix('layer:')}"
        return None

    def __str__(self) -> str:
        return self.spec


def _spec_text(items: Sequence[tuple]) -> str:
    """Parsed spec items as ``--heads`` text again: ``0.1,layer:2,induction,random``."""
    return ",".join(f"{i[1]}.{i[2]}" if i[0] == "pair" else i[2] if i[0] == "layer" else
                    "random" if i[0] == "random" else i[1] for i in items)


def baseline_flags(options: Sequence[Any], opts: Mapping[str, Any],
                   scoring: Sequence[str] = ("from_report", "n_seqs", "seg_len")) -> dict:
    """:meth:`HeadSelection.check_baseline`'s ``other``, ``flag`` and ``scoring`` for a run's ``options`` (the
    plugin's :class:`~mechkit.plugin.Option` list) and their values ``opts``: a fix names every option it would
    leave unread (``--n-seqs`` once no head is ranked by a score, ``--baseline-seeds`` under ``--baseline
    none``), since the run refuses those as ignored and a fix that kept them did not run. ``scoring`` are the
    option names that only score heads (``shuffle``'s ``--n-seqs`` also sets its loss: not among them)."""
    given = {o.name: o.flag for o in options if o.name in opts and opts[o.name] != o.default}
    other = ""
    if "baseline" in opts:
        other = ", or --baseline none" + (f" and drop {given['baseline_seeds']}" if "baseline_seeds" in given else "")
    return {"other": other, "flag": "--sweep" if opts.get("sweep") else "--top-k",
            "scoring": [given[name] for name in scoring if name in given]}


def _listed(flags: Sequence[str]) -> str:
    """``["--top-k", "--n-seqs", "--seg-len"]`` as "--top-k, --n-seqs and --seg-len"."""
    flags = list(dict.fromkeys(flags))
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"


def _sweep_example(ks: Sequence[int], most: int) -> str:
    """``ks`` with every k past ``most`` dropped (``most`` itself where none is left), as ``--sweep`` text."""
    kept = [k for k in dict.fromkeys(ks) if k <= most] or [most]
    return ",".join(str(k) for k in kept)


def parse_spec(spec: str | HeadSelection) -> HeadSelection:
    """Read a ``--heads`` spec's grammar once into a :class:`HeadSelection`; ranges need the model and are
    checked when it resolves. Memoised: the command line's early check and the run share one parse.

    >>> parse_spec("1.2,layer:0").items
    (('pair', 1, 2), ('layer', 0, 'layer:0'))
    """
    if isinstance(spec, HeadSelection):
        return spec
    return _parse_text(str(spec))


@functools.lru_cache(maxsize=64)
def _parse_text(spec: str) -> HeadSelection:
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise HeadSpecError("empty head spec", _FIX)
    return HeadSelection(spec, tuple(_parse_item(item) for item in items))


def _parse_item(item: str) -> tuple:
    if m := _PAIR.match(item):
        return ("pair", int(m[1]), int(m[2]))
    if m := _LAYER.match(item):
        return ("layer", int(m[1]), item)
    if item == "random":
        return ("random",)
    if item in SCORE_KINDS:
        return ("score", item)
    raise HeadSpecError(f"malformed head spec {item!r}", _FIX)


def parse_heads(
    spec: str | HeadSelection | Sequence[Head] | Sequence[tuple[int, int]],
    n_layers: int,
    n_heads: HeadCounts,
    *,
    scores: Mapping[str, Sequence[Sequence[float]]] | None = None,
    top_k: int | None = None,
    seed: int = 0,
    exclude: Sequence[Head] = (),
) -> list[Head]:
    """Resolve a head spec to a sorted, de-duplicated list of heads (``top_k`` per ranked or random item;
    ``None``: 10, but at most half the model's heads: :func:`default_top_k`).

    ``scores`` maps a score kind (``induction`` …) to a ``[layer][head]`` grid; score-ranked
    specs need it. Raises :class:`HeadSpecError` with one line naming the problem and the fix.
    A :class:`HeadSelection` is resolved as it is (its text is not read again).

    >>> parse_heads("1.2,layer:0", n_layers=2, n_heads=3)
    [Head(layer=0, head=0), Head(layer=0, head=1), Head(layer=0, head=2), Head(layer=1, head=2)]
    """
    _check_shape(n_layers, n_heads)  # a TypeError deep in a comparison else
    if isinstance(spec, str | HeadSelection):
        return parse_spec(spec).resolve(n_layers, n_heads, scores=scores, top_k=top_k, seed=seed, exclude=exclude)
    try:
        heads = [h if isinstance(h, Head) else Head(*h) for h in spec]
    except TypeError:
        raise HeadSpecError(f"a head spec must be text or (layer, head) pairs, not {spec!r}", _FIX) from None
    return _validated(heads, n_layers, n_heads)


def _whole(value: object, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= least


def _check_shape(n_layers: object, n_heads: object) -> None:
    """One line unless ``n_layers`` is a whole number ≥ 1 and ``n_heads`` one ≥ 1 or one whole count per
    layer (a model with heads pruned: ``m.anatomy.head_counts``)."""
    fix = "pass the model's shape, e.g. n_layers=m.anatomy.n_layers, n_heads=m.anatomy.head_counts"
    if not _whole(n_layers, 1):
        raise HeadSpecError(f"n_layers must be a whole number of at least 1, not {n_layers!r}", fix)
    per_layer_ok = (isinstance(n_heads, Sequence) and not isinstance(n_heads, str) and len(n_heads) == n_layers
                    and all(_whole(n, 0) for n in n_heads) and any(n >= 1 for n in n_heads))
    if not (_whole(n_heads, 1) or per_layer_ok):
        raise HeadSpecError(f"n_heads must be a whole number of at least 1 or one count per layer, not {n_heads!r}",
                            fix)


def check_spec_syntax(spec: str) -> str:
    """``spec`` unchanged once every item is well formed; ranges need the model and are checked later.

    Lets a command refuse ``--heads a.b`` before the model loads.

    >>> check_spec_syntax("induction, 17.3")
    'induction, 17.3'
    >>> try:
    ...     check_spec_syntax("layer:-1")
    ... except HeadSpecError as err:
    ...     print(err.problem)
    malformed head spec 'layer:-1'
    """
    parse_spec(spec)
    return spec


def needs_scores(spec: str | HeadSelection) -> bool:
    """Whether a spec ranks heads by a score (so the caller must supply or compute scores)."""
    return parse_spec(spec).needs_scores


def check_top_k(top_k: Any, n_layers: int, n_heads: HeadCounts) -> int:
    """``top_k`` checked (a whole number of at least 1), or the model's :func:`default_top_k` for ``None``."""
    if top_k is None:
        return default_top_k(n_layers, n_heads)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise HeadSpecError(f"top-k must be a whole number of at least 1, got {top_k!r}",
                            "pass --top-k K (top_k=K in Python) with K >= 1, or leave it out for the default")
    return top_k


def _resolve_item(item, n_layers, n_heads, scores, top_k, seed, exclude) -> list[Head]:
    kind = item[0]
    if kind == "pair":
        return [Head(item[1], item[2])]
    if kind == "layer":
        layer = item[1]
        if layer >= n_layers:
            raise HeadSpecError(f"layer {layer} in {item[2]!r} is out of range: the model has {n_layers} layers "
                                f"(0–{n_layers - 1})", "pick a layer in that range")
        return [Head(layer, h) for h in range(per_layer(n_layers, n_heads)[layer])]
    if kind == "random":
        return random_heads(n_layers, n_heads, top_k, seed, exclude)
    score = item[1]
    scores = _score_map(scores)
    if not scores or score not in scores:
        raise HeadSpecError(f"the {score!r} head spec needs {score} scores",
                            "on the command line run `mechkit detect` and pass --from REPORT, or let the plugin "
                            "compute them; in Python pass scores=mk.run(\"detect\", model=m, write=False)"
                            ".results[\"scores\"]")
    grid = scores[score]
    if not _is_grid(grid, n_layers, n_heads):  # another model's scores would rank heads silently wrong
        widest = max(per_layer(n_layers, n_heads))
        empty = "" if len(set(per_layer(n_layers, n_heads))) == 1 else \
            f", empty (NaN or None) past each layer's own {', '.join(map(str, per_layer(n_layers, n_heads)))} heads"
        raise HeadSpecError(f"the {score} scores are not a {n_layers} × {widest} grid of numbers (this model's layers × "
                            f"heads{empty})", "use scores from `mechkit detect` on this same model")
    if not _finite_heads(grid, n_layers, n_heads):  # NaN sorts anywhere: the "top" heads would be arbitrary
        raise HeadSpecError(f"the {score} scores hold NaN or inf for some of the model's heads",
                            "use scores from a `mechkit detect` run that finished on this model")
    return top_heads(grid, top_k)


def _score_map(scores: Any) -> Any:
    """``scores`` as a mapping: a :class:`mechkit.Run` of ``detect`` (what ``mk.run("detect", ...)`` returns)
    stands for its ``results["scores"]``; anything else that is not a mapping is refused in one line."""
    results = getattr(scores, "results", None)
    if isinstance(results, Mapping) and isinstance(results.get("scores"), Mapping):
        return results["scores"]
    if scores is not None and not isinstance(scores, Mapping):
        raise HeadSpecError(f"scores must be a dict of score name to a layers × heads grid, not {type(scores).__name__}",
                            "pass scores=mk.run(\"detect\", model=m, write=False).results[\"scores\"]")
    return scores


def _finite_heads(grid, n_layers: int, n_heads: HeadCounts) -> bool:
    """Whether every head the model has (not the empty cells past a pruned layer's heads) has a finite score."""
    counts = per_layer(n_layers, n_heads)
    return all(v is not None and math.isfinite(float(v)) for row, n in zip(grid, counts, strict=True)
               for v in list(row)[:n])


def _is_grid(grid, n_layers: int, n_heads: HeadCounts) -> bool:
    """Whether ``grid`` is ``n_layers`` rows of the widest layer's count of numbers (lists, arrays or tensors);
    where layers differ, a layer's cells past its own heads are empty (NaN or None)."""
    counts = per_layer(n_layers, n_heads)
    try:
        rows = [[float("nan") if v is None else float(v) for v in row] for row in grid]
    except (TypeError, ValueError):
        return False
    if isinstance(grid, str) or len(rows) != n_layers or any(len(r) != max(counts) for r in rows):
        return False
    # a score in a cell past a layer's own heads is another (e.g. the dense) model's grid: its numbering differs
    return all(math.isnan(v) for r, n in zip(rows, counts, strict=True) for v in r[n:])


def check_heads(anatomy, heads) -> None:
    """One line (:class:`HeadSpecError`) for a :class:`Head` the model does not have, for the functions that take
    heads as objects rather than a spec: a head past a layer's count would slice nothing (a silent no-op on a
    pruned layer) and a negative layer would edit another layer."""
    heads = list(heads)
    if not all(isinstance(h, Head) for h in heads):
        raise HeadSpecError(f"expected Head(layer, head) objects, got {heads[:3]!r}",
                            "build heads with Head(layer, head), or parse a spec with parse_heads")
    _validated(heads, anatomy.n_layers, anatomy.head_counts)


def _validated(heads: list[Head], n_layers: int, n_heads: HeadCounts) -> list[Head]:
    counts = per_layer(n_layers, n_heads)
    checked = []
    for h in heads:
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in (h.layer, h.head)):
            # int() would truncate (0.7, 1) to head 0.1 silently, and a float index is a TypeError deep inside
            raise HeadSpecError(f"head ({h.layer!r}, {h.head!r}) is not a pair of integers",
                                "give heads as Head(layer, head) or (layer, head) with integers, e.g. (1, 2)")
        h = Head(int(h.layer), int(h.head))
        if not (0 <= h.layer < n_layers and 0 <= h.head < counts[h.layer]):
            raise HeadSpecError(f"head {h} is out of range: {_shape(n_layers, counts, h.layer)}",
                                "pick heads inside that range")
        checked.append(h)
    return sorted(set(checked))


def _shape(n_layers: int, counts: list[int], layer: int) -> str:
    """The model's layers and heads in words (per layer where their counts differ)."""
    text = f"the model has {n_layers} layers (0–{n_layers - 1})"
    if len(set(counts)) == 1:
        return f"{text} and {counts[0]} heads per layer (0–{counts[0] - 1})"
    if 0 <= layer < n_layers:
        return f"layer {layer} of this pruned model has {counts[layer]} heads (0–{counts[layer] - 1})"
    return f"{text}, with {', '.join(map(str, counts))} heads"


def heads_by_layer(heads: Sequence[Head]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for h in heads:
        out.setdefault(h.layer, []).append(h.head)
    return out


def refuse_unused_ranking(heads: object, top_k: object, scores: object, verb: str = "ablate") -> None:
    """``top_k`` or ``scores`` where the heads are named one by one (``mk.ablate``, ``mk.show_attention``),
    refused rather than silently ignored: they pick among ranked or random heads, and there are none to pick
    from."""
    if top_k is None and scores is None:
        return
    ranked = False
    if isinstance(heads, str | HeadSelection):
        try:
            ranked = parse_spec(heads).ranked
        except MechkitError:
            return  # a malformed spec: parse_heads names what is wrong with it
    if not ranked:
        given = "top_k=" if top_k is not None else "scores="
        raise MechkitError(f"{given} picks among ranked or random heads, and heads= names each head to {verb}, so "
                           "it would be ignored", f"drop {given}, or ask for ranked heads "
                           "(heads=\"induction\", heads=\"random\") to pick the top_k of")


# A seed as the random generators take it: torch.Generator().manual_seed takes a signed 64-bit integer (and
# raised "Overflow" past it), random.Random refuses NumPy integers; each API entry that draws checks it here.
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer


def checked_seed(seed: Any, who: str = "", error: type[MechkitError] = MechkitError) -> int:
    """``seed`` as a plain int in ``0..MAX_SEED``, else one ``error`` line (naming ``who`` where given).

    The one range check for seeds: the API's ``mk.ablate`` and the runner's ``--seed`` both call it, so
    a NumPy integer or a seed past torch's signed 64 bits is read or refused the same way everywhere.

    >>> import numpy as np
    >>> checked_seed(np.int64(3), "mk.ablate"), checked_seed(np.array(4))
    (3, 4)
    """
    where, fix = (f"{who}: " if who else ""), f"pass {'seed= ' if who else ''}a whole number from 0 to {MAX_SEED}"
    if type(seed).__name__ == "ndarray" and getattr(seed, "ndim", None) == 0:
        seed = seed[()]  # np.array(2) as its item, as the options read a 0-d array
    if isinstance(seed, bool) or type(seed).__name__ in ("bool_", "bool") or not isinstance(seed, numbers.Integral):
        raise error(f"{where}seed must be a whole number, not {seed!r}", fix)
    if not 0 <= int(seed) <= MAX_SEED:
        raise error(f"{where}seed {int(seed)} is out of range", fix)
    return int(seed)


def whole_number_text(text: Any) -> bool:
    """``text`` is a whole number written in ASCII digits only, as ``int()`` reads it plainly.

    ``str.isdigit`` is true for ``'²'`` and ``'¹'`` (which ``int()`` refuses with a ValueError) and
    ``str.isdecimal`` for other scripts' digits (``'٣'``, which ``int()`` reads as 3): every check that
    is followed by ``int()`` uses this instead.

    >>> whole_number_text("12"), whole_number_text("²"), whole_number_text("٣"), whole_number_text("")
    (True, False, False, False)
    """
    return isinstance(text, str) and text.isascii() and text.isdigit()


def non_utf8_at(text: str) -> str | None:
    """Where ``text`` holds a character UTF-8 cannot encode (a lone surrogate: a byte of a command-line argument
    that was not UTF-8, kept by Python as ``'\\udcff'``), in words, else ``None``. A tokenizer raised
    TypeError on such text, after the model had loaded.

    >>> non_utf8_at("ab\\udcff"), non_utf8_at("\\ud800"), non_utf8_at("The cat")
    ('character 3, the byte 0xff', "character 1, '\\\\ud800'", None)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = text[err.start]
        byte = ord(char) - 0xDC00  # how Python keeps a byte that was not UTF-8 (surrogateescape)
        return f"character {err.start + 1}, " + (f"the byte 0x{byte:02x}" if 0x80 <= byte <= 0xFF else repr(char))
    return None
