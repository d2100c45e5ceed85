"""Random tokens repeated twice: the standard probe for induction heads.

On ``[BOS] t1 … tL t1 … tL`` an induction head at a token of the second copy attends to the token
*after* that token's first occurrence (and a previous-token head attends to position t-1); the loss on
the second copy collapses when induction works. Song, Xu & Zhong (arXiv 2408.09503) score heads
exactly this way. The sequences are token ids, not text, so this task is used through
:func:`repeated_random_tokens`, never through ``build_prompts``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from mechkit.tasks.prompt import Prompt, TaskOptionError


def repeated_random_tokens(
    vocab_size: int,
    n_seqs: int = 50,
    seg_len: int = 25,
    seed: int = 0,
    bos_id: int | None = None,
    exclude_ids: Iterable[int] = (),
    n_positions: int | None = None,
) -> np.ndarray:
    """``int64 [n_seqs, (1 if bos) + 2*seg_len]``: a random segment, the same segment again.

    Tokens are drawn without replacement within a segment (so "the token after its earlier
    occurrence" is unique) from ``range(vocab_size)`` minus ``exclude_ids`` and ``bos_id`` — pass a
    tokenizer's special ids there so no EOS/PAD sits in the middle of a sequence. ``n_positions``, a model's
    learned positions, bounds the length: past it the first forward refused "truncate or split the text",
    a fix for no text the user gave.
    """
    for name, value, minimum in (("vocab_size", vocab_size, 1), ("n_seqs", n_seqs, 1),
                                 ("seg_len", seg_len, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise TaskOptionError(f"{name} must be an integer >= {minimum}, got {value!r}",
                                  f"pass {name}={minimum} or more")
    if bos_id is not None and not 0 <= bos_id < vocab_size:
        raise TaskOptionError(f"bos_id {bos_id} is outside the vocabulary (size {vocab_size})",
                              "pass the tokenizer's bos_token_id, or None for no BOS")
    if n_positions is not None and (isinstance(n_positions, bool) or not isinstance(n_positions, (int, np.integer))
                                    or n_positions < 1):
        raise TaskOptionError(f"n_positions must be a whole number of at least 1, got {n_positions!r}",
                              "pass the model's learned positions, or None where it has no such table")
    length = (bos_id is not None) + 2 * int(seg_len)
    if n_positions is not None and length > n_positions:
        most = (n_positions - (bos_id is not None)) // 2
        raise TaskOptionError(
            f"a repeated segment of {seg_len} tokens (--seg-len, seg_len=) makes sequences of {length} tokens, more "
            f"than the model's {n_positions} positions",
            f"lower --seg-len (seg_len=) to {most} or less" if most >= 2 else
            "use a model with more positions: a segment of 2 tokens, the least that shows induction, does not fit",
        )
    excluded = {int(i) for i in exclude_ids}
    if bos_id is not None:
        excluded.add(int(bos_id))
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64),
                           np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
    if allowed.size < seg_len:
        raise TaskOptionError(  # the special tokens are excluded by mechkit, not the user: only the length is theirs
            f"a repeated segment of {seg_len} tokens (--seg-len, seg_len=) needs {seg_len} distinct token ids, and "
            f"this vocabulary has {allowed.size} once its special tokens are left out",
            f"lower --seg-len (seg_len=) to {allowed.size} or less",
        )
    rng = np.random.default_rng(seed)
    segment = np.stack([rng.choice(allowed, size=seg_len, replace=False) for _ in range(n_seqs)])
    tokens = np.concatenate([segment, segment], axis=1)
    if bos_id is not None:
        tokens = np.concatenate([np.full((n_seqs, 1), bos_id, dtype=np.int64), tokens], axis=1)
    return tokens.astype(np.int64, copy=False)


class RepeatTokensTask:
    """Registry entry for ``repeat-tokens``: listed and described, but built with token ids."""

    id = "repeat-tokens"
    letter = None
    name = "Repeated random tokens"
    kind = "tokens"
    description = "random token ids repeated twice; induction and previous-token head scores"
    example = "[BOS] t1 … tL t1 … tL"
    settings: tuple[str, ...] = ()
    default_shots = 0

    def prompts(self, n: int = 30, shots: int | None = None, seed: int = 0,
                setting: str | None = None) -> list[Prompt]:
        raise TaskOptionError(
            "'repeat-tokens' is a token-level task and has no text prompts",
            "pick a text task for --tasks (`mechkit tasks` lists them; repeat-tokens is what detect and --seg-len "
            "score heads on); from Python, mechkit.tasks.repeated_random_tokens(vocab_size, n_seqs, seg_len) "
            "gives its token ids",
        )
