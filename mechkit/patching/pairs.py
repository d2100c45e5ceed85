"""Clean/corrupted prompt pairs with two single-token answers: what a patching run compares.

- **IOI with the name swapped** (as in TransformerLens' exploratory analysis of Wang et al.'s task): the
  corrupted sentence repeats the indirect object instead of the subject, so the right answer becomes the
  subject and ``logit(IO) − logit(S)`` flips sign; both sentences have the same tokens but one. The names
  are compared at their first differing token (the whole name where it is one token; on a byte-level
  tokenizer, the pairs whose names have equal token counts line up).
- **An ICL task with its demonstrations' labels shuffled**: the same inputs, outputs and query, but no
  demonstration maps its input to its own output any more, so the prompt no longer shows the task, only
  its format. The answers compared are the query's first answer token and the first token of the query
  copied unchanged (what a model that has not found the task tends to write), at their first differing
  token (the tokens they share before it are appended to both prompts). Pairs whose answers no token
  tells apart, or whose corrupted prompt tokenizes to another length, are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError
from mechkit.patching.answers import answer_id

if TYPE_CHECKING:
    import torch

    from mechkit.model.handle import ModelHandle


_ICL_KINDS = ("simple", "composite", "logic", "logic-composite")


@dataclass(frozen=True)
class PromptPair:
    """A clean and a corrupted text, the clean answer (``correct``) and the competing one (``wrong``)."""

    clean: str
    corrupted: str
    correct: str
    wrong: str
    first_token: bool = False  # compare the answers' first tokens (ICL answers are often several tokens)
    shuffled_labels: bool = False  # an ICL pair: the prompts may differ only inside demonstration labels


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
        # first tokens: a tokenizer that spells names in several tokens (a byte-level one) still gets pairs,
        # those whose names have equal token counts; where names are single tokens nothing changes
        pairs.append(PromptPair(q.text, head + io + tail, q.answer, q.distractor, first_token=True))
    return pairs


def _first_differing(handle: ModelHandle, clean, corrupted, pair: PromptPair):
    """The answers' first differing tokens, the tokens they share before it appended to both prompts (a
    byte-level tokenizer spells the leading space alone; SmolLM2 shares `` destroy`` of ``destroyed``)."""
    import torch

    a, b = (handle.tokenizer(t, add_special_tokens=False)["input_ids"] for t in (pair.correct, pair.wrong))
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if k >= min(len(a), len(b)):
        raise MechkitError(f"the answer {pair.wrong!r} is a prefix of {pair.correct!r} (or the reverse): no token "
                           "tells them apart", "give two answers that differ within their tokens")
    shared = torch.tensor([a[:k]], dtype=clean.dtype, device=clean.device)
    return torch.cat([clean, shared], 1), torch.cat([corrupted, shared], 1), a[k], b[k]


def icl_pairs(task: str, n: int, seed: int = 0, shots: int | None = None, tokenizer=None) -> list[PromptPair]:
    """``n`` prompts of an ICL task and their corruptions: every demonstration's label moved to another
    demonstration whose own label differs (a derangement of the outputs).

    With ``tokenizer``, a label only moves to a label of the same length in tokens, and a demonstration
    with no such partner in its prompt takes another example's label of that length, so the two prompts
    line up token by token (a patch at position p must read the same role in both); :func:`aligned`
    checks that they do.

    >>> p = icl_pairs("capitalize", 1, shots=3)[0]
    >>> p.clean.endswith(p.corrupted.rsplit("input:", 1)[1]), p.clean != p.corrupted
    (True, True)
    """
    from mechkit.tasks import build_prompts
    from mechkit.tasks.prompt import stream_rng

    rng = stream_rng(seed, "patch-pairs", task)
    prompts = build_prompts(task, n=n, shots=shots, seed=seed)
    length = (lambda text: len(tokenizer(" " + text, add_special_tokens=False)["input_ids"])) if tokenizer else (lambda _t: 0)
    pool: dict[int, list[str]] = {}
    for q in prompts:
        for _, out in _demos(q.text)[0]:
            pool.setdefault(length(out), []).append(out)
    pairs = []
    for q in prompts:
        split, query = _demos(q.text)
        if len(split) < 2 or len({out for _, out in split}) < 2:
            raise MechkitError(f"{task!r} prompts have fewer than two distinct demonstration labels to shuffle",
                               "use --shots 2 or more, or another task")
        labels = _relabel([out for _, out in split], length, pool, rng)
        corrupted = "".join(f"input: {inp}\noutput: {out}\n" for (inp, _), out in zip(split, labels, strict=True))
        pairs.append(PromptPair(q.text, corrupted + "input: " + query, q.answer, " " + q.query, first_token=True,
                                shuffled_labels=True))
    return pairs


def _demos(text: str) -> tuple[list[tuple[str, str]], str]:
    """``([(input, output), ...], query)`` of an ``input: X\noutput: Y\n`` prompt."""
    *demos, query = text.split("input: ")[1:]
    return [tuple(d[:-1].split("\noutput: ", 1)) for d in demos], query


def _relabel(labels: list[str], length, pool: dict[int, list[str]], rng) -> list[str]:
    """Each label replaced by one of the same ``length`` that differs from it: a derangement within each
    length group of the prompt, else another example's label of that length."""
    out = list(labels)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(length(label), []).append(i)
    for size, idx in groups.items():
        order = _derangement(len(idx), rng, [labels[i] for i in idx])
        for i, j in zip(idx, order, strict=True):
            out[i] = labels[idx[j]]
        for i in idx:
            if out[i] == labels[i]:  # nobody in this prompt to swap with: another example's label
                others = [label for label in pool.get(size, []) if label != labels[i]]
                if others:
                    out[i] = rng.choice(others)
    return out


def _derangement(n: int, rng, labels: list[str]) -> list[int]:
    """A permutation moving every label to a demonstration whose own label differs (where one exists)."""
    best = list(range(n))
    for _ in range(100):
        order = list(range(n))
        rng.shuffle(order)
        moved = sum(labels[j] != labels[i] for i, j in enumerate(order))
        if moved > sum(labels[j] != labels[i] for i, j in enumerate(best)):
            best = order
        if moved == n:
            break
    return best


def _lines_up(handle: ModelHandle, pair: PromptPair) -> bool:
    """True when the two prompts differ only inside demonstration labels, token by token (an ICL pair)."""
    import re

    tok = handle.tokenizer
    if not getattr(tok, "is_fast", False):  # a Python tokenizer gives no offsets: compare the lengths only
        return len(tok(pair.clean, add_special_tokens=False)["input_ids"]) == \
            len(tok(pair.corrupted, add_special_tokens=False)["input_ids"])
    a = tok(pair.clean, return_offsets_mapping=True, add_special_tokens=False)
    b = tok(pair.corrupted, add_special_tokens=False)["input_ids"]
    if len(a["input_ids"]) != len(b):
        return False
    spans = [(m.start(1) - 1, m.end(1)) for m in re.finditer(r"output: ([^\n]*)\n", pair.clean)]
    return all(any(lo <= start and end <= hi for lo, hi in spans)
               for x, y, (start, end) in zip(a["input_ids"], b, a["offset_mapping"], strict=True) if x != y)


def check_pair_task(task: str) -> None:
    """Refuse, before any model loads, a task that gives no prompt pairs (neither ioi nor an ICL task)."""
    from mechkit.tasks import get_task

    kind = get_task(task).kind  # an unknown id is refused here, with close matches
    if task != "ioi" and kind not in _ICL_KINDS:
        raise MechkitError(f"task {task!r} ({kind}) has no prompt pairs to patch",
                           "use ioi, an ICL task (`mechkit tasks`), or --clean/--corrupted/--answers")


def task_pairs(task: str, n: int, seed: int = 0, shots: int | None = None, tokenizer=None) -> list[PromptPair]:
    """``n`` pairs of ``task``: IOI's name swap, or an ICL task's shuffled labels (see :func:`icl_pairs`)."""
    check_pair_task(task)
    return ioi_pairs(n, seed) if task == "ioi" else icl_pairs(task, n, seed, shots, tokenizer)


def aligned(handle: ModelHandle, pairs: list[PromptPair], strict: bool = False) -> list[tuple[PromptPair, tuple]]:
    """Each pair with its :func:`tokens`, keeping only pairs that can be patched position by position and
    whose two answers differ: the rest are skipped, not refused (a task's prompts vary), unless ``strict``
    (the user's own pair), or none is left."""
    handle.text_tokenizer()  # a model without a tokenizer: its own line, not "no pair could be patched"
    kept, last = [], None
    for pair in pairs:
        try:
            toks = tokens(handle, pair)
        except MechkitError as err:
            if strict:
                raise
            last = err
            continue
        if pair.shuffled_labels and not _lines_up(handle, pair):
            last = MechkitError("the corrupted prompt does not line up with the clean one token by token",
                                "labels of other lengths in tokens")
            continue
        if toks[2] == toks[3]:
            last = MechkitError(f"the answers {pair.correct!r} and {pair.wrong!r} are the same token",
                                "give two different answers")
            if strict:
                raise last
            continue
        kept.append((pair, toks))
    if not kept:
        icl = any(p.shuffled_labels for p in pairs)  # --shots shapes ICL prompts only; ioi has none
        raise MechkitError(f"no prompt pair could be patched (the last: {last})",
                           "try another --task, --seed" + (" or --shots" if icl else ""))
    return kept


def tokens(handle: ModelHandle, pair: PromptPair) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``(clean ids, corrupted ids, correct id, wrong id)``, refused in one line where the answers are not
    single tokens or the prompts' lengths differ (there is no position alignment to patch along)."""
    clean, corrupted = handle.to_tokens(pair.clean), handle.to_tokens(pair.corrupted)
    if clean.shape[-1] != corrupted.shape[-1]:
        raise MechkitError(f"the clean prompt has {clean.shape[-1]} tokens and the corrupted {corrupted.shape[-1]}",
                           "give prompts of the same length in tokens (swap words of equal token counts)")
    if pair.first_token:
        return _first_differing(handle, clean, corrupted, pair)
    return clean, corrupted, answer_id(handle, pair.correct), answer_id(handle, pair.wrong)
