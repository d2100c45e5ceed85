"""Answer tokens and the metrics patching measures with them.

Each metric reads the logits at the answer position, ``[batch, vocab]``, and gives one value per row.
:func:`normalized_recovery` is ``(patched − corrupted) / (clean − corrupted)``: 0 where the patch
restores nothing, 1 where it restores the clean run's value (Wang et al. 2022's normalisation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def answer_id(handle: ModelHandle, answer: str | int) -> int:
    """The token id of ``answer`` (text, with its leading space where the word follows a space), refused in
    one line unless it is exactly one token: a logit difference between multi-token answers is not defined.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> answer_id(m, "a") == m.tokenizer("a", add_special_tokens=False)["input_ids"][0]
    True
    """
    from mechkit.patching.lens_checks import as_integer

    answer = as_integer(answer)  # a NumPy integer or a one-element tensor is an id; it reached the tokenizer raw
    if isinstance(answer, bool) or not isinstance(answer, int | str):  # True was read as token id 1
        raise MechkitError(f"answer {answer!r} is neither text nor a token id"[:200],
                           "give the answer as text (' Mary') or an integer token id")
    if isinstance(answer, int):
        if not 0 <= answer < len(handle.tokenizer):
            raise MechkitError(f"answer token id {answer} is outside the vocabulary ({len(handle.tokenizer)} tokens)",
                               "give the answer as text or a valid id")
        return answer
    ids = handle.tokenizer(answer, add_special_tokens=False)["input_ids"]
    if not ids:
        raise MechkitError(f"answer {answer!r} is no token at all", "give answers that are single tokens")
    if len(ids) != 1:
        raise MechkitError(f"answer {answer!r} is {len(ids)} tokens, not one ({handle.to_str_tokens(ids)})",
                           "give answers that are single tokens (check the leading space)")
    return ids[0]


def logit_diff(logits: torch.Tensor, correct: int, wrong: int) -> torch.Tensor:
    """``logit[correct] − logit[wrong]`` per row of ``[batch, vocab]`` logits."""
    return (logits[..., correct] - logits[..., wrong]).float()


def answer_logprob(logits: torch.Tensor, answer: int) -> torch.Tensor:
    """``log p(answer)`` per row of ``[batch, vocab]`` logits."""
    return torch.log_softmax(logits.float(), dim=-1)[..., answer]


def normalized_recovery(patched: torch.Tensor | float, clean: float, corrupted: float) -> torch.Tensor | float:
    """``(patched − corrupted) / (clean − corrupted)``; refused where clean and corrupted agree (nothing to recover).

    >>> normalized_recovery(2.0, clean=3.0, corrupted=-1.0)
    0.75
    """
    gap = clean - corrupted
    if abs(gap) < 1e-6:
        raise MechkitError(f"the clean and corrupted runs give the same metric ({clean:.4g})",
                           "choose a corruption that changes the answer")
    return (patched - corrupted) / gap
