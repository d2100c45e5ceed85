"""Choosing where a vector goes: the layer (and scale, span) that does best on dev prompts."""

from __future__ import annotations


def choose_layer(curve: dict[int, float], logprobs: dict[int, float] | None = None) -> int:
    """The best layer of a dev curve: highest accuracy, then highest log-prob, then the earliest."""
    def key(L: int) -> tuple:
        return (curve[L], (logprobs or {}).get(L, 0.0), -L)

    return max(curve, key=key)


