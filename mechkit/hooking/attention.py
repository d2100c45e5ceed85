"""Attention patterns through a registered attention function, not eager attention everywhere.

transformers looks up ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` on every forward and
hands that function post-RoPE q, k and v. Inside :func:`pattern_hooks` mechkit points the model's
config at its own registered name (restored on exit): layers with a pattern hook are computed by
the family's own eager function so the pattern can be read or replaced; every other layer goes
straight to the original kernel (SDPA, flash…), so a pattern read costs one layer of eager
attention, not the whole model.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import single_use
from mechkit.hooking.checks import check_hook_fns, check_layer_fns, same_shape

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

PatternFn = Callable[[torch.Tensor], "torch.Tensor | None"]

# id(attention module) -> hook functions; read by the registered attention function.
_ACTIVE: dict[int, list[PatternFn]] = {}
# id(attention module) -> {"q"|"k"|"v": functions of [batch, pos, heads, d_head]} (post-RoPE inputs).
_QKV: dict[int, dict[str, list[PatternFn]]] = {}
_REGISTERED: set[str] = set()
# id(config) -> [the implementation it had before any pattern context, open contexts]: contexts
# nest and may close in any order; the config goes back only when the last one closes.
_SWITCHED: dict[int, list] = {}
_BASES = ("sdpa", "eager")


def eager_for(module: torch.nn.Module) -> Callable:
    """The family's own eager attention function (Llama's where the family module has none)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    return fn


def additive_mask(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The mask eager attention expects (additive float), from SDPA's bool mask or None (causal)."""
    if mask is not None and mask.dtype != torch.bool:
        return mask
    neg = torch.finfo(q.dtype).min
    if mask is None:
        q_len, k_len = q.shape[-2], k.shape[-2]
        rows = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len)
        mask = rows >= torch.arange(k_len, device=q.device)[None, :]
        mask = mask[None, None]
    return torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, neg)


def eager_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, pattern)`` of the family's eager attention on post-RoPE q, k, v: what a pattern hook
    reads, whichever kernel the model is configured with (the nnsight backend calls it inside a trace)."""
    kwargs.pop("is_causal", None)
    return eager_for(module)(module, query, key, value, additive_mask(attention_mask, query, key), **kwargs)


def attend(pattern: torch.Tensor, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The attention output ``[batch, q, heads, d_head]`` of a (replaced) pattern over ``value``."""
    n_rep = query.shape[1] // value.shape[1]
    v = value if n_rep == 1 else value.repeat_interleave(n_rep, dim=1)
    return torch.matmul(pattern.to(device=v.device, dtype=v.dtype), v).transpose(1, 2).contiguous()


def effective_pattern(weights: torch.Tensor, out: torch.Tensor, query: torch.Tensor,
                      value: torch.Tensor) -> torch.Tensor:
    """The pattern that multiplies the values: the eager weights, or, where the family scales each row of
    the output after attending (Granite-SWA's learnable sinks: ``(P·V)·σ(lse − sink)``), the weights with
    that per-row scale folded in, so a pattern hook reads what the model uses and a replacement means
    the same thing. The scale is read off the output (a least-squares ratio per row), never assumed."""
    implied = attend(weights, query, value)  # [batch, q, heads, d_head], like ``out``
    if implied.shape != out.shape or torch.allclose(implied, out, atol=1e-5, rtol=1e-4):
        return weights
    scale = (out * implied).sum(-1) / implied.pow(2).sum(-1).clamp_min(torch.finfo(implied.dtype).tiny)
    return weights * scale.transpose(1, 2).unsqueeze(-1).to(weights.dtype)


def _apply_qkv(fns: dict[str, list[PatternFn]], query, key, value) -> tuple:
    """Run the q/k/v functions on ``[batch, pos, heads, d_head]`` views of what attention receives."""
    out = {"q": query, "k": key, "v": value}
    for role, role_fns in fns.items():
        x = out[role].transpose(1, 2)
        changed = False
        for fn in role_fns:
            new = fn(x)
            if new is not None:
                x, changed = new.to(device=x.device, dtype=x.dtype), True
        if changed:
            out[role] = x.transpose(1, 2).contiguous()
    return out["q"], out["k"], out["v"]


def _make_dispatch(base: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):
        qkv = _QKV.get(id(module))
        if qkv:
            query, key, value = _apply_qkv(qkv, query, key, value)
        hooks = _ACTIVE.get(id(module))
        if not hooks:
            if base == "eager":
                return eager_for(module)(module, query, key, value, attention_mask, **kwargs)
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            return ALL_ATTENTION_FUNCTIONS[base](module, query, key, value, attention_mask, **kwargs)
        out, weights = eager_attention(module, query, key, value, attention_mask, **kwargs)
        weights = effective_pattern(weights, out, query, value)
        changed = False
        for fn in hooks:
            new = fn(weights)
            if new is not None:
                weights, changed = new, True
        if changed:
            out = attend(weights, query, value)
        return out, weights

    return attention


def _register(base: str) -> str:
    name = f"mechkit_{base}"
    if name not in _REGISTERED:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(name, _make_dispatch(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _REGISTERED.add(name)
    return name


def _configs(model: torch.nn.Module) -> list:
    seen: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def pattern_hooks(handle: ModelHandle, fns: dict[int, list[PatternFn]],
                  qkv: dict[int, dict[str, list[PatternFn]]] | None = None) -> Iterator[None]:
    """Attach pattern functions ``{layer: [fn, ...]}``; each gets ``[batch, n_heads, q, k]``.

    A function returning a tensor replaces the pattern (the layer's output is recomputed from
    it); returning None only reads. Detached on exit, also on error. Contexts are independent:
    they may nest and close in any order, and the model's attention setting returns to what it
    was when the last one closes.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> seen = []
    >>> with pattern_hooks(m, {0: [lambda p: seen.append(tuple(p.shape))]}):
    ...     _ = m(m.to_tokens("hi"))
    >>> seen[0][1:]            # [batch, heads, q, k]
    (4, 2, 2)

    ``qkv`` (``{layer: {"q"|"k"|"v": [fn, ...]}}``) attaches functions to the post-RoPE query, key and
    value the attention function receives, each as ``[batch, pos, heads, d_head]`` (key and value with the
    KV heads); a layer with only these keeps the model's own kernel.
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.pattern_hooks")
    n_layers = handle.anatomy.n_layers
    fns = {layer: [same_shape(fn, f"layer {layer}'s attention pattern") for fn in layer_fns]
           for layer, layer_fns in check_layer_fns(fns, n_layers, "mk.pattern_hooks", ("pattern",)).items()}
    if qkv is not None:
        qkv = _checked_qkv(qkv, n_layers)
    if handle.backend.traced:
        from mechkit.errors import MechkitError

        raise MechkitError("pattern_hooks attaches to the local attention function, which an nnsight trace does "
                           "not call", "use mechkit.hooks(handle, {'blocks.L.attn.hook_pattern': fn}) (fn(pattern, "
                           "point)), which runs on every backend")
    if handle.anatomy.family.pattern is not None:  # attention computed inline: hook its pattern module
        with _module_patterns(handle, fns, qkv):
            yield
        return
    configs = _configs(handle.model)
    # what each config holds before any is switched: a composite config's setter passes its value on to
    # its sub-configs (GOT-OCR2), so reading one after switching another would keep the switched name
    originals = [_SWITCHED[id(c)][0] if id(c) in _SWITCHED else c._attn_implementation for c in configs]
    keys, qkv_keys = [], []
    switched = []
    try:
        for layer, layer_fns in fns.items():
            key = id(handle.anatomy.attn(layer))
            _ACTIVE.setdefault(key, []).extend(layer_fns)
            keys.append((key, layer_fns))
        for layer, roles in (qkv or {}).items():
            key = id(handle.anatomy.attn(layer))
            entry = _QKV.setdefault(key, {})
            for role, role_fns in roles.items():
                entry.setdefault(role, []).extend(role_fns)
            qkv_keys.append((key, roles))
        for config, original in zip(configs, originals, strict=True):  # outer config first, then its parts
            entry = _SWITCHED.setdefault(id(config), [original, 0])
            entry[1] += 1
            switched.append(config)
            config._attn_implementation = _register(_base(entry[0]))  # each keeps its own kernel when unhooked
        yield
    finally:
        for config in switched:
            entry = _SWITCHED[id(config)]
            entry[1] -= 1
            if entry[1] == 0:
                config._attn_implementation = entry[0]
                del _SWITCHED[id(config)]
        for key, layer_fns in keys:
            remaining = [f for f in _ACTIVE.get(key, []) if all(f is not g for g in layer_fns)]
            if remaining:
                _ACTIVE[key] = remaining
            else:
                _ACTIVE.pop(key, None)
        for key, roles in qkv_keys:
            entry = _QKV.get(key, {})
            for role, role_fns in roles.items():
                left = [f for f in entry.get(role, []) if all(f is not g for g in role_fns)]
                if left:
                    entry[role] = left
                else:
                    entry.pop(role, None)
            if not entry:
                _QKV.pop(key, None)


def _checked_qkv(qkv: Any, n_layers: int) -> dict[int, dict[str, list[PatternFn]]]:
    """``{layer: {"q"|"k"|"v": [fn, ...]}}`` checked (layers in range, known roles, functions), each
    function's replacement held to its input's shape."""
    from mechkit.errors import MechkitError

    if not isinstance(qkv, Mapping):
        raise MechkitError(f"pattern_hooks' qkv takes a dict of layers to {{'q'|'k'|'v': [fn]}}, not "
                           f"{type(qkv).__name__}", "pass e.g. qkv={0: {\"q\": [fn]}}")
    out: dict[int, dict[str, list[PatternFn]]] = {}
    for layer, roles in check_layer_fns({k: [_placeholder] for k in qkv}, n_layers, "pattern_hooks' qkv").items():
        roles = qkv[layer]
        if not isinstance(roles, Mapping) or not set(roles) <= {"q", "k", "v"}:
            raise MechkitError(f"pattern_hooks' qkv: layer {layer} maps to {roles!r}"[:200],
                               "map each layer to {\"q\"|\"k\"|\"v\": [fn]}")
        checked = check_hook_fns({role: fns for role, fns in roles.items()}, f"pattern_hooks' qkv, layer {layer}",
                                 ("tensor",))
        out[layer] = {role: [same_shape(fn, f"layer {layer}'s {role}") for fn in fns] for role, fns in checked.items()}
    return out


def _placeholder(*_args: Any) -> None:
    """Stands in for a layer's functions while only its layer index is checked."""


def _base(impl) -> str:
    """The kernel a config's unhooked layers keep: its own (before any pattern context switched it)."""
    impl = impl.removeprefix("mechkit_") if isinstance(impl, str) else "sdpa"
    return impl if impl in _BASES else "sdpa"


@contextlib.contextmanager
def _module_patterns(handle: ModelHandle, fns: dict[int, list[PatternFn]],
                     qkv: dict[int, dict[str, list[PatternFn]]] | None) -> Iterator[None]:
    """Pattern functions on a family that computes attention inline (Bloom, GPT-Neo): a forward hook on the
    module whose output is the pattern (``Family.pattern``), reading it or replacing what multiplies the values."""
    if qkv:
        from mechkit.errors import MechkitError

        raise MechkitError(f"{handle.anatomy.family_name} computes attention inline: its post-RoPE q/k/v are not "
                           "hook points", "hook blocks.L.attn.hook_pattern or blocks.L.attn.hook_z instead")

    def make(layer_fns: list[PatternFn]):
        def post(_module, _args, pattern):
            changed = False
            for fn in layer_fns:
                new = fn(pattern)
                if new is not None:
                    pattern, changed = new.to(device=pattern.device, dtype=pattern.dtype), True
            return pattern if changed else None

        return post

    if handle.anatomy.family.pattern == "softmax":
        with _softmax_patterns(handle, {layer: make(layer_fns) for layer, layer_fns in fns.items()}):
            yield
        return
    removers = [handle.anatomy.pattern_module(layer).register_forward_hook(make(layer_fns))
                for layer, layer_fns in fns.items()]
    try:
        yield
    finally:
        for remover in removers:
            remover.remove()


_SOFTMAX = (torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax)


class _SoftmaxMode(torch.overrides.TorchFunctionMode):
    """Inside one attention forward: hands each 4-d softmax result (the pattern) to ``post``."""

    def __init__(self, post) -> None:
        super().__init__()
        self.post = post

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _SOFTMAX and isinstance(out, torch.Tensor) and out.dim() == 4:
            new = self.post(None, None, out)
            return out if new is None else new
        return out


@contextlib.contextmanager
def _softmax_patterns(handle: ModelHandle, posts: dict) -> Iterator[None]:
    """Families whose attention calls softmax inline with no module around it (MPT, Falcon): a torch function
    mode, entered only while a hooked layer's attention runs, sees that softmax. The model's kernel setting
    is switched to eager meanwhile (Falcon takes SDPA otherwise), and back on exit."""
    a = handle.anatomy
    removers, configs = [], _configs(handle.model)
    before = [c._attn_implementation for c in configs]

    def hooks_for(post):
        mode: list = []

        def pre(_module, _args):
            mode.append(_SoftmaxMode(post))
            mode[-1].__enter__()

        def after(_module, _args, _output):
            mode.pop().__exit__(None, None, None)

        return pre, after

    try:
        for config in configs:
            config._attn_implementation = "eager"
        for layer, post in posts.items():
            pre, after = hooks_for(post)
            removers += [a.attn(layer).register_forward_pre_hook(pre),
                         a.attn(layer).register_forward_hook(after, always_call=True)]  # the mode ends on error too
        yield
    finally:
        for remover in removers:
            remover.remove()
        for config, impl in zip(configs, before, strict=True):
            config._attn_implementation = impl
