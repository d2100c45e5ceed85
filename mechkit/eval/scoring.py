"""Batched, teacher-forced exact-match scoring that equals greedy decoding's exact match.

A prompt counts as correct when greedy decoding would write the answer followed by its terminator
(``"\n"``, the end of an ``output:`` line). One teacher-forced forward pass decides almost every
prompt: if the argmax at every answer position equals the answer token, greedy decoding emits
exactly those tokens. A model may also spell the right text with other tokens (`` L|AD|Y|B|UG``
instead of the canonical `` L|AD|Y|BUG``); only when the first mismatching argmax token is itself a
prefix of the remaining answer text is that prompt decoded greedily to settle it. So the accuracy
is identical to string-level greedy exact match (a test checks it prompt by prompt on the embedded
model) at one forward pass per batch plus a few short decodes.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import MechkitError
from mechkit.model.compat import cache_kwargs, cache_of

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass
class Encoded:
    """One scored sequence: prompt+answer ids and where the answer starts."""

    ids: list[int]
    answer_start: int
    prompt_index: int
    continuation: str = ""
    distractor: int | None = None  # first token of a competing answer (IOI's subject), for logit difference
    demos: int | None = None  # demonstrations in the prompt (:func:`demonstrations`): whether fewer --shots shorten it
    zero_shot: int | None = None  # tokens of the same row without its demonstrations: whether 0 --shots would fit
    text: str | None = None  # the prompt: a refusal measures its demonstrations (:func:`demo_tokens`)


@dataclass
class TaskScore:
    """Accuracy (exact match) and mean per-token log-probability of the answer."""

    accuracy: float
    logprob: float
    correct: list[bool] = field(repr=False)
    logprobs: list[float] = field(repr=False)
    decoded: int = 0  # prompts that needed a greedy decode (the model spelled the answer its own way)
    logit_diff: float | None = None  # mean logit(answer) − logit(distractor), first tokens (IOI)

    def as_dict(self) -> dict:
        out = {"accuracy": self.accuracy, "logprob": self.logprob, "n": len(self.correct)}
        if self.logit_diff is not None:
            out["logit_diff"] = self.logit_diff
        return out


def encode(tokenizer: Any, prompt: str, answer: str, terminator: str = "\n") -> tuple[list[int], int]:
    """Token ids of ``prompt + answer + terminator`` and the index of the first answer token.

    The whole text is tokenized at once so the answer gets the tokenization the model would see;
    if a token straddles the prompt/answer boundary the two are tokenized separately instead.
    """
    full = prompt + answer + terminator
    enc = tokenizer(full, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    cut = len(prompt)
    start = next((i for i, (s, e) in enumerate(offsets) if s >= cut and e > s), len(ids))
    straddles = any(s < cut < e for s, e in offsets)
    if not straddles and start < len(ids):
        return ids, start
    head = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    tail = tokenizer(answer + terminator, add_special_tokens=False)["input_ids"]
    return head + tail, len(head)


def _terminator(prompt, default: str | None) -> str:
    """The prompt's own terminator (``"\n"`` after ``output:``, ``""`` for IOI) unless overridden."""
    return default if default is not None else getattr(prompt, "terminator", "\n")


def encode_rows(tokenizer, prompts: Sequence, terminator: str | None) -> list[Encoded]:
    """One scored sequence per prompt and accepted answer (several for prompts with alternatives)."""
    rows = []
    for i, p in enumerate(prompts):
        for answer in getattr(p, "accepted", None) or (p.answer,):
            end = _terminator(p, terminator)
            ids, start = encode(tokenizer, p.text, answer, end)
            rival = getattr(p, "distractor", None)
            rival_id = None
            if rival:
                rival_ids, rival_start = encode(tokenizer, p.text, rival, "")
                rival_id = rival_ids[rival_start]
            demos = demonstrations(p.text)
            bare = len(encode(tokenizer, query_only(p.text), answer, end)[0]) if demos else len(ids)
            rows.append(Encoded(ids, start, i, answer + end, rival_id, demos, bare, p.text))
    return rows


def query_only(text: str) -> str:
    """The prompt as it would be with 0 ``--shots``: its demonstrations dropped, the lines before the first
    (an instruction) and the query kept.

    >>> query_only("input: a\\noutput: A\\ninput: b\\noutput:")
    'input: b\\noutput:'
    """
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("input: ")]
    return text if len(starts) < 2 else "\n".join(lines[:starts[0]] + lines[starts[-1]:])


def demonstrations(text: str) -> int:
    """How many ``input: X / output: Y`` demonstrations a prompt holds before its query (0 for a zero-shot or
    an IOI prompt, or text of another form): where it is 0, fewer ``--shots`` cannot shorten it.

    >>> demonstrations("input: a\\noutput: A\\ninput: b\\noutput:"), demonstrations("input: b\\noutput:")
    (1, 0)
    """
    return max(0, sum(line.startswith("input: ") for line in text.split("\n")) - 1)


_FEWEST_SHOTS: ContextVar[int] = ContextVar("mechkit_fewest_shots", default=0)


@contextlib.contextmanager
def fewest_shots(options: Sequence) -> Iterator[None]:
    """Within the block, a context refusal (:func:`context_fix`) knows the least ``--shots`` the plugin allows:
    the ``min`` of its ``shots`` option among ``options`` (a plugin's ``options``). ``icl-vectors --shots 2``
    (its minimum) was told "use fewer --shots", and ``--shots 1`` was then refused as below 2."""
    least = next((getattr(o, "min", None) for o in options if getattr(o, "name", None) == "shots"), None)
    token = _FEWEST_SHOTS.set(int(least) if isinstance(least, (int, float)) and least > 0 else 0)
    try:
        yield
    finally:
        _FEWEST_SHOTS.reset(token)


def demo_tokens(tokenizer: Any, texts: Sequence[str | None]) -> int | None:
    """The most tokens one demonstration (an ``input:``/``output:`` pair, its newline included) of ``texts``
    holds, tokenized alone: what each demonstration kept under fewer ``--shots`` may cost (None without one).

    >>> from mechkit.model.sources.tiny import byte_tokenizer
    >>> demo_tokens(byte_tokenizer(), ["input: a\\noutput: A\\ninput: bb\\noutput: BB\\ninput: c\\noutput:"])
    21
    """
    most = None
    for text in texts:
        lines = (text or "").split("\n")
        starts = [i for i, line in enumerate(lines) if line.startswith("input: ")]
        for a, b in zip(starts, starts[1:], strict=False):
            n = len(tokenizer("\n".join(lines[a:b]) + "\n", add_special_tokens=False)["input_ids"])
            most = n if most is None else max(most, n)
    return most


def context_fix(demos: int | None, zero_shot: int | None = None, limit: int | None = None,
                per_demo: int | None = None, least: int | None = None) -> str:
    """The fix for prompts past the context, only with what can help: fewer ``--shots`` where the longest
    holds demonstrations and the prompts without them (``zero_shot`` tokens, where known) fit the context's
    ``limit``; else a longer context (or shorter prompts, which a caller from Python writes). "Fewer shots"
    for prompts whose query alone is too long was a fix that could never work. ``least``: the fewest
    ``--shots`` the command allows (by default the plugin's, :func:`fewest_shots`): where even that many do
    not fit (each demonstration up to ``per_demo`` tokens), a longer context; else the most that fit."""
    least = _FEWEST_SHOTS.get() if least is None else least
    if demos == 0:
        even = f" (even 0-shot prompts are {zero_shot} tokens)" if zero_shot is not None else ""
        return f"use a model with a longer context{even}, or shorter prompts (the longest holds no demonstrations " \
               "to drop)"
    if zero_shot is not None and limit is not None and zero_shot > limit:
        return f"use a model with a longer context (even 0-shot prompts are {zero_shot} tokens; it holds {limit})"
    if demos is None:
        return "use shorter prompts (fewer --shots, where they hold demonstrations) or a model with a longer context"
    if demos <= least:
        return f"use a model with a longer context (--shots {least} is the fewest this command allows, and its " \
               "prompts do not fit)"
    if zero_shot is not None and limit is not None and per_demo:
        most = min(demos - 1, (limit - zero_shot) // per_demo)
        cost = f"0-shot prompts are {zero_shot} tokens and a demonstration up to {per_demo}; it holds {limit}"
        if most < least:
            return f"use a model with a longer context ({cost}: not even --shots {least}, the fewest this command " \
                   "allows, fits)"
        fewer = " or fewer" if most > least else ""
        floor = f"; {least} is the fewest allowed" if least else ""
        return f"use --shots {most}{fewer}, the most that fit ({cost}{floor}), or a model with a longer context"
    fit = f"; 0-shot prompts are {zero_shot} tokens" if zero_shot is not None else ""
    floor = f" (--shots {least} is the fewest allowed)" if least else ""
    return f"use fewer --shots{floor} (the longest prompt holds {demos} demonstrations{fit}), or a model with a " \
           "longer context"


def check_context(handle: ModelHandle, longest: int, fix: str | None = None, demos: int | None = None,
                  zero_shot: int | Callable[[], int | None] | None = None,
                  per_demo: int | Callable[[], int | None] | None = None) -> None:
    """Refuse, with one line, a sequence longer than the model's context: past it positions are
    meaningless (or the forward fails), and a runaway ``--shots`` would allocate without bound. Without a
    ``fix`` the caller's own, :func:`context_fix` of the longest prompt's ``demos``, of the longest
    prompt without demonstrations (``zero_shot`` tokens) and of the longest demonstration (``per_demo``
    tokens; each a number or a function that counts it, only called on a refusal): fewer shots are
    suggested only where 0-shot prompts fit, and only as many as the command allows."""
    limit = handle.context_length
    if limit is not None and longest > limit:
        if fix is None:
            bare = zero_shot() if callable(zero_shot) else zero_shot
            each = per_demo() if callable(per_demo) else per_demo
            fix = context_fix(demos, bare, limit, each)
        raise MechkitError(f"a sequence of {longest} tokens is longer than the model's context ({limit} tokens)", fix)


def check_texts_context(handle: ModelHandle, texts: Sequence[str]) -> None:
    """:func:`check_context` for prompts forwarded as text alone (tokenized as :func:`prompt_ids` does), before
    any work: the longest, its demonstrations, the prompts' 0-shot length and their longest demonstration.
    Without them a study timing its prompts said only "shorter prompts (fewer --shots, where they hold
    demonstrations)", also to 0-shot prompts longer than the context."""
    tok = handle.text_tokenizer()
    texts = list(dict.fromkeys(texts))
    if not texts or handle.context_length is None:
        return
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    longest = max(range(len(texts)), key=lengths.__getitem__)
    check_context(handle, lengths[longest], demos=demonstrations(texts[longest]),
                  zero_shot=lambda: max(len(tok(query_only(t))["input_ids"]) for t in texts),
                  per_demo=lambda: demo_tokens(tok, texts))


def zero_shot_tokens(rows: Sequence[Encoded]) -> int | None:
    """The most tokens a row has without its demonstrations (None where no row says)."""
    known = [r.zero_shot for r in rows if r.zero_shot is not None]
    return max(known) if known else None


def supports_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def pad_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id or 0


@dataclass
class Batch:
    """Right-padded rows plus where their answers are: ``keep`` holds the positions whose logits
    predict answer tokens (union over rows); ``cols[i]`` indexes row i's answer positions in ``keep``."""

    ids: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor
    cols: list[torch.Tensor]
    targets: list[torch.Tensor]


def pad_batch(rows: Sequence[Encoded], pad: int) -> Batch:
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r.ids)] = torch.tensor(r.ids)
        mask[i, :len(r.ids)] = 1
    # Position t predicts token t+1: only the logits that predict answer tokens are needed.
    keep = sorted({t for r in rows for t in range(r.answer_start - 1, len(r.ids) - 1)})
    index = {t: j for j, t in enumerate(keep)}
    cols = [torch.tensor([index[t] for t in range(r.answer_start - 1, len(r.ids) - 1)]) for r in rows]
    targets = [torch.tensor(r.ids[r.answer_start:]) for r in rows]
    return Batch(ids, mask, torch.tensor(keep), cols, targets)


def batches(handle: ModelHandle, prompts: Sequence, batch_size: int) -> list[Batch]:
    """Every prompt's (first accepted) answer row, length-sorted and padded into batches."""
    check_batch_size(batch_size)
    rows = sorted(encode_rows(handle.text_tokenizer(), prompts, None), key=lambda r: len(r.ids))
    if rows:
        check_context(handle, len(rows[-1].ids), demos=rows[-1].demos, zero_shot=lambda: zero_shot_tokens(rows),
                      per_demo=lambda: demo_tokens(handle.text_tokenizer(), [r.text for r in rows]))
    pad = pad_id(handle.text_tokenizer())
    return [pad_batch(rows[i:i + batch_size], pad) for i in range(0, len(rows), batch_size)]


def row_metrics(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: mean answer log-prob and teacher-forced exact match, from logits at ``batch.keep``."""
    logprobs, correct = [], []
    for i, (cols, target) in enumerate(zip(batch.cols, batch.targets, strict=True)):
        row = logits[i, cols.to(logits.device)].float()
        target = target.to(logits.device)
        logprobs.append(row.log_softmax(-1).gather(-1, target[:, None]).mean())
        correct.append((row.argmax(-1) == target).all().float())
    return torch.stack(logprobs), torch.stack(correct)


def pad_right(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and each row's last real position."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r))
        mask[i, :len(r)] = 1
    return ids, mask, mask.sum(dim=1) - 1


def prompt_ids(handle: ModelHandle, prompts: Sequence) -> list[list[int]]:
    """Token ids of each prompt's text (no answer), checked against the model's context."""
    ids = [handle.text_tokenizer()(p.text)["input_ids"] for p in prompts]
    if ids:
        longest = max(range(len(ids)), key=lambda i: len(ids[i]))
        tok = handle.text_tokenizer()
        check_context(handle, len(ids[longest]), demos=demonstrations(prompts[longest].text),
                      zero_shot=lambda: max(len(tok(query_only(p.text))["input_ids"]) for p in prompts),
                      per_demo=lambda: demo_tokens(tok, [p.text for p in prompts]))
    return ids


def last_logits_only(handle: ModelHandle) -> dict:
    """Forward kwargs that unembed one position only (for passes whose hooks read activations and
    whose logits are thrown away), where the model supports ``logits_to_keep``."""
    return {"logits_to_keep": 1} if supports_logits_to_keep(handle.model) else {}


def forward_kept(handle: ModelHandle, batch: Batch) -> torch.Tensor:
    """Logits at ``batch.keep`` only (``[rows, len(keep), vocab]``), unembedding nothing else where
    the model supports ``logits_to_keep``."""
    ids, mask = batch.ids.to(handle.device), batch.mask.to(handle.device)
    keep = batch.keep.to(handle.device)
    if supports_logits_to_keep(handle.model):
        return handle(ids, attention_mask=mask, logits_to_keep=keep)
    return handle(ids, attention_mask=mask)[:, keep]


def score_batch(handle: ModelHandle, rows: list[Encoded], pad: int) -> list[tuple]:
    """Per row: teacher-forced match, mean log-prob, first mismatch offset (-1 if none), argmax there,
    and the logit difference answer − distractor at the first answer position (None without one)."""
    batch = pad_batch(rows, pad)
    logits = forward_kept(handle, batch).float()
    out = []
    for i, r in enumerate(rows):
        cols, target = batch.cols[i].to(logits.device), batch.targets[i].to(logits.device)
        row = logits[i, cols]
        pred = row.argmax(-1)
        wrong = (pred != target).nonzero()
        first = int(wrong[0]) if len(wrong) else -1
        logprob = row.log_softmax(-1).gather(-1, target[:, None]).mean().item()
        diff = None if r.distractor is None else float(row[0, target[0]] - row[0, r.distractor])
        out.append((first < 0, logprob, first, int(pred[first]) if first >= 0 else -1, diff))
    return out


def maybe_other_spelling(tokenizer, row: Encoded, first: int, pred: int) -> bool:
    """Could greedy decoding still write the answer text, with the model's own tokenization?"""
    done = tokenizer.decode(row.ids[row.answer_start:row.answer_start + first])
    rest = row.continuation[len(done):] if row.continuation.startswith(done) else None
    piece = tokenizer.decode([pred])
    return bool(rest) and bool(piece) and rest.startswith(piece)


def greedy_writes(handle: ModelHandle, row: Encoded) -> bool:
    """Decode greedily after the prompt; stop as soon as the text leaves answer + terminator.

    Greedy decoding reproduces the canonical answer tokens up to the first mismatch, so decoding
    starts there (one cached prefill), and most wrong answers are settled after a step or two.
    """
    tok = handle.text_tokenizer()
    start = row.answer_start
    ids = torch.tensor([row.ids[:start]], device=handle.device)
    out = handle.forward(ids, use_cache=True)  # through the backend: its hook functions apply to every step
    written: list[int] = []
    for _ in range(len(row.continuation) + 1):  # a token writes at least one character
        nxt = int(out.logits[0, -1].argmax())
        written.append(nxt)
        text = tok.decode(written)
        if text.startswith(row.continuation):
            return True
        if not row.continuation.startswith(text):
            return False
        out = handle.forward(torch.tensor([[nxt]], device=handle.device), **cache_kwargs(cache_of(out)),
                             use_cache=True)
    return False


def score_rows(handle: ModelHandle, rows: Sequence[Encoded], batch_size: int = 16,
               prepare: Callable[[list[int]], None] | None = None) -> tuple[list[tuple], int]:
    """Score encoded rows in length-sorted batches: per row ``(correct, logprob, logit_diff)``, and
    how many rows needed a greedy decode.

    ``prepare(indices)`` runs before every forward over ``rows[indices]`` (a batch, or one row for
    its greedy check): the hook for callers that edit each row differently (activation vectors).
    """
    tok = handle.text_tokenizer()
    pad = pad_id(tok)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
    if rows:
        check_context(handle, len(rows[order[-1]].ids), demos=rows[order[-1]].demos,
                      zero_shot=lambda: zero_shot_tokens(rows), per_demo=lambda: demo_tokens(tok, [r.text for r in rows]))
    out: list[tuple] = [()] * len(rows)
    decoded = 0
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            if prepare is not None:
                prepare(idx)
            for i, (ok, logprob, first, pred, diff) in zip(idx, score_batch(handle, [rows[i] for i in idx], pad),
                                                           strict=True):
                if not ok and maybe_other_spelling(tok, rows[i], first, pred):
                    if prepare is not None:
                        prepare([i])
                    ok, decoded = greedy_writes(handle, rows[i]), decoded + 1
                out[i] = (ok, logprob, diff)
    return out, decoded


def aggregate(n_prompts: int, rows: Sequence[Encoded], scored: Sequence[tuple], decoded: int = 0) -> TaskScore:
    """One :class:`TaskScore` from scored rows: a prompt is correct when any of its accepted answers
    is, its log-prob is the best one, its logit difference that of its first row."""
    correct = [False] * n_prompts
    logprobs = [float("-inf")] * n_prompts
    diffs: dict[int, float] = {}
    for row, (ok, lp, diff) in zip(rows, scored, strict=True):
        correct[row.prompt_index] |= ok
        logprobs[row.prompt_index] = max(logprobs[row.prompt_index], lp)
        if diff is not None:
            diffs.setdefault(row.prompt_index, diff)
    n = max(n_prompts, 1)
    logit_diff = sum(diffs.values()) / len(diffs) if diffs else None
    return TaskScore(sum(correct) / n, sum(logprobs) / n, correct, logprobs, decoded, logit_diff)


def score_prompts(
    handle: ModelHandle, prompts: Sequence, batch_size: int = 16, terminator: str | None = None
) -> TaskScore:
    """Exact-match accuracy and mean answer log-probability over ``prompts``.

    Prompts with several accepted answers count as correct when any of them matches; their
    log-probability is the best one.
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.score_prompts")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise MechkitError(f"mk.score_prompts takes a list of prompts, not {type(prompts).__name__}",
                           "pass prompts from mk.build_prompts(task, n=...)")
    if not prompts:
        raise MechkitError("no prompts to score", "pass at least one prompt (mk.build_prompts(task, n=...))")
    odd = next((p for p in prompts if not (isinstance(getattr(p, "text", None), str)
                                           and isinstance(getattr(p, "answer", None), str))), None)
    if odd is not None:
        raise MechkitError(f"mk.score_prompts: {type(odd).__name__} {odd!r}"[:120] + " is not a prompt (text and answer)",
                           "pass prompts from mk.build_prompts(task, n=...), or objects with .text and .answer strings")
    if terminator is not None and not isinstance(terminator, str):
        raise MechkitError(f"terminator must be text or None, not {terminator!r}",
                           "pass terminator=\"\\n\" (or leave it out for each prompt's own)")
    check_batch_size(batch_size)
    rows = encode_rows(handle.text_tokenizer(), prompts, terminator)
    scored, decoded = score_rows(handle, rows, batch_size)
    return aggregate(len(prompts), rows, scored, decoded)


def check_batch_size(batch_size: int) -> None:
    """A batch size must be a whole number ≥ 1 (one line otherwise, never ``range()``'s error)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MechkitError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}", "pass batch_size=16")


def greedy_exact_match(handle: ModelHandle, prompts: Sequence, terminator: str | None = None) -> list[bool]:
    """Reference: greedy-decode each prompt on its own and compare text (slow; for checks).

    Correct when the decoded text begins with an accepted answer followed by the terminator.
    """
    tok = handle.text_tokenizer()
    out = []
    with torch.no_grad():
        for p in prompts:
            end = _terminator(p, terminator)
            answers = getattr(p, "accepted", None) or (p.answer,)
            # Enough tokens to spell the longest answer even one character per token.
            budget = max(len(a + end) for a in answers) + 1
            ids = torch.tensor([tok(p.text)["input_ids"]], device=handle.device)
            gen = handle.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                        do_sample=False, pad_token_id=tok.pad_token_id or 0)
            text = tok.decode(gen[0, ids.shape[1]:])
            out.append(any(text.startswith(a + end) for a in answers))
    return out
