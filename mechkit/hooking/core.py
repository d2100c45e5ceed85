"""Read and write activations by hook name; every hook detaches when the context exits.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> with mk.record(m, "blocks.*.attn.hook_z") as cache:
...     _ = m(m.to_tokens("hello"))
>>> cache["blocks.0.attn.hook_z"].shape[-2:]   # [batch, pos, n_heads, d_head]
torch.Size([4, 16])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange

from mechkit.errors import MechkitError, single_use
from mechkit.hooking import traced
from mechkit.hooking.attention import pattern_hooks
from mechkit.hooking.cache import Cache, final_hidden, logit_mark, shaping_of
from mechkit.hooking.cache import NotRecorded as NotRecorded  # re-exported: it was defined here
from mechkit.hooking.checks import check_hook_fns, check_names, same_shape
from mechkit.hooking.points import READ_ONLY, HookPoint, all_names, canonical, resolve
from mechkit.model.backends.grad import enable_grad
from mechkit.model.modules import norm

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

HookFn = Callable[[torch.Tensor, HookPoint], "torch.Tensor | None"]


def _first(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _replace_first(args: tuple, kwargs: dict, value: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def _output_tensor(output):
    return output[0] if isinstance(output, tuple | list) else output  # OpenAI GPT's blocks return lists


def _replace_output(output, value: torch.Tensor):
    if isinstance(output, list):
        return [value, *output[1:]]
    return (value, *output[1:]) if isinstance(output, tuple) else value


def _beside(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """A replacement on the device of the activation it replaces: on a model spread over devices a
    hook function may hand back a tensor made elsewhere (a cached activation, a patch)."""
    return new if new.device == old.device else new.to(old.device)


def _read_only(point: HookPoint, fn: HookFn) -> HookFn:
    def guarded(act: torch.Tensor, p: HookPoint) -> None:
        if fn(act, p) is not None:
            raise MechkitError(f"{point.name} can be read, not replaced",
                               "patch the residual stream it is computed from (blocks.L.hook_resid_post)")

    return guarded


def _attach_scale(handle: ModelHandle, point: HookPoint, fn: HookFn) -> torch.utils.hooks.RemovableHandle:
    """``ln_final.hook_scale``: derived from the final norm's input (:func:`mechkit.model.modules.norm.scale`)."""
    module = handle.anatomy.final_norm
    guarded = _read_only(point, fn)

    def pre(_module, args, kwargs):
        guarded(norm.scale(module, _first(args, kwargs)), point)

    return module.register_forward_pre_hook(pre, with_kwargs=True)


def _attach_mid(handle: ModelHandle, point: HookPoint, fn: HookFn) -> list[torch.utils.hooks.RemovableHandle]:
    """``hook_resid_mid``: read as the input of the module the family's MLP half starts with. A
    replacement goes to that module and, as the difference it makes, to the block's output, so the
    stream the block passes on carries it too (the MLP half's own residual add read the old value)."""
    reader = handle.anatomy.resid_mid_reader(point.layer)
    delta: list[torch.Tensor] = []

    def pre(_module, args, kwargs):
        x = _first(args, kwargs)
        new = fn(x, point)
        if new is None:
            return None
        new = _beside(new, x)
        delta.append(new - x)
        return _replace_first(args, kwargs, new)

    def post(_module, _args, output):
        if not delta:
            return None
        x = _output_tensor(output)
        return _replace_output(output, x + _beside(delta.pop(), x))

    return [reader.register_forward_pre_hook(pre, with_kwargs=True),
            handle.anatomy.block(point.layer).register_forward_hook(post)]


def _attach_router(handle: ModelHandle, point: HookPoint, fn: HookFn) -> list[torch.utils.hooks.RemovableHandle]:
    """``mlp.hook_router``: the router's logits (its first output, ``[tokens, n_experts]`` over the flattened
    batch), viewed as ``[batch, pos, n_experts]`` with the shape the MoE block's input had."""
    shape: list[tuple[int, ...]] = []
    guarded = _read_only(point, fn)

    def pre(_module, args, kwargs):
        shape[:] = [tuple(_first(args, kwargs).shape[:-1])]

    def post(_module, _args, output):
        logits = _output_tensor(output)
        guarded(logits.reshape(*shape[0], logits.shape[-1]) if shape else logits, point)

    return [handle.anatomy.mlp(point.layer).register_forward_pre_hook(pre, with_kwargs=True),
            handle.anatomy.router(point.layer).register_forward_hook(post)]


def _unflattened(handle: ModelHandle, point: HookPoint, fn: HookFn) -> tuple[HookFn, list]:
    """``fn`` seeing ``[batch, pos, …]`` where the family's MLP runs on flattened tokens (OPT's fc1/fc2 take
    ``[batch·pos, …]``): the block's input shape, read by a pre-hook, unflattens it and a replacement is
    flattened back."""
    shape: list[tuple[int, ...]] = []

    def pre(_module, args, kwargs):
        shape[:] = [tuple(_first(args, kwargs).shape[:-1])]

    def wrapped(x: torch.Tensor, p: HookPoint):
        if x.dim() != 2 or not shape:
            return fn(x, p)
        new = fn(x.reshape(*shape[0], x.shape[-1]), p)
        return None if new is None else new.reshape(x.shape)

    return wrapped, [handle.anatomy.block(point.layer).register_forward_pre_hook(pre, with_kwargs=True)]


def _token_shape(shape: list) -> Callable:
    """A pre-hook for an MoE block that keeps its input's ``[batch, pos]`` in ``shape`` (the expert bank
    sees the tokens flattened)."""
    def block_pre(_module, args, kwargs):
        shape[:] = [tuple(_first(args, kwargs).shape[:-1])]

    return block_pre


def _check_bank_call(module: torch.nn.Module, args: tuple) -> None:
    if len(args) < 3:
        raise MechkitError(f"{type(module).__name__} is not called as experts(hidden, indices, weights)",
                           "read blocks.L.mlp.hook_router and blocks.L.hook_mlp_out instead")


def _attach_routing(handle: ModelHandle, point: HookPoint, fn: HookFn) -> list[torch.utils.hooks.RemovableHandle]:
    """``mlp.hook_routing``: what the expert bank receives (``experts(hidden, indices [tokens, k], weights
    [tokens, k])``, the convention of transformers' MoE blocks) as one dense ``[batch, pos, n_experts]`` grid.
    A replacement is read back at the chosen experts: zeroing a column removes that expert's output;
    experts the router did not choose stay unchosen."""
    a = handle.anatomy
    shape: list[tuple[int, ...]] = []
    block_pre = _token_shape(shape)

    def pre(_module, args, kwargs):
        _check_bank_call(_module, args)
        indices, weights = args[1], args[2]
        dense = torch.zeros(*indices.shape[:-1], a.n_experts, dtype=weights.dtype, device=weights.device)
        dense = dense.scatter(-1, indices.long(), weights)
        new = fn(dense.reshape(*shape[0], a.n_experts) if shape else dense, point)
        if new is None:
            return None
        chosen = new.reshape(dense.shape).to(weights.dtype).gather(-1, indices.long())
        return (args[0], indices, chosen, *args[3:]), kwargs

    return [a.mlp(point.layer).register_forward_pre_hook(block_pre, with_kwargs=True),
            a.experts(point.layer).register_forward_pre_hook(pre, with_kwargs=True)]


def expert_outputs(experts: torch.nn.Module, args: tuple, n_experts: int) -> torch.Tensor:
    """Each expert's weighted output, dense over experts: ``[tokens, n_experts, d_model]``, 0 where the router
    did not choose the expert. The bank itself computes it (``experts.forward``, whichever kernel transformers
    picked, hooks bypassed) once per routing slot: slot ``j`` alone is one expert per token, so the extra cost
    is one more pass of the bank's own work, and the grid holds ``n_experts * d_model`` floats per token."""
    hidden, indices, weights = args[0], args[1], args[2]
    parts = torch.stack([experts.forward(hidden, indices[:, j:j + 1], weights[:, j:j + 1], *args[3:])
                         for j in range(indices.shape[-1])], dim=1)  # [tokens, k, d_model]
    slots = indices.long().clamp(0, n_experts)[..., None].expand(-1, -1, parts.shape[-1])  # n_experts: a masked slot
    dense = parts.new_zeros(parts.shape[0], n_experts + 1, parts.shape[-1]).scatter(1, slots, parts)
    return dense[:, :n_experts]


def _attach_expert_out(handle: ModelHandle, point: HookPoint, fn: HookFn) -> list[torch.utils.hooks.RemovableHandle]:
    """``mlp.hook_expert_out``: :func:`expert_outputs` of the routing the bank received (after any
    ``mlp.hook_routing`` replacement), as ``[batch, pos, n_experts, d_model]``. A replacement's sum over
    experts becomes the bank's output (the shared expert, outside the bank, is still added)."""
    a = handle.anatomy
    shape: list[tuple[int, ...]] = []
    block_pre = _token_shape(shape)

    def post(module, args, output):
        _check_bank_call(module, args)
        dense = expert_outputs(module, args, a.n_experts)
        new = fn(dense.reshape(*shape[0], *dense.shape[1:]) if shape else dense, point)
        if new is None:
            return None
        return _beside(new, output).reshape(dense.shape).sum(dim=1).to(output.dtype)

    return [a.mlp(point.layer).register_forward_pre_hook(block_pre, with_kwargs=True),
            a.experts(point.layer).register_forward_hook(post)]


def _attach(handle: ModelHandle, point: HookPoint, fn: HookFn) -> list[torch.utils.hooks.RemovableHandle]:
    a = handle.anatomy
    layer, suffix = point.layer, point.suffix
    extra: list = []
    if suffix in ("mlp.hook_post", "hook_mlp_out"):
        fn, extra = _unflattened(handle, point, fn)
    if suffix in ("attn.hook_z", "mlp.hook_post", "hook_resid_pre"):
        module = {"attn.hook_z": a.attn_out, "mlp.hook_post": a.mlp_out, "hook_resid_pre": a.block}[suffix](layer)
        split = suffix == "attn.hook_z"

        def pre(_module, args, kwargs):
            x = _first(args, kwargs)
            view = rearrange(x, "b p (h d) -> b p h d", d=a.head_size(layer)) if split else x  # pruned layers keep fewer heads
            new = fn(view, point)
            if new is None:
                return None
            new = rearrange(new, "b p h d -> b p (h d)") if split else new
            return _replace_first(args, kwargs, _beside(new, x))

        return [*extra, module.register_forward_pre_hook(pre, with_kwargs=True)]
    module = a.embed if suffix == "hook_embed" else \
        {"hook_resid_post": a.block, "hook_attn_out": a.attn_out, "hook_mlp_out": a.mlp_output}[suffix](layer)

    def post(_module, _args, output):
        x = _output_tensor(output)
        new = fn(x, point)
        return None if new is None else _replace_output(output, _beside(new, x))

    return [*extra, module.register_forward_hook(post)]


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def hooks(handle: ModelHandle, fns: Mapping[str, HookFn | list[HookFn]]) -> Iterator[None]:
    """Run ``fn(activation, point)`` at each named hook point while the context is open.

    A function returning a tensor replaces the activation; returning None only reads.
    Names may use ``*`` for the layer. Every hook is removed on exit, also on error.
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.hooks")
    fns = check_hook_fns(fns, "mk.hooks", ("act", "hook"))
    if handle.backend.traced:  # nnsight: the functions run inside each forward's trace (shipped as they are)
        entries = [(point, fn) for name, fn_or_fns in fns.items()
                   for fn in (fn_or_fns if isinstance(fn_or_fns, list) else [fn_or_fns])
                   for point in resolve(handle.anatomy, name)]
        with traced.active(handle, entries):
            yield
        return
    removers: list[torch.utils.hooks.RemovableHandle] = []
    patterns: dict[int, list] = {}
    qkv: dict[int, dict[str, list]] = {}
    with contextlib.ExitStack() as stack:
        try:
            for name, fn_or_fns in fns.items():
                for given in fn_or_fns:
                    for point in resolve(handle.anatomy, name):
                        fn = same_shape(given, point.name)  # a replacement of another shape: named here
                        if point.suffix == "attn.hook_pattern":
                            patterns.setdefault(point.layer, []).append(_bind(fn, point))
                        elif point.suffix in _QKV:
                            qkv.setdefault(point.layer, {}).setdefault(_QKV[point.suffix], []).append(_bind(fn, point))
                        elif point.suffix == "hook_resid_mid":
                            removers.extend(_attach_mid(handle, point, fn))
                        elif point.suffix == "mlp.hook_router":
                            removers.extend(_attach_router(handle, point, fn))
                        elif point.suffix == "mlp.hook_routing":
                            removers.extend(_attach_routing(handle, point, fn))
                        elif point.suffix == "mlp.hook_expert_out":
                            removers.extend(_attach_expert_out(handle, point, fn))
                        elif point.suffix == "ln_final.hook_scale":
                            removers.append(_attach_scale(handle, point, fn))
                        else:
                            removers.extend(_attach(handle, point, fn))
            if patterns or qkv:
                stack.enter_context(pattern_hooks(handle, patterns, qkv))
            yield
        finally:
            for remover in removers:
                remover.remove()


_QKV = {"attn.hook_q": "q", "attn.hook_k": "k", "attn.hook_v": "v"}


def _bind(fn: HookFn, point: HookPoint) -> Callable[[torch.Tensor], torch.Tensor | None]:
    return lambda pattern: fn(pattern, point)


@single_use  # a second `with` of one object: one line, not contextlib's AttributeError
def record(handle: ModelHandle, names: str | list[str], device: str | None = None) -> Iterator[Cache]:
    """Record (detached) activations at the named hook points; nothing else is kept.

    Unlike a full ``run_with_cache`` only what you name is stored, optionally moved to ``device``.
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.record")
    if device is not None:  # a bad device fails in the first forward's hook otherwise, as a raw RuntimeError
        from mechkit.model.placement.request import check_device

        if not isinstance(device, str):
            raise MechkitError(f"device must be text such as \"cpu\", not {device!r}", "pass device=\"cpu\"")
        device = check_device(device, "device=")
    cache = Cache()
    cache.handle = handle

    @traced.reads_only
    def keep(act: torch.Tensor, point: HookPoint) -> None:
        value = act.detach()
        cache.append(point.name, value.to(device) if device else value)

    # each point once: a pattern and a name it covers ("blocks.*.x", "blocks.0.x") would record it twice
    points = {p.name for name in check_names(names, "mk.record") for p in resolve(handle.anatomy, name)}
    with hooks(handle, dict.fromkeys(sorted(points), keep)), _inputs_of(handle, cache):
        yield cache


# forward arguments that leave a forward's activations those of its token ids (the rest are checked or refused)
_NEUTRAL = frozenset(("input_ids", "attention_mask", "position_ids", "cache_position", "past_key_values", "cache",
                      "past_key_value", "use_cache", "return_dict", "output_attentions", "output_hidden_states",
                      "output_router_logits", "labels", "num_items_in_batch", "logits_to_keep", "num_logits_to_keep"))


def _replayable(ids: Any, kwargs: dict) -> bool:
    """Whether a forward's token ids alone give its activations, so the points a recording lacks can be
    recorded again on them (:meth:`Cache.completion`): not where it continued a KV cache (a generation step),
    masked padding, was given its own positions (in any row: RoPE's relative positions leave the logits the
    same, so no mark tells a row shifted by 7 apart) or took another input (``token_type_ids``, ``head_mask``)."""
    if not isinstance(ids, torch.Tensor):
        return False
    for key in ("past_key_values", "cache", "past_key_value"):
        past = kwargs.get(key)
        if past is None:
            continue
        length = getattr(past, "get_seq_length", None)
        try:
            if length() if callable(length) else len(past):
                return False
        except (TypeError, ValueError, AttributeError):
            return False
    if any(value is not None for key, value in kwargs.items() if key not in _NEUTRAL):
        return False
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and not bool((mask != 0).all()):
        return False
    if any(_own_positions(ids, kwargs.get(key)) for key in ("position_ids", "cache_position")):
        return False
    return not (mask is not None and (not isinstance(mask, torch.Tensor) or mask.ndim != 2))


def _own_positions(ids: torch.Tensor, positions: Any) -> bool:
    """Whether ``positions`` (``position_ids`` or ``cache_position``, of any shape: ``[pos]``, ``[rows, pos]``,
    a multimodal ``[3, rows, pos]``) are other than ``0 … pos-1`` in some row, or are no integer tensor
    (a list, a float tensor): all of them are compared, not the first row alone."""
    if positions is None:
        return False
    if not isinstance(positions, torch.Tensor) or positions.is_meta or positions.ndim == 0 \
            or positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        return True
    if positions.shape[-1] != ids.shape[-1]:
        return True
    return not bool((positions.detach().cpu() == torch.arange(ids.shape[-1])).all())


@contextlib.contextmanager
def _inputs_of(handle: ModelHandle, cache: Cache) -> Iterator[None]:
    """Keep each forward's token ids on ``cache`` (a few integers), so a conversion to TransformerLens can
    record what its tools need and the user did not name (:mod:`mechkit.hooking.transformer_lens`)."""
    if handle.backend.traced:
        yield
        return
    cache.inputs, cache.marks, cache.shaping = [], [], []
    stack = contextlib.ExitStack()
    hidden = stack.enter_context(final_hidden(handle))  # the final hidden state: marks a forward whose logits were cut

    def pre(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            cache.inputs.append(ids.detach())
            cache.shaping.append(shaping_of(kwargs))  # logits_to_keep: a completion replays it as given
            cache.marks.append(None)  # until the forward returns (one that raised keeps None: not checked)
        if not _replayable(ids, kwargs):
            cache.continued = True

    def post(module, args, kwargs, output):  # its logits in brief: a completion re-runs only the same forward
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor) and cache.marks:
            cache.marks[-1] = logit_mark(output, module, hidden[0] if hidden else None)  # and dtypes, device
        hidden.clear()

    removers = [handle.model.register_forward_pre_hook(pre, with_kwargs=True),
                handle.model.register_forward_hook(post, with_kwargs=True)]
    try:
        yield
    finally:
        stack.close()
        for remover in removers:
            remover.remove()


def run_with_cache(handle: ModelHandle, input_ids: torch.Tensor, names: str | list[str] | None = None
                   ) -> tuple[torch.Tensor, Cache]:
    """Logits and the named activations of one forward pass; with no ``names``, every hook point
    (:func:`~mechkit.hooking.points.all_names`), as TransformerLens' ``run_with_cache`` does (on the nnsight
    backend, every point it serves).

    Caching everything costs memory and time: per layer and token about ``6 * d_model + 3 * n_heads *
    d_head + d_mlp`` floats plus ``n_heads * pos`` for the pattern (on SmolLM2-135M, ~9 MB per layer for a
    100-token prompt; a mixture of experts' ``mlp.hook_expert_out`` adds ``n_experts * d_model`` per routed
    layer and token, and one more pass of its expert bank), and the patterns are computed by eager
    attention in every layer instead of the fused kernel. Name only what you need where memory or speed
    matters.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> logits, cache = run_with_cache(m, m.to_tokens("hello"))
    >>> cache["blocks.1.attn.hook_q"].shape[2:], cache["ln_final.hook_scale"].shape[-1]
    (torch.Size([4, 16]), 1)
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.run_with_cache")
    if names is None:
        names = _every_point(handle)
    with torch.no_grad(), record(handle, names) as cache:
        logits = handle(input_ids)
    return logits, cache


def _refuse_read_only(handle: ModelHandle, points: list[HookPoint]) -> None:
    """A read-only point is computed beside the forward (not on its path): no gradient reaches it, so
    mk.gradients names the activation it is computed from instead of failing in the hook."""
    for p in points:
        if p.suffix in READ_ONLY:
            source = (f"blocks.{handle.anatomy.n_layers - 1}.hook_resid_post" if p.layer < 0 or
                      p.layer >= handle.anatomy.n_layers else f"blocks.{p.layer}.hook_resid_mid")
            raise MechkitError(f"mk.gradients cannot take a gradient at {p.name}: mechkit computes it beside the "
                               "forward, so no gradient flows through it",
                               f"take it at the activation it is computed from, {source}")


def _gradient_points(handle: ModelHandle, names: list[str]) -> list[HookPoint]:
    """The points ``names`` match, each once. A read-only point named itself is refused; one a wildcard
    covers ("ln_final.*", "blocks.0.mlp.*") is left out, as a pattern asks for what can be had, and
    refusing it would refuse every pattern of a model that has one."""
    found: dict[str, HookPoint] = {}
    for name in names:
        matched = resolve(handle.anatomy, name)
        named = [p for p in matched if p.suffix not in READ_ONLY or p.name == canonical(name)]
        _refuse_read_only(handle, named or matched)
        found.update((p.name, p) for p in named)
    return list(found.values())


def _every_point(handle: ModelHandle) -> list[str]:
    """Every hook point the handle's backend records: a traced backend (nnsight) serves fewer, and names
    left out by the user must not refuse the whole call (named ones still do, in :mod:`.traced`)."""
    names = all_names(handle.anatomy)
    if not handle.backend.traced:
        return names
    from mechkit.hooking.traced import ORDER

    return [p.name for name in names for p in resolve(handle.anatomy, name) if p.suffix in ORDER]


def gradients(handle: ModelHandle, names: str | list[str], input_ids: torch.Tensor,
              metric: Callable[[torch.Tensor], torch.Tensor], **kwargs
              ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One forward and backward: ``(metric(logits), {name: (activation, d metric / d activation)})``.

    It turns grad on for its own forward (:func:`mechkit.enable_grad`), also under ``torch.no_grad()``;
    what it returns is detached.

    ``kwargs`` go to the forward (``attention_mask``, ``logits_to_keep``…). On the nnsight backend the
    backward runs inside the trace, so remotely only activations and gradients come back (``metric``
    is shipped by value: keep it to torch and mechkit code).

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> value, grads = gradients(m, "blocks.1.attn.hook_z", m.to_tokens("hi"), lambda logits: logits.sum())
    >>> z, g = grads["blocks.1.attn.hook_z"]
    >>> z.shape == g.shape
    True
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.gradients")
    if not callable(metric):
        raise MechkitError(f"mk.gradients needs a metric function of the logits, not {type(metric).__name__}",
                           "pass e.g. lambda logits: logits[0, -1, token_id]")
    points = _gradient_points(handle, check_names(names, "mk.gradients"))
    if handle.backend.traced:  # its forward goes round ModelHandle.forward's check of the arguments
        input_ids = handle.checked_inputs(input_ids, kwargs)
        return traced.gradients(handle, points, input_ids.to(handle.device), metric, use_cache=False, **kwargs)
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, point: HookPoint) -> torch.Tensor:
        acts[point.name] = act
        return act  # returned, so the module consumes it and gradients reach it

    with enable_grad(), hooks(handle, {p.name: keep for p in points}):
        value = metric(handle(input_ids, **kwargs))
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
            got = f"shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise MechkitError(f"the metric returned {got}" + ("" if not isinstance(value, torch.Tensor) or
                                                              value.numel() != 1 else " that does not depend on the logits"),
                               "return one number computed from the logits, e.g. logits[0, -1, token_id] or .sum()")
        if value.grad_fn is None:  # a leaf of its own: autograd's raw "appears to not have been used in the graph"
            raise MechkitError("the metric returned a number that does not depend on the logits",
                               "return one number computed from the logits, e.g. logits[0, -1, token_id] or .sum()")
        if not value.is_floating_point():  # a complex number has no gradient to follow: a RuntimeError in autograd
            raise MechkitError(f"the metric returned a {str(value.dtype).removeprefix('torch.')} number, and a "
                               "gradient needs a real one", "return a real number, e.g. .abs() or .real of it")
        grads = torch.autograd.grad(value, [acts[p.name] for p in points], allow_unused=True)
    if all(g is None for g in grads):  # autograd's raw "appears to not have been used in the graph" otherwise
        raise MechkitError("the metric does not depend on the logits (no gradient reaches any point named)",
                           "return one number computed from the logits, e.g. logits[0, -1, token_id] or .sum()")
    return value.detach(), {p.name: (acts[p.name].detach(), torch.zeros_like(acts[p.name]) if g is None else g)
                            for p, g in zip(points, grads, strict=True)}
