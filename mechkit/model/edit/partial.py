"""Run a model from the middle: reuse a clean forward's prefix for layer-L interventions.

An intervention at layer L leaves layers below L unchanged, so an ablation sweep need not
recompute them. :func:`capture_block_inputs` records what every block received in a clean
forward (hidden states plus the exact keyword arguments the model passed: masks, rotary
embeddings, positions — whatever the family uses), and :func:`run_from` replays blocks L… on a
given hidden state, then the final norm and unembedding at the positions asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass
class BlockInputs:
    """Per block: the hidden state it received and the other arguments it was called with."""

    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    args: dict[int, tuple] = field(default_factory=dict)
    kwargs: dict[int, dict] = field(default_factory=dict)


@contextlib.contextmanager
def capture_block_inputs(handle: ModelHandle) -> Iterator[BlockInputs]:
    """Record every block's inputs during the forward passes run inside the context."""
    captured = BlockInputs()
    removers = []

    def make(layer: int):
        def pre(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured.hidden[layer] = hidden.detach()
            captured.args[layer] = args[1:]
            captured.kwargs[layer] = {k: v for k, v in kwargs.items() if k != "hidden_states"}

        return pre

    try:
        for layer, block in enumerate(handle.anatomy.layers):
            removers.append(block.register_forward_pre_hook(make(layer), with_kwargs=True))
        yield captured
    finally:
        for r in removers:
            r.remove()


def unembed(handle: ModelHandle, hidden: torch.Tensor) -> torch.Tensor:
    a = handle.anatomy
    if a.final_norm is not None:
        hidden = a.final_norm(hidden)
    logits = handle.model.get_submodule(a.family.unembed)(hidden)
    cap = getattr(handle.model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def run_from(
    handle: ModelHandle, layer: int, inputs: BlockInputs, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits from running blocks ``layer``… on the captured input of block ``layer``.

    Hooks attached to those blocks fire as usual. ``positions`` (1-D) restricts the unembedding
    to those sequence positions. On a dispatched model each block's accelerate hook moves what it
    is given to the block's device (and loads offloaded weights); the logits come back on
    ``handle.device``, as a full forward's do.
    """
    if "module_calls" not in handle.backend.serves:
        from mechkit.errors import MechkitError

        raise MechkitError(f"the {handle.backend.describe()} backend runs whole forwards only, not blocks one by one",
                           "run this analysis with --backend native")
    hidden = inputs.hidden[layer]
    for index in range(layer, handle.anatomy.n_layers):
        out = handle.anatomy.layers[index](hidden, *inputs.args[index], **inputs.kwargs[index])
        hidden = out[0] if isinstance(out, tuple) else out
    if positions is not None:
        hidden = hidden[:, positions.to(hidden.device)]
    return unembed(handle, hidden).to(handle.device)
