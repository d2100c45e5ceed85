"""Every length a head run feeds the model, checked at once before any work: one refusal names each change.

``attention``, ``ablate`` and ``shuffle`` feed the model sequences of three lengths: the repeated segments that
score heads (``--seg-len``, ``1 + 2·seg_len`` tokens, bounded by a learned position table), ``attention``'s
``--prompt`` (bounded by it too) and the task prompts (``--shots`` demonstrations each, bounded by the model's
context). Each was checked where it was first used, so a user told to lower ``--seg-len`` did, and was then
refused for the prompt or the shots: here they are checked together, and the one line names every change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


def check_run_lengths(handle: ModelHandle, opts: dict, seed: int, *, seg_len: bool = False,
                      prompt: bool = False) -> None:
    """Refuse, in one line naming each change, a run whose sequences do not fit the model: ``seg_len`` where the
    run makes repeated segments of ``opts["seg_len"]``, ``prompt`` where it reads ``opts["prompt"]``, and the
    task prompts of ``opts["tasks"]`` (``n``, ``shots``, ``setting``) where it has tasks (mean and resample
    ablation's reference prompts are cropped to the shortest: no longer than these)."""
    from mechkit.model.checks.token_ids import position_rows

    problems: list[tuple[str, str]] = []
    rows = position_rows(handle.model)
    if seg_len and rows is not None:
        problems += _segment_problem(opts["seg_len"], handle.bos_id is not None, rows)
    if prompt and rows is not None:
        n = int(handle.to_tokens(opts["prompt"]).shape[1])
        if n > rows:
            problems.append((f"--prompt has {n} tokens, more than the model's {rows} positions",
                             f"pass a prompt of at most {rows} tokens (--prompt, prompt=)"))
    limit = handle.context_length
    if opts.get("tasks") and limit is not None:
        problems += _shots_problem(lambda k: _longest(handle, opts, seed, k), opts["shots"], limit)
    if problems:
        raise MechkitError("; ".join(p for p, _ in problems), " and ".join(f for _, f in problems))


def _segment_problem(seg_len: int, bos: bool, rows: int) -> list[tuple[str, str]]:
    """The repeated segments past a learned position table (as :func:`mechkit.tasks.repeated_random_tokens`
    says it), with the largest ``--seg-len`` that fits."""
    length = bos + 2 * seg_len
    if length <= rows:
        return []
    most = (rows - bos) // 2
    fix = f"lower --seg-len (seg_len=) to {most} or less" if most >= 2 else \
        "use a model with more positions (a segment of 2 tokens, the least that shows induction, does not fit)"
    return [(f"a repeated segment of {seg_len} tokens (--seg-len, seg_len=) makes sequences of {length} tokens, "
             f"more than the model's {rows} positions", fix)]


def _shots_problem(longest: Callable[[int], int], shots: int, limit: int) -> list[tuple[str, str]]:
    """Task prompts past the context, with the most ``--shots`` that fit (or a longer context where none do)."""
    have = longest(shots)
    if have <= limit:
        return []
    what = f"--shots {shots} makes task prompts of up to {have} tokens, more than the model's context ({limit} tokens)"
    if longest(0) > limit:
        return [(what, f"use a model with a longer context (even 0-shot prompts are {longest(0)} tokens)")]
    low, high = 0, shots  # longest(low) fits, longest(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if longest(mid) <= limit else (low, mid)
    return [(what, f"use --shots {low} (the most that fit)")]


def _longest(handle: ModelHandle, opts: dict, seed: int, shots: int) -> int:
    """The longest sequence the run scores at ``shots``: prompt, answer and terminator, as scoring encodes it."""
    from mechkit.eval.evaluation import task_prompts
    from mechkit.eval.scoring import encode_rows

    prompts = task_prompts(opts["tasks"], opts["n"], shots, seed, opts.get("setting"))
    return max(len(r.ids) for ps in prompts.values() for r in encode_rows(handle.text_tokenizer(), ps, None))
