"""The gradient promise: mechkit's forwards build no autograd graph unless the caller asks for one.

A forward through a :class:`~mechkit.model.handle.ModelHandle` (``m(tokens)``, ``m.forward``, and so
every recording, ablation and analysis built on them) runs without grad, so its logits plot, convert
to numpy and cost no graph memory. torch's own ``torch.enable_grad()`` cannot serve as the request:
grad mode is on by default, so inside that block torch's state looks exactly as it does outside it.
The request is :func:`enable_grad` instead, which :func:`mechkit.gradients` and the training code use
themselves; ``torch.no_grad()`` inside it still turns grad off.

Training code (fine-tunes, the toy model's training) turns grad on itself, so it also works when the
caller runs it under a global ``torch.no_grad()``.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> m(m.to_tokens("hi")).requires_grad
False
>>> with mk.enable_grad():
...     m(m.to_tokens("hi")).requires_grad
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from mechkit.errors import single_use

_REQUESTED: ContextVar[bool] = ContextVar("mechkit_grad_requested", default=False)


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def enable_grad() -> Iterator[None]:
    """Forwards through mechkit build an autograd graph inside this block (also under an outer
    ``torch.no_grad()``); usable as a decorator too. Outside it they run without grad."""
    import torch

    token = _REQUESTED.set(True)
    try:
        with torch.enable_grad():
            yield
    finally:
        _REQUESTED.reset(token)


def grad_requested() -> bool:
    """Whether a forward here should build a graph: inside :func:`enable_grad`, with torch's grad mode on."""
    import torch

    return _REQUESTED.get() and torch.is_grad_enabled()


def forward_grad_mode() -> contextlib.AbstractContextManager:
    """The grad mode one mechkit forward runs in (:func:`grad_requested`)."""
    import torch

    return torch.set_grad_enabled(grad_requested())


__all__ = ["enable_grad", "forward_grad_mode", "grad_requested"]
