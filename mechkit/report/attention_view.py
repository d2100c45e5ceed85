"""``mk.show_attention``: where heads attend on any prompt, inline in Jupyter or saved as one HTML file.

The view holds the prompt as text, the model's layer × head grid (hover a recorded head to see its
pattern, click to keep it), the pattern as a token × token matrix with a dot on each query's top
source (an induction head's stripe, one after each earlier occurrence, shows at a glance), and the
prompt again per head, tinted by its attention from a query token you click. Patterns are recorded
by :func:`~mechkit.report.patterns.record_patterns` (the path detect reads, on every backend), stored
one byte per weight (:mod:`mechkit.report.patterns`) and drawn by the same script as the reports'
grids (:mod:`mechkit.report.views`): nothing is fetched, so it works offline.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> view = mk.show_attention(m, "abcabc", heads="1.2,layer:0")
>>> view
AttentionView of 5 heads on 6 tokens of tiny:llama
>>> 'class="mk-view' in view._repr_html_()
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mechkit.errors import MechkitError
from mechkit.model.headspec import Head, HeadSelection, checked_seed, needs_scores, parse_heads
from mechkit.report import views
from mechkit.report.patterns import Patterns, record_patterns

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from mechkit.model.handle import ModelHandle

MAX_TOKENS = 512
"""Longest prompt a view holds: each head stores T(T+1)/2 bytes, 131 kB per head at 512 tokens."""
VALUE_LABEL = "mean top weight"


@dataclass
class AttentionView:
    """Recorded patterns and the layer × head grid they sit in; renders inline and saves as a page."""

    patterns: Patterns
    n_layers: int
    n_heads: int
    model: str = "model"

    def focus(self) -> list[list[float | None]]:
        """Each recorded head's mean (over queries) largest attention weight; ``None`` for the others:
        the grid's colour, near 1 for a head that attends to one token, low for a diffuse one."""
        grid: list[list[float | None]] = [[None] * self.n_heads for _ in range(self.n_layers)]
        for head, pattern in zip(self.patterns.heads, self.patterns.values, strict=True):
            grid[head.layer][head.head] = float(np.asarray(pattern).max(axis=1).mean())
        return grid

    def grid(self) -> views.HeadGrid:
        return views.HeadGrid(self.focus(), f"{self.model}: recorded heads (outlined)", VALUE_LABEL,
                              [(h.layer, h.head) for h in self.patterns.heads], self.patterns, text=True)

    def figure(self) -> Figure:
        """The grid as a PNG-able heatmap that the report page draws interactively beside itself."""
        from mechkit.report.plots import head_heatmap

        grid = self.grid()
        fig = head_heatmap(grid.values, grid.title, VALUE_LABEL, highlight=grid.highlight, patterns=self.patterns)
        fig.mechkit_grid.text = True
        return fig

    def spec(self) -> dict[str, Any]:
        """What the script draws: the grid, the patterns inline, the first head, the text panel."""
        first = self.patterns.heads[0]
        return {"grid": self.grid().to_json(), "patterns": self.patterns.to_json(), "pick": str(first), "text": True}

    def fragment(self) -> str:
        """The view as an HTML fragment (its CSS scoped to it, its script inline)."""
        from mechkit.report.inline import scoped_css

        return (f'<div class="mechkit-attention mk-scope"><style>{scoped_css(views.CSS, "mechkit-attention")}'
                f"</style>{views.view_html(self.spec())}{views.script_html()}</div>")

    def _repr_html_(self) -> str:
        return self.fragment()

    def html(self) -> str:
        """The view as one page: no file beside it, nothing fetched."""
        title = f"attention: {escape(self.model)} — mechkit"
        return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{title}</title><style>body{{font:15px/1.5 system-ui,sans-serif;max-width:1120px;"
                f"margin:0 auto;padding:1.5em 2em}}</style></head><body><h1>{title}</h1>{self.fragment()}</body></html>")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`html` to ``path`` (atomically, under its lock); return it."""
        from mechkit.io.locked_write import write_locked

        return write_locked(path, self.html(), "the attention page")  # under its lock; never a model's file

    def __repr__(self) -> str:
        n = len(self.patterns.heads)
        return f"AttentionView of {n} head{'s' if n != 1 else ''} on {len(self.patterns.tokens)} tokens of {self.model}"


def select_heads(handle: ModelHandle, heads: str | HeadSelection | Sequence | None, top_k: int | None = None, seed: int = 0,
                 scores: Mapping[str, Sequence[Sequence[float]]] | None = None) -> list[Head]:
    """The heads a view records: every head for ``None``, else the spec resolved as everywhere (a score-ranked
    spec uses ``scores``, or scores computed now on 20 seeded repeated random sequences)."""
    a = handle.anatomy
    if heads is None:
        return [Head(layer, h) for layer in range(a.n_layers) for h in range(a.heads_in(layer))]
    if isinstance(heads, str | HeadSelection) and needs_scores(heads) and scores is None:
        from mechkit.heads.scores import compute_scores
        from mechkit.model.checks.token_ids import position_rows

        rows = position_rows(handle.model)  # segments that fit a learned position table (it has no seg_len option)
        seg_len = 25 if rows is None else min(25, (rows - (handle.bos_id is not None)) // 2)
        if seg_len < 2:
            raise MechkitError(f"the model's {rows} positions are too few to rank heads on repeated tokens",
                               'name the heads to show, e.g. heads="0.1,1.2", or pass scores= from a detect report')
        scores = compute_scores(handle, n_seqs=20, seg_len=seg_len, seed=seed)
    return parse_heads(heads, a.n_layers, a.head_counts, scores=scores, top_k=top_k, seed=seed)


def show_attention(model: Any, text: str, heads: str | HeadSelection | Sequence | None = None, *, top_k: int | None = None,
                   seed: int = 0, scores: Mapping[str, Sequence[Sequence[float]]] | None = None) -> AttentionView:
    """The attention of ``heads`` (a head spec, as ``--heads`` takes; default every head) on ``text``.

    ``model`` is a loaded model or a spec for :func:`mechkit.load_model`. Displayed in Jupyter it draws
    itself; ``.save("attention.html")`` writes it as one page that opens offline.
    """
    from mechkit.model.handle import ModelHandle

    if not isinstance(text, str) or not text.strip():
        raise MechkitError("show_attention needs a non-empty prompt text", 'pass the prompt, e.g. "The cat sat"')
    seed = checked_seed(seed, "mk.show_attention")  # before the load: -1 drew the heads 1 draws
    if not isinstance(model, ModelHandle):
        from mechkit.model.loading import load_model

        model = load_model(model)
    ids = model.to_tokens(text)
    if ids.shape[1] > MAX_TOKENS:
        raise MechkitError(f"the prompt has {ids.shape[1]} tokens; a view holds at most {MAX_TOKENS}",
                           "shorten the prompt")
    from mechkit.model.checks.token_ids import position_rows

    rows = position_rows(model.model)
    if rows is not None and ids.shape[1] > rows:  # the first forward said "truncate or split the text", naming no option
        raise MechkitError(f"the prompt has {ids.shape[1]} tokens, more than the model's {rows} positions (it learned "
                           "one embedding per position)", f"pass a prompt of at most {rows} tokens (--prompt, prompt=)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise MechkitError(f"top_k must be a whole number of at least 1, not {top_k!r}",
                           "pass top_k=4, say, or leave it out (10, at most half the model's heads)")
    from mechkit.model.headspec import refuse_unused_ranking

    refuse_unused_ranking(heads, top_k, scores, verb="show")
    chosen = select_heads(model, heads, top_k, seed, scores)
    if not chosen:
        raise MechkitError("the head spec selects no heads", 'name at least one, e.g. heads="0.1" or heads=None for all')
    patterns = record_patterns(model, ids, chosen, name="prompt")
    return AttentionView(patterns, model.anatomy.n_layers, model.anatomy.n_heads, str(model.spec))


__all__ = ["MAX_TOKENS", "AttentionView", "select_heads", "show_attention"]
