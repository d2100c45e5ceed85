"""Choosing where a vector goes: the layer (and scale, span) that does best on dev prompts.

:func:`choose` reads a dev sweep over (scale, span) × layer; :func:`choose_layer` is its one-scale,
one-span case for a plain accuracy-per-layer curve. Both rank by the same key — accuracy first,
since exact match is what is reported; then the answer's log-prob, which separates layers that
tie on the coarse accuracy of a few dev prompts; then the earliest layer, the smallest scale and
the shortest span, the least intervention that does as well. The ``parse_*`` functions read the
grids to sweep (``--layers``, ``--fv-scales``, ``--spans`` of ``icl-vectors``).
"""

from __future__ import annotations

from collections.abc import Sequence

from mechkit.errors import MechkitError


def choose(dev: dict, layers: Sequence[int]) -> tuple[int, float, int]:
    """The dev sweep's best ``(layer, scale, span)``: highest accuracy, then log-prob, then earliest
    layer, smallest scale, shortest span.

    ``dev`` holds ``scales`` and ``spans`` (one per config; ``spans`` absent means all 1) and, per
    config, ``accuracy`` and ``logprob`` per layer of ``layers``. Layers where a span would run past
    the model (``None``) are skipped.

    >>> dev = {"scales": [1.0, 4.0], "accuracy": [[0.1, 0.5], [0.5, 0.2]], "logprob": [[-3, -1], [-2, -1]]}
    >>> choose(dev, [10, 20])  # 0.5 twice: layer 20 at scale 1 has the better log-prob
    (20, 1.0, 1)
    """
    spans = dev.get("spans", [1] * len(dev["scales"]))
    best = max(((a, lp, -L, -x, -k), L, x, k)
               for x, k, accs, lps in zip(dev["scales"], spans, dev["accuracy"], dev["logprob"], strict=True)
               for L, a, lp in zip(layers, accs, lps, strict=True) if a is not None)
    return best[1], best[2], best[3]


def choose_layer(curve: dict[int, float], logprobs: dict[int, float] | None = None) -> int:
    """The best layer of a dev curve ``{layer: accuracy}``: highest accuracy, then highest log-prob
    (``logprobs``, missing layers count 0), then the earliest — :func:`choose` at one scale and span.

    >>> choose_layer({3: 0.5, 7: 0.5, 9: 0.2}, {3: -2.0, 7: -1.0, 9: 0.0})
    7
    """
    layers = list(curve)
    lps = [(logprobs or {}).get(L, 0.0) for L in layers]
    dev = {"scales": [1.0], "spans": [1], "accuracy": [[curve[L] for L in layers]], "logprob": [lps]}
    return choose(dev, layers)[0]


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``all``, ``12-24`` or ``10,20,25`` -> sorted layer indices, validated.

    >>> parse_layers("1-2,5", 6)
    [1, 2, 5]
    """
    fix = f"use all, a range like 12-24 or a list like 10,20 (layers 0..{n_layers - 1})"
    try:
        if text.strip() == "all":
            return list(range(n_layers))
        layers: set[int] = set()
        for item in (x.strip() for x in text.split(",") if x.strip()):
            lo, _, hi = item.partition("-")
            layers.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise MechkitError(f"malformed --layers {text!r}", fix) from None
    if not layers or min(layers) < 0 or max(layers) >= n_layers:
        raise MechkitError(f"--layers {text!r} is out of range", fix)
    return sorted(layers)


def parse_scales(text: str) -> list[float]:
    """``1,2,4`` -> the positive function-vector scales to try, in the given order.

    >>> parse_scales("1, 2,4")
    [1.0, 2.0, 4.0]
    """
    try:
        scales = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        scales = []
    if not scales or min(scales) <= 0:
        raise MechkitError(f"malformed --fv-scales {text!r}", "use positive numbers like 1,2,4")
    return scales


def parse_spans(text: str, n_layers: int) -> list[int]:
    """``1,2`` -> numbers of consecutive layers to try, each at least 1 and at most ``n_layers``.

    >>> parse_spans("2,1", 30)
    [1, 2]
    """
    try:
        spans = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        spans = []
    if not spans or spans[0] < 1 or spans[-1] > n_layers:
        raise MechkitError(f"malformed --spans {text!r}", f"use whole numbers from 1 to {n_layers}, like 1,2")
    return spans
