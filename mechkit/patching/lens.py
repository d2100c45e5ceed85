"""The logit lens and direct logit attribution, through the model's own final norm and unembedding.

**Logit lens** (nostalgebraist 2020): each layer's residual stream decoded as if it were the last, through
the final norm module itself (so the family's convention holds: Gemma's ``1 + weight``, a LayerNorm's
centring) and the unembedding, with the final logit soft-capping where the family has one.

**Direct logit attribution**: the final residual stream is the sum of the embedding (``blocks.0.hook_resid_pre``,
with any position embedding or scaling the family adds), every attention layer's output (per head: its
slice of ``hook_z`` through its columns of W_O, plus the projection's bias) and every MLP's output. With the
final norm's scale **frozen at the run's values** (``ln_final.hook_scale``) the map to the logits is linear,
so each component's projection on the answer direction ``W_U[correct] − W_U[wrong]`` is its share, and the
shares plus the constant term (norm bias, unembedding bias) sum to the final logit difference. Frozen means:
the attribution says what each component writes at this run's scale, not what removing it would do
(removing it would change the scale). Families with norms after each sublayer (Gemma 2/3, OLMo 2) add the
normed output, not ``hook_attn_out``; there :attr:`DLA.unexplained` is not zero, and says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from einops import einsum, rearrange

from mechkit.model.backends.weight_reads import read_weights
from mechkit.model.edit.partial import unembed
from mechkit.model.handle import require_handle
from mechkit.model.modules.linear import weight_out_in
from mechkit.model.modules.norm import frozen as frozen_norm
from mechkit.model.modules.norm import scale as norm_scale
from mechkit.patching.lens_checks import checked_cache, checked_pos, checked_token, dla_points, lens_points

if TYPE_CHECKING:
    from mechkit.hooking.core import Cache
    from mechkit.model.handle import ModelHandle


def logit_lens(handle: ModelHandle, cache: Cache, pos: int = -1) -> torch.Tensor:
    """``[n_layers + 1, batch, vocab]``: the logits each block's input (and the last block's output)
    would give at position ``pos``. Needs ``blocks.*.hook_resid_pre`` and the last ``hook_resid_post``
    (``mk.record(m, lens_names(m))``); the last row equals the model's logits.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> logits, cache = mk.run_with_cache(m, m.to_tokens("hello"), lens_names(m))
    >>> lens = logit_lens(m, cache)
    >>> lens.shape[0], torch.allclose(lens[-1], logits[:, -1], atol=1e-4)
    (3, True)
    """
    require_handle(handle, "logit_lens")
    acts = checked_cache(handle, cache, lens_points(handle), "logit_lens", "lens_names")
    pos = checked_pos(pos, acts[lens_points(handle)[-1]].shape[1], "logit_lens")
    stack = [act[:, pos] for act in acts.values()]
    return read_weights(handle, _decode, torch.stack(stack).cpu())


def _decode(view, stack: torch.Tensor) -> torch.Tensor:
    """Each row of ``stack`` through the final norm and unembedding, where the weights are (``view``: the
    handle, or the server's model on a remote backend)."""
    device = _device(view)
    dtype = view.model.get_submodule(view.anatomy.family.unembed).weight.dtype  # a recording of another precision
    with torch.no_grad():
        return torch.stack([unembed(view, x[:, None].to(device, dtype))[:, 0] for x in stack]).cpu()


def lens_names(handle: ModelHandle) -> list[str]:
    """The hook points :func:`logit_lens` reads."""
    return ["blocks.*.hook_resid_pre", f"blocks.{handle.anatomy.n_layers - 1}.hook_resid_post"]


def dla_names(handle: ModelHandle) -> list[str]:
    """The hook points :func:`direct_logit_attribution` reads."""
    return ["blocks.0.hook_resid_pre", "blocks.*.attn.hook_z", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out",
            f"blocks.{handle.anatomy.n_layers - 1}.hook_resid_post"]


@dataclass
class DLA:
    """Each component's share of the logit difference at one position, per batch row: ``heads``
    ``[batch, n_layers, n_heads]``, ``attn``/``mlp`` ``[batch, n_layers]`` (``attn`` = heads + the output
    projection's bias), ``embed`` and ``constant`` ``[batch]``; ``total`` the sum, ``actual`` the logit
    difference of the run (before any soft-capping), ``unexplained`` = actual − total."""

    heads: torch.Tensor
    attn: torch.Tensor
    mlp: torch.Tensor
    embed: torch.Tensor
    constant: torch.Tensor
    actual: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.embed + self.attn.sum(-1) + self.mlp.sum(-1) + self.constant

    @property
    def unexplained(self) -> torch.Tensor:
        return self.actual - self.total


def direct_logit_attribution(handle: ModelHandle, cache: Cache, correct: int, wrong: int, pos: int = -1) -> DLA:
    """Direct logit attribution of ``logit[correct] − logit[wrong]`` at ``pos`` (the final norm's scale
    frozen at the recorded run's: see the module docstring). ``cache`` holds :func:`dla_names`.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> _, cache = mk.run_with_cache(m, m.to_tokens("hello"), dla_names(m))
    >>> dla = direct_logit_attribution(m, cache, correct=5, wrong=6)
    >>> dla.heads.shape, bool(dla.unexplained.abs().max() < 1e-4)
    (torch.Size([1, 2, 4]), True)
    """
    require_handle(handle, "direct_logit_attribution")
    n, who = handle.anatomy.n_layers, "direct_logit_attribution"
    cache = checked_cache(handle, cache, dla_points(handle), who, "dla_names")
    correct, wrong = checked_token(handle, correct, "correct", who), checked_token(handle, wrong, "wrong", who)
    pos = checked_pos(pos, cache[f"blocks.{n - 1}.hook_resid_post"].shape[1], who)
    width = handle.anatomy.n_heads  # a pruned layer's fewer heads padded with zeros (and given no share)
    acts = {"z": torch.stack([_widened(cache[f"blocks.{L}.attn.hook_z"][:, pos], width) for L in range(n)]),
            "attn": torch.stack([cache[f"blocks.{L}.hook_attn_out"][:, pos] for L in range(n)]),
            "mlp": torch.stack([cache[f"blocks.{L}.hook_mlp_out"][:, pos] for L in range(n)]),
            "final": cache[f"blocks.{n - 1}.hook_resid_post"][:, pos], "embed": cache["blocks.0.hook_resid_pre"][:, pos]}
    parts = read_weights(handle, _dla, {k: v.cpu() for k, v in acts.items()}, correct, wrong)
    return DLA(**parts)


def _widened(z: torch.Tensor, width: int) -> torch.Tensor:
    """``[batch, heads, d_head]`` zero-padded to ``width`` heads."""
    return torch.cat([z, z.new_zeros(z.shape[0], width - z.shape[1], *z.shape[2:])], 1) if z.shape[1] < width else z


def _device(view) -> torch.device:
    """Where to compute: the handle's device (a dispatched model's execution device), or on a server the
    unembedding's."""
    device = getattr(view, "device", None)
    return torch.device(device) if device is not None else view.model.get_submodule(view.anatomy.family.unembed).weight.device


def _dla(view, acts: dict, correct: int, wrong: int) -> dict:
    """The shares, computed where the weights are (``view``: the handle, or the server's model). It names
    functions, not modules: a module would be shipped whole to a remote server, loader and all."""
    a = view.anatomy
    with torch.no_grad():
        device = _device(view)
        unembed_w = weight_out_in(view.model.get_submodule(a.family.unembed))
        direction = (unembed_w[correct] - unembed_w[wrong]).float().to(device)
        # the final norm's divisor at this run (ln_final.hook_scale, derived from its input as the hook does)
        scale, gamma = norm_scale(a.final_norm, acts["final"].to(device)), a.final_norm_scale()

        def share(x: torch.Tensor) -> torch.Tensor:  # [..., batch, d_model] -> [..., batch]
            return frozen_norm(a.final_norm, x.to(device), scale, gamma, bias=False) @ direction

        heads, attn, mlp = [], [], []
        for layer in range(a.n_layers):
            n = a.heads_in(layer)  # this layer's own heads; the others' cells are NaN
            z = acts["z"][layer][:, :n].float().to(device)  # [batch, heads, d_head]
            w_o = rearrange(weight_out_in(a.attn_out(layer)).float(), "m (h d) -> h d m", d=a.d_head)
            per_head = einsum(z, w_o.to(device), "b h d, h d m -> h b m")
            row = share(per_head).T
            heads.append(torch.cat([row, row.new_full((row.shape[0], a.n_heads - n), float("nan"))], 1))
            attn.append(share(acts["attn"][layer]))
            mlp.append(share(acts["mlp"][layer]))
        constant = _constant(view, a, direction, correct, wrong, acts["final"].shape[0])
        actual = share(acts["final"]) + constant
        return {"heads": torch.stack(heads, 1).cpu(), "attn": torch.stack(attn, 1).cpu(), "mlp": torch.stack(mlp, 1).cpu(),
                "embed": share(acts["embed"]).cpu(), "constant": constant.cpu(), "actual": actual.cpu()}


def _constant(handle, a, direction: torch.Tensor, correct: int, wrong: int, batch: int) -> torch.Tensor:
    """What no component writes: the final norm's bias on the direction, and the unembedding's bias."""
    value = torch.zeros((), device=direction.device)
    bias = getattr(a.final_norm, "bias", None)
    if isinstance(bias, torch.Tensor):
        value = value + bias.float().to(direction.device) @ direction
    b_u = getattr(handle.model.get_submodule(a.family.unembed), "bias", None)
    if isinstance(b_u, torch.Tensor):
        value = value + (b_u[correct] - b_u[wrong]).float().to(direction.device)
    return value.expand(batch)
