"""The options of pruning: ``--guide``, ``--target`` and ``--sparsity``, shared by ``prune`` and ``adapt``.

They live in the core so that no plugin imports another to reuse a parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from mechkit.options.option import OptionError


@dataclass(frozen=True)
class GuideList:
    """``--guide``: comma-separated guides, each optionally ``GUIDE@ALLOCATION`` (checked by
    :func:`mechkit.pruning.parse_guides`) -> their list; at least one.

    >>> GuideList()("attribution@sensitivity, random")
    ['attribution@sensitivity', 'random']
    """

    metavar: str = "GUIDE[@ALLOCATION][,...]"
    example: str = "attribution,wanda"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> list[str]:
        from mechkit.pruning import parse_guides

        guides = parse_guides(str(text))
        if not guides:
            raise OptionError("no guide given", "pass --guide attribution (or a comma list)")
        return guides


@dataclass(frozen=True)
class TargetList:
    """``--target``: comma-separated unit types (:func:`mechkit.pruning.parse_targets`) -> their list.

    >>> TargetList()("neurons, heads")
    ['neurons', 'heads']
    """

    metavar: str = "neurons|heads|layers[,...]"
    example: str = "neurons,heads"

    def describe(self) -> str:
        return ""

    def __call__(self, text: str) -> list[str]:
        from mechkit.pruning import parse_targets

        return parse_targets(str(text))


@dataclass(frozen=True)
class Levels:
    """Checked ``--sparsity`` text; :meth:`resolve` gives its levels for the chosen ``--target`` s."""

    text: str

    def resolve(self, targets: list[str]) -> list[dict[str, float]]:
        from mechkit.pruning import parse_levels

        return parse_levels(self.text, targets)


@dataclass(frozen=True)
class SparsityLevels:
    """``--sparsity``: fractions in (0, 1) (``0.1,0.2``: one level each, for every target) or one level of
    ``target=fraction`` pairs, checked by :func:`mechkit.pruning.parse_levels` -> :class:`Levels`.

    Which targets a bare fraction applies to is ``--target``'s, so the levels themselves are resolved
    in ``run()`` (before any work).

    >>> SparsityLevels()("0.1,0.2").resolve(["neurons", "heads"])[1]
    {'neurons': 0.2, 'heads': 0.2}
    """

    metavar: str = "F[,F...]|TARGET=F[,...]"
    example: str = "0.1,0.2"

    def describe(self) -> str:
        return "each 0<x<1"

    def __call__(self, text: str) -> Levels:
        from mechkit.pruning import parse_levels
        from mechkit.pruning.select import TARGETS

        levels = Levels(str(text))
        if not parse_levels(levels.text, list(TARGETS)):
            raise OptionError("no sparsity given", "use fractions like 0.2,0.3 or neurons=0.3,heads=0.2")
        return levels
