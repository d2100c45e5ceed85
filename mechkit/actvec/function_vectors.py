"""Function vectors (Todd et al., 2024, "Function Vectors in Large Language Models").

1. :func:`mean_head_outputs` — every head's output (``blocks.L.attn.hook_z``) at the last token,
   averaged over clean ICL prompts: ``ā[L, h]``.
2. :func:`indirect_effects` — on *shuffled-label* prompts (:mod:`mechkit.tasks.shuffled`), how much
   replacing one head's last-token output with ``ā[L, h]`` raises P(correct first answer token).
   Its mean over prompts is the head's average indirect effect (AIE; Todd's CIE averaged).
3. :func:`function_vector` — the sum over the top-k heads of ``ā[L, h]`` projected through that
   head's slice of the attention output projection: the head's contribution to the residual
   stream. It is *added* at one layer's last token (:class:`mechkit.actvec.ResidEdit`); the top-k
   heads are :func:`mechkit.model.headspec.top_heads` of the indirect effects.

Only the last token is patched, and a causal model's earlier positions do not see it, so the
indirect effects reuse one cached prefix per prompt and batch every head as a one-token forward:
about one full forward plus ``n_heads × n_layers`` one-token rows per prompt. On the nnsight backend
each row runs the whole prompt instead: a cache would travel to the server and back with every trace
(and names transformers' cache class, which NDIF's whitelist refuses: :mod:`mechkit.model.backends.whitelist`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from einops import rearrange

from mechkit.eval.scoring import encode, last_logits_only, pad_id, pad_right, prompt_ids
from mechkit.hooking.core import hooks
from mechkit.hooking.traced import pure
from mechkit.model.compat import cache_kwargs, cache_of
from mechkit.model.modules.linear import weight_out_in

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle
    from mechkit.model.headspec import Head


def mean_head_outputs(handle: ModelHandle, prompts: Sequence, batch_size: int = 8) -> torch.Tensor:
    """``[n_layers, n_heads, d_head]``: each head's output at the last prompt token, averaged (zeros in the
    cells of heads a pruned layer does not have)."""
    a = handle.anatomy
    total = torch.zeros(a.n_layers, a.n_heads, a.d_head, dtype=torch.float64)
    encoded = prompt_ids(handle, prompts)
    keep = last_logits_only(handle)
    for start in range(0, len(encoded), batch_size):
        ids, mask, last = pad_right(encoded[start:start + batch_size], pad_id(handle.tokenizer))
        rows = torch.arange(len(ids))

        def take(z, point, rows=rows, last=last):
            total[point.layer, :z.shape[2]] += z[rows, last.to(z.device)].detach().double().sum(0).cpu()

        with torch.no_grad(), hooks(handle, {"blocks.*.attn.hook_z": take}):
            handle(ids.to(handle.device), attention_mask=mask.to(handle.device), **keep)
    return (total / len(encoded)).float()


def _split(handle: ModelHandle, prompt) -> tuple[list[int], int, int]:
    """Prompt ids without the last token, the last token, and the first answer token."""
    ids, start = encode(handle.tokenizer, prompt.text, prompt.answer, prompt.terminator)
    return ids[:start - 1], ids[start - 1], ids[start]


class _HeadPatch:
    """Row i of the forward now running gets head ``heads[i]``'s last-token output set to its mean."""

    def __init__(self, means: torch.Tensor) -> None:
        self.means = means
        self.heads: list[tuple[int, int] | None] = []

    @pure  # only a replacement: on a remote model the head outputs stay on the server
    def hook(self, z: torch.Tensor, point) -> torch.Tensor | None:
        rows = [(i, h[1]) for i, h in enumerate(self.heads) if h is not None and h[0] == point.layer]
        if not rows:
            return None
        z = z.clone()
        r, h = torch.tensor([i for i, _ in rows]), torch.tensor([h for _, h in rows])
        z[r, -1, h] = self.means[point.layer, h].to(z)
        return z


def indirect_effects(handle: ModelHandle, prompts: Sequence, means: torch.Tensor,
                     heads_per_forward: int = 48) -> torch.Tensor:
    """``[n_prompts, n_layers, n_heads]``: P(answer) with head (L, h)'s last-token output set to
    ``means[L, h]``, minus P(answer) unpatched, on each (corrupted, e.g. shuffled-label) prompt; NaN for
    the heads a pruned layer does not have."""
    a = handle.anatomy
    every = [(L, h) for L in range(a.n_layers) for h in range(a.heads_in(L))]
    patch = _HeadPatch(means)
    out = torch.zeros(len(prompts), a.n_layers, a.n_heads)
    out[:, ~torch.as_tensor(a.head_mask())] = float("nan")
    with torch.no_grad(), hooks(handle, {"blocks.*.attn.hook_z": patch.hook}):
        for i, prompt in enumerate(prompts):
            prefix, last, target = _split(handle, prompt)
            patch.heads = []
            cache = None if handle.backend.traced else \
                cache_of(handle.forward(torch.tensor([prefix], device=handle.device), use_cache=True))
            base = None
            for start in range(0, len(every), heads_per_forward):
                patch.heads = [None, *every[start:start + heads_per_forward]]  # row 0: unpatched
                probs = _last_token_probs(handle, prefix, cache, last, len(patch.heads))[:, target]
                base = probs[0] if base is None else base
                for (L, h), p in zip(patch.heads[1:], probs[1:], strict=True):
                    out[i, L, h] = p - base
    return out


def _last_token_probs(handle: ModelHandle, prefix: list[int], cache, last: int, rows: int) -> torch.Tensor:
    """Next-token probabilities of ``rows`` copies of one last token after a shared prefix: cached, or
    (``cache`` None: the nnsight backend) computed in the same forward."""
    if cache is None:
        ids = torch.tensor([[*prefix, last]] * rows, device=handle.device)
        logits = handle.forward(ids, use_cache=False, **last_logits_only(handle)).logits[:, -1]
        return logits.float().softmax(-1).cpu()
    batch_cache = copy.deepcopy(cache)
    batch_cache.batch_repeat_interleave(rows)
    ids = torch.full((rows, 1), last, device=handle.device)
    logits = handle.forward(ids, **cache_kwargs(batch_cache), use_cache=True).logits[:, -1]
    return logits.float().softmax(-1).cpu()


def head_contributions(handle: ModelHandle, means: torch.Tensor) -> torch.Tensor:
    """``[n_layers, n_heads, d_model]``: each head's mean output projected through its slice of the
    attention output projection (its share of the residual stream; the projection's bias, shared by
    all heads, is left out)."""
    a = handle.anatomy
    out = []
    with torch.no_grad():
        for layer in range(a.n_layers):
            n = a.heads_in(layer)  # a pruned layer's own heads; the grid's other cells stay zero
            w = weight_out_in(a.attn_out(layer)).float().cpu()
            w = rearrange(w, "m (h d) -> h m d", h=n)
            row = torch.zeros(a.n_heads, w.shape[1])
            row[:n] = torch.einsum("hmd,hd->hm", w, means[layer, :n].float())
            out.append(row)
    return torch.stack(out)


def function_vector(handle: ModelHandle, means: torch.Tensor, heads: Sequence[Head]) -> torch.Tensor:
    """``[d_model]``: the sum of the chosen heads' projected mean outputs."""
    contrib = head_contributions(handle, means)
    return torch.stack([contrib[h.layer, h.head] for h in heads]).sum(0)
