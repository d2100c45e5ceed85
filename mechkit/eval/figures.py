"""What an analysis draws, as data: a :class:`Plot` names one of :mod:`mechkit.report`'s plot functions
and its arguments.

The analyses sit below the reports (they must not import matplotlib or the report layer), yet they
know best which figures their results make. So they describe each figure as a ``Plot`` and the plugin
draws it with :func:`mechkit.report.draw`; every analysis thereby draws with the same helpers.

>>> Plot("line_plot", ([1, 2], {"loss": [0.5, 0.25]}, "Loss", "step", "nats")).kind
'line_plot'
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Plot"]


@dataclass(frozen=True)
class Plot:
    """``getattr(mechkit.report, kind)(*args, **kwargs)`` draws it (:func:`mechkit.report.draw`)."""

    kind: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
