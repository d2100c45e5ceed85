"""Answer tokens and the metrics patching measures with them.

Each metric reads the logits at the answer position, ``[batch, vocab]``, and gives one value per row.
:func:`normalized_recovery` is ``(patched − corrupted) / (clean − corrupted)``: 0 where the patch
restores nothing, 1 where it restores the clean run's value (Wang et al. 2022's normalisation).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
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


_REAL = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16,
         torch.int32, torch.int64}


def _unreal(tensor: torch.Tensor) -> str:
    """What makes ``tensor`` no plain grid of real numbers ("" if nothing): a meta tensor has no values, True
    was read as 1, a complex part was dropped with a mere warning, and float8, sparse and nested tensors lack
    the operations (torch's raw NotImplementedError)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.is_meta:
        return f"meta {dtype}"
    if getattr(tensor, "is_nested", False) or tensor.layout != torch.strided:
        return f"{'nested' if getattr(tensor, 'is_nested', False) else str(tensor.layout).removeprefix('torch.')} {dtype}"
    return "" if tensor.dtype in _REAL else dtype


def _one_number(value: Any, name: str) -> float:
    """``value`` (a Python or NumPy number, or a tensor or array of one element) as a finite float, refused in
    one line otherwise: a tensor of several values raised torch's raw RuntimeError, a NaN gave NaN silently."""
    fix = f"pass {name} as one number" + (", the unpatched run's metric (e.g. float(metric(logits)[0]))"
                                          if name != "patched" else " or a tensor of them")
    shape = getattr(value, "shape", None)  # a tensor or a NumPy array
    if shape is not None and math.prod(shape) != 1:
        raise MechkitError(f"normalized_recovery: {name} has shape {list(shape)}, not one number", fix)
    if isinstance(value, torch.Tensor) and _unreal(value) and not (value.dtype == torch.bool or value.is_complex()):
        # .item() raised torch's raw RuntimeError (meta); a bool or complex item is named below
        raise MechkitError(f"normalized_recovery: {name} is a {_unreal(value)} tensor, not a number", fix)
    if shape is not None:
        value = value.item()
    if isinstance(value, bool | str | bytes) or not hasattr(value, "__float__"):
        raise MechkitError(f"normalized_recovery: {name} is {type(value).__name__}, not a number", fix)
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):  # 10**400: "int too large to convert to float"
        raise MechkitError(f"normalized_recovery: {name} ({str(value)[:40]}) is not a number a float holds", fix) from None
    if not math.isfinite(number):
        raise MechkitError(f"normalized_recovery: {name} is {number}", "check the run that gave it: its metric is "
                           "not a finite number (NaN or inf logits)")
    return number


def normalized_recovery(patched: torch.Tensor | float, clean: float | torch.Tensor,
                        corrupted: float | torch.Tensor) -> torch.Tensor | float:
    """``(patched − corrupted) / (clean − corrupted)``; refused where clean and corrupted agree (nothing to recover).

    ``clean`` and ``corrupted`` are one number each (a Python or NumPy number, or a one-element tensor);
    ``patched`` is a number or a tensor of them (a scan's grid), and the result has its type. A NaN or
    infinite input is refused: it made every recovery NaN without a word.

    >>> normalized_recovery(2.0, clean=3.0, corrupted=-1.0)
    0.75
    >>> normalized_recovery(torch.tensor([3.0, -1.0]), clean=torch.tensor(3.0), corrupted=-1)
    tensor([1., 0.])
    """
    exact = [v.item() if isinstance(v, torch.Tensor | np.ndarray | np.generic) and math.prod(getattr(v, "shape", ())) == 1
             and not getattr(v, "is_meta", False) else v for v in (clean, corrupted)]
    clean, corrupted = _one_number(clean, "clean"), _one_number(corrupted, "corrupted")
    gap = clean - corrupted
    if all(isinstance(v, int) and not isinstance(v, bool) for v in exact) and exact[0] != exact[1]:
        try:
            gap = float(exact[0] - exact[1])  # 2**62 + 2 and 2**62: a float holds neither exactly, the gap (2) it does
        except OverflowError:
            gap = math.inf  # refused just below
    if not math.isfinite(gap):  # 1e308 and -1e308: every recovery came out 0 (or NaN) without a word
        raise MechkitError(f"normalized_recovery: clean − corrupted ({clean:.4g} − {corrupted:.4g}) overflows a float",
                           "check the runs that gave them: a metric this large is not a logit difference")
    if abs(gap) < 1e-6:
        raise MechkitError(f"the clean and corrupted runs give the same metric (clean {clean:.4g}, corrupted "
                           f"{corrupted:.4g}: a gap under 1e-6)", "choose a corruption that changes the answer, or "
                           "scale a metric of probabilities up (log-probabilities or logit differences)")
    if isinstance(patched, torch.Tensor):
        kind = _unreal(patched)
        if kind:
            convert = (".dequantize()" if patched.is_quantized else ".to_padded_tensor(0.0).float()" if kind.startswith(
                "nested") else ".to_dense().float()" if patched.layout != torch.strided else ".float()")
            raise MechkitError(f"normalized_recovery: patched is a {kind} tensor, not real numbers",
                               f"pass patched as the metric's real values, a dense float tensor (patched{convert})")
        if not bool(torch.isfinite(patched).all()):
            raise MechkitError(f"normalized_recovery: patched holds {int((~torch.isfinite(patched)).sum())} NaN or "
                               "infinite value(s)", "check the patched runs: their metric is not finite there "
                               "(NaN or inf logits)")
        if not patched.is_floating_point():
            if isinstance(exact[1], int) and patched.numel() <= _EXACT_MAX:
                # whole numbers: each subtracted exactly as a Python int, then divided (float32 lost 2**62 + 1's 1,
                # and an int64 subtraction wrapped around)
                values = [_exact_ratio(int(v) - exact[1], gap) for v in patched.reshape(-1).tolist()]
                return _finite(torch.tensor(values, dtype=torch.float64).reshape(patched.shape).float())
            return _finite((patched.double() - corrupted) / gap).float()
        # In float32 at least, back in patched's dtype: a float16 patched minus a corrupted of 1e5 was inf.
        wide = patched.dtype if torch.finfo(patched.dtype).bits >= 32 else torch.float32
        return _finite(((patched.to(wide) - corrupted) / gap).to(patched.dtype))
    number = _one_number(patched, "patched")  # checked first: 10**400 is one line
    whole = patched.item() if isinstance(patched, np.generic) else patched  # an np.int64 as the int it holds
    if isinstance(whole, int) and not isinstance(whole, bool) and isinstance(exact[1], int):
        return _finite(_exact_ratio(whole - exact[1], gap))  # subtracted exactly, as for a grid of them
    return _finite((number - corrupted) / gap)


_EXACT_MAX = 1_000_000  # whole-number grids up to this size are subtracted exactly (a scan's grid is far smaller)


def _exact_ratio(difference: int, gap: float) -> float:
    """``difference / gap``, or one line where the difference is past what a float holds (10**308 − (−10**308))."""
    try:
        return difference / gap
    except OverflowError:
        raise MechkitError("normalized_recovery: patched − corrupted is past what a float holds",
                           "check the runs that gave them: a metric this large is not a logit difference") from None


def _finite(recovery: Any) -> Any:
    """``recovery`` where every value is finite, else one line: a recovery past the largest number its type
    holds (a float16 patched of 6e4 over a gap of 1e-3, a float of 1e308) came out inf without a word."""
    bad = (~torch.isfinite(recovery)).any() if isinstance(recovery, torch.Tensor) else not math.isfinite(recovery)
    if bad:
        dtype = str(recovery.dtype).removeprefix("torch.") if isinstance(recovery, torch.Tensor) else "float"
        raise MechkitError(f"normalized_recovery: (patched − corrupted) / (clean − corrupted) overflows {dtype}",
                           "check the runs that gave them (a gap this small against values this large is no "
                           "logit difference), or pass patched as float32 or float64")
    return recovery
