"""The hook-name grammar: one stable, guessable name for every place an analysis can read or write.

Names follow TransformerLens so researchers already know them::

    hook_embed                     token embedding            [batch, pos, d_model]
    blocks.{L}.hook_resid_pre      input of block L           [batch, pos, d_model]
    blocks.{L}.attn.hook_q         per-head queries           [batch, pos, n_heads, d_head]
    blocks.{L}.attn.hook_k         per-head keys              [batch, pos, n_kv_heads, d_head]
    blocks.{L}.attn.hook_v         per-head values            [batch, pos, n_kv_heads, d_head]
                                   (what the attention function receives: after RoPE where the
                                   family rotates; TransformerLens calls those hook_rot_q/hook_rot_k)
    blocks.{L}.hook_resid_post     output of block L          [batch, pos, d_model]
    blocks.{L}.attn.hook_z         per-head outputs           [batch, pos, n_heads, d_head]
                                   (the input of the attention output projection)
    blocks.{L}.attn.hook_pattern   attention pattern          [batch, n_heads, q_pos, k_pos]
    blocks.{L}.hook_attn_out       attention block output     [batch, pos, d_model]
    blocks.{L}.hook_resid_mid      stream between attention and MLP  [batch, pos, d_model]
                                   (families with a sequential block; not GPT-NeoX's parallel one)
    blocks.{L}.mlp.hook_post       MLP neurons                [batch, pos, d_mlp]
                                   (the input of the MLP down projection)
    blocks.{L}.hook_mlp_out        MLP block output           [batch, pos, d_model]
    blocks.{L}.mlp.hook_router     router logits (mixture of experts, read-only)  [batch, pos, n_experts]
    blocks.{L}.mlp.hook_routing    the weight each expert's output gets, 0 where not chosen  [batch, pos, n_experts]
                                   (replace a column by 0 to ablate that expert; native backend)
    blocks.{L}.mlp.hook_expert_out each expert's output times its routing weight, 0 where not chosen
                                   [batch, pos, n_experts, d_model]  (sums over experts to the routed part
                                   of hook_mlp_out; a replacement's sum is the expert bank's output)
    ln_final.hook_scale            final norm's divisor       [batch, pos, 1]   (read-only)

``*`` matches any layer: ``blocks.*.attn.hook_z``.

The names are TransformerLens' own, and mean the same activations (a recording converts to a TL
``ActivationCache`` as it is: :meth:`mechkit.hooking.Cache.to_transformer_lens`). Under grouped-query
attention both count *query* heads: ``hook_z`` is each query head's output and ``hook_pattern`` each
query head's pattern (a KV head shared by G query heads appears G times, as in TL's ``hook_z`` and
``hook_pattern``); ``hook_k``/``hook_v`` have ``n_kv_heads`` heads, as TL's do. The
TransformerBridge's wrapper-level names are accepted as aliases (:data:`ALIASES`): ``blocks.L.hook_in``
→ ``hook_resid_pre``, ``hook_out`` → ``hook_resid_post``, ``attn.hook_out`` → ``hook_attn_out``,
``mlp.hook_out`` → ``hook_mlp_out``, ``mlp.out.hook_in`` → ``mlp.hook_post``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from mechkit.errors import MechkitError
from mechkit.model.anatomy import Anatomy

SUFFIXES = (
    "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out", "hook_resid_mid", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
)
# Points outside the blocks: (name, where it sits in the forward: before block 0 or after the last)
GLOBALS = (("hook_embed", "first"), ("ln_final.hook_scale", "last"))
# Points a hook function may read but not replace.
READ_ONLY = ("ln_final.hook_scale", "mlp.hook_router")
_MOE = ("mlp.hook_router", "mlp.hook_routing", "mlp.hook_expert_out")  # only in a mixture of experts' routed layers
_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")
# TransformerBridge names for the same activations -> mechkit's (TL's HookedTransformer) names
ALIASES = {"hook_in": "hook_resid_pre", "hook_out": "hook_resid_post", "attn.hook_out": "hook_attn_out",
           "mlp.hook_out": "hook_mlp_out", "mlp.out.hook_in": "mlp.hook_post"}
_ALIASED = re.compile(r"^(blocks\.[^.]+)\.(.+)$")


def canonical(name: str) -> str:
    """The mechkit name of a hook name or pattern, TransformerBridge aliases mapped.

    >>> canonical("blocks.3.hook_in"), canonical("blocks.*.mlp.out.hook_in"), canonical("blocks.0.attn.hook_z")
    ('blocks.3.hook_resid_pre', 'blocks.*.mlp.hook_post', 'blocks.0.attn.hook_z')
    """
    match = _ALIASED.match(name)
    if match and match.group(2) in ALIASES:
        return f"{match.group(1)}.{ALIASES[match.group(2)]}"
    return name


@dataclass(frozen=True)
class HookPoint:
    """A resolved hook name: its layer and which part of the block it reads."""

    name: str
    layer: int
    suffix: str


def _suffixes(anatomy: Anatomy) -> tuple[str, ...]:
    """The block points this model has (``hook_resid_mid`` only where the family's block is sequential;
    a mixture of experts has no dense ``mlp.hook_post`` but ``mlp.hook_router``)."""
    absent = {"hook_resid_mid"} if anatomy.family.resid_mid is None else set()
    if anatomy.is_moe:
        absent.add("mlp.hook_post")
    moe = (("mlp.hook_router",) if anatomy.family.router is not None else ()) + \
        (("mlp.hook_routing", "mlp.hook_expert_out") if anatomy.expert_routing else ()) if anatomy.is_moe else ()
    return tuple(s for s in SUFFIXES if s not in absent) + moe


def all_names(anatomy: Anatomy) -> list[str]:
    """Every hook point of the model, in the order a forward reaches them."""
    first = [name for name, where in GLOBALS if where == "first"]
    last = [name for name, where in GLOBALS if where == "last" and anatomy.final_norm is not None]
    return first + [f"blocks.{layer}.{s}" for layer in range(anatomy.n_layers) for s in _suffixes(anatomy)
                    if s not in _MOE or anatomy.router(layer) is not None] + last


def _point(anatomy: Anatomy, name: str) -> HookPoint:
    match = _NAME.match(name)
    if match:
        return HookPoint(name=name, layer=int(match.group(1)), suffix=match.group(2))
    where = dict(GLOBALS)[name]
    return HookPoint(name=name, layer=-1 if where == "first" else anatomy.n_layers, suffix=name)


def resolve(anatomy: Anatomy, pattern: str) -> list[HookPoint]:
    """Every hook point matching ``pattern`` (exact name or ``*`` wildcard, TransformerBridge aliases
    accepted), in layer order."""
    pattern = canonical(pattern)
    names = [n for n in all_names(anatomy) if fnmatch.fnmatchcase(n, pattern)]
    if not names:
        raise MechkitError(
            f"no hook point matches {pattern!r}",
            f"use blocks.{{0..{anatomy.n_layers - 1}}}.{{{', '.join(_suffixes(anatomy))}}} (with * for any layer), "
            f"{' or '.join(name for name, _ in GLOBALS)}",
        )
    return [_point(anatomy, name) for name in names]
