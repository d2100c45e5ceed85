"""Clean/corrupted prompt pairs with two single-token answers: what a patching run compares.

IOI with the name swapped (as in TransformerLens' exploratory analysis of Wang et al.'s task): the
corrupted sentence repeats the indirect object instead of the subject, so the right answer becomes the
subject and ``logit(IO) − logit(S)`` flips sign; both sentences have the same tokens but one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError
from mechkit.patching.answers import answer_id

if TYPE_CHECKING:
    import torch

    from mechkit.model.handle import ModelHandle


@dataclass(frozen=True)
class PromptPair:
    """A clean and a corrupted text, the clean answer (``correct``) and the competing one (``wrong``)."""

    clean: str
    corrupted: str
    correct: str
    wrong: str


def ioi_pairs(n: int, seed: int = 0) -> list[PromptPair]:
    """``n`` IOI sentences and their name-swapped corruptions (the repeated subject replaced by the IO).

    >>> p = ioi_pairs(1)[0]
    >>> p.clean.count(p.wrong.strip()), p.corrupted.count(p.correct.strip())   # the repeated name
    (2, 2)
    """
    from mechkit.tasks import build_prompts

    pairs = []
    for q in build_prompts("ioi", n=n, seed=seed):
        io, subject = q.answer.strip(), q.distractor.strip()
        head, _, tail = q.text.rpartition(subject)
        pairs.append(PromptPair(q.text, head + io + tail, q.answer, q.distractor))
    return pairs


def tokens(handle: ModelHandle, pair: PromptPair) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(clean ids, corrupted ids, correct id, wrong id)``, refused in one line where the answers are not
    single tokens or the prompts' lengths differ (there is no position alignment to patch along)."""
    clean, corrupted = handle.to_tokens(pair.clean), handle.to_tokens(pair.corrupted)
    if clean.shape[-1] != corrupted.shape[-1]:
        raise MechkitError(f"the clean prompt has {clean.shape[-1]} tokens and the corrupted {corrupted.shape[-1]}",
                           "give prompts of the same length in tokens (swap words of equal token counts)")
    return clean, corrupted, answer_id(handle, pair.correct), answer_id(handle, pair.wrong)
