"""Hook functions inside an nnsight trace: how :func:`mechkit.hooks` runs on the nnsight backend.

Each forward is one trace. The active hook functions become a :class:`TraceProgram`: the hook points in the
order the forward reaches them (per layer: block input, attention pattern, head outputs, attention
output, MLP neurons, MLP output, block output), each read from the module it names — an input, an
output, or for patterns the attention call inside the attention module, reached through nnsight's
``.source`` — and written back where a function returns a replacement. Patterns are computed there
from post-RoPE q and k by the family's eager attention (the function the native backend uses, found in
the model where it runs), so no server needs eager attention configured.

Remote, the plan is shipped by value and runs on the server; every hook point's activation comes back
with the result and the functions are called again here, on it, in the same order, so what they record
or count (a cache, score sums, a random generator's state) ends up here exactly as after a local run.
Functions marked :func:`reads_only` (``record``'s) are not shipped at all, only their activations;
functions marked :func:`pure` (no side effects: an ablation's zeroing) are shipped and never replayed, so
their activations stay on the server. A plan's ``reduce`` turns the output into what comes back (per-row
metrics instead of logits), so a remote job returns kilobytes, not the vocabulary at every position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange

from mechkit.hooking.attention import additive_mask, attend, effective_pattern
from mechkit.hooking.points import HookPoint

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

# Where each hook point sits in a block's forward, in the order the forward reaches it.
ORDER = {"hook_embed": 0, "hook_resid_pre": 0, "attn.hook_pattern": 1, "attn.hook_z": 2, "hook_attn_out": 3, "mlp.hook_post": 4,
         "hook_mlp_out": 5, "hook_resid_post": 6}


def reads_only(fn: Callable) -> Callable:
    """Mark a hook function that only reads (never returns a replacement): a remote trace sends its
    activation back instead of shipping the function.

    Marks are read here when a plan is shipped (:meth:`Site.__getstate__`), never on the server: nnsight
    0.8 ships a function as its source and globals, without its attributes (and has no purity mark of
    its own; its ``nnsight.register`` is by-value shipping, which :mod:`mechkit.model.backends.nnsight_backend` does)."""
    fn.mechkit_reads_only = True
    return fn


def pure(fn: Callable) -> Callable:
    """Mark a hook function without side effects (it only returns a replacement): where every function
    of a hook point is pure, a remote trace runs them on the server and neither sends the activation
    back nor calls them again here."""
    fn.mechkit_pure = True
    return fn


def envoy_at(root: Any, path: str) -> Any:
    """The envoy of the module at ``path``. ``root.get`` reads each part as an attribute, and a module named
    like one of nnsight's own attributes (BERT-style layers' ``output``) would resolve to the live value
    instead: such a part is looked up among the envoy's children."""
    if not any(part in ("output", "input", "inputs", "source") for part in path.split(".")):
        return root.get(path)
    envoy = root
    for part in path.split("."):
        children = dict(envoy._named_children())
        envoy = children[part] if part in children else getattr(envoy, part)
    return envoy


def _beside(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return new if new.device == old.device else new.to(old.device)


class Site:
    """One hook point as a trace reaches it: the module (by path), what of it, and its functions.

    Plain classes (this, :class:`TraceProgram`, :class:`GradTraceProgram`), never dataclasses: they are shipped by value
    and NDIF refuses a request naming ``dataclasses`` (:mod:`mechkit.model.backends.whitelist`)."""

    def __init__(self, point: HookPoint, path: str, where: str, d_head: int | None = None, op: str | None = None,
                 lookup: str | None = None, fns: list | None = None) -> None:
        self.point, self.path, self.where = point, path, where  # where: "input", "output" or "pattern"
        self.d_head = d_head  # split the input into heads (hook_z)
        self.op = op  # patterns: the attention call inside the attention module
        self.lookup = lookup  # patterns: the lookup of that function, whose default is the eager one
        self.fns = [] if fns is None else fns

    def __repr__(self) -> str:
        return f"Site({self.point.name!r}, {self.path!r}, {self.where!r}, fns={len(self.fns)})"

    def __getstate__(self) -> dict:
        """What is shipped: the hook point as plain data (the functions get it as their ``point``), and
        no function that only reads (its activation comes back instead)."""
        state = dict(self.__dict__)
        state["point"] = SimpleNamespace(name=self.point.name, layer=self.point.layer, suffix=self.point.suffix)
        shipped = [fn for fn in self.fns if not getattr(fn, "mechkit_reads_only", False)]
        state["fns"] = shipped
        # Read the marks here: nnsight ships a function as its source and globals, not its attributes.
        state["pure"] = bool(shipped) and all(getattr(fn, "mechkit_pure", False) for fn in shipped)
        return state

    def visit(self, root: Any, store: dict, replay: bool) -> None:
        module = envoy_at(root, self.path)
        if self.where == "pattern":
            self._pattern(module, store, replay)
        elif self.where == "input":
            x = module.input
            new = self.apply(self.view(x), store, replay)
            if new is not None:
                module.input = _beside(self.unview(new), x)
        else:
            out = module.output
            x = out[0] if isinstance(out, tuple | list) else out  # OpenAI GPT's blocks return lists
            new = self.apply(x, store, replay)
            if new is not None:
                new = _beside(new, x)
                module.output = [new, *out[1:]] if isinstance(out, list) else \
                    (new, *out[1:]) if isinstance(out, tuple) else new

    def view(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.d_head is None else rearrange(x, "b p (h d) -> b p h d", d=self.d_head)

    def unview(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.d_head is None else rearrange(x, "b p h d -> b p (h d)")

    def apply(self, x: torch.Tensor, store: dict, replay: bool) -> torch.Tensor | None:
        """Run the functions on ``x`` (a replacement or None); remote, keep ``x`` for the replay here."""
        # A site of pure functions only (``pure``, set when shipped) stays on the server; any other (read-only
        # ones were not even shipped, so a site with none left had only those) sends its activation back.
        if replay and not getattr(self, "pure", False):
            store[self.point.name] = x.detach().clone()
        changed = False
        for fn in self.fns:
            if replay and getattr(fn, "mechkit_reads_only", False):
                continue
            new = fn(x, self.point)
            if new is not None:
                x, changed = new, True
        return x if changed else None

    def _pattern(self, module: Any, store: dict, replay: bool) -> None:
        """The pattern by the family's eager attention on the call's post-RoPE q, k, v, as natively
        (:func:`~mechkit.hooking.attention.eager_attention`). That function is found where the model is:
        the default the attention forward passes to its attention-function lookup (transformers'
        ``ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)``), so the request
        names nothing of transformers and needs no eager attention configured on the server."""
        source = module.source
        found, named = getattr(source, self.lookup).inputs
        eager = found[1] if len(found) > 1 else named["default"]
        call = getattr(source, self.op)
        args, kwargs = call.inputs
        args, kwargs = list(args), dict(kwargs)
        names = ("module", "query", "key", "value", "attention_mask")
        parts = [args[i] if i < len(args) else kwargs.pop(names[i], None) for i in range(5)]
        attn_module, query, key, value, mask = parts
        kwargs.pop("is_causal", None)
        out, weights = eager(attn_module, query, key, value, additive_mask(mask, query, key), **kwargs)
        weights = effective_pattern(weights, out, query, value)
        new = self.apply(weights, store, replay)
        if new is not None:
            weights, out = new, attend(new, query, value)
        call.skip((out, weights))  # the model's own kernel is not run again

    def replay(self, store: dict) -> None:
        """Call the functions here on the activation the server saw (their side effects land here)."""
        x = store.get(self.point.name)
        if x is None:
            return
        for fn in self.fns:
            new = fn(x, self.point)
            if new is not None:
                x = new


class TraceProgram:
    """The sites of one forward, in the order the forward reaches them; shipped by value when remote.
    ``reduce`` turns the logits into what comes back instead of the model output."""

    def __init__(self, sites: list[Site], replay: bool = False, reduce: Callable | None = None) -> None:
        self.sites, self.replay, self.reduce = sites, replay, reduce

    def modules(self) -> set[str]:
        """The Python modules the shipped functions come from (packages a server lacks go by value)."""
        fns = [fn for site in self.sites for fn in site.fns] + [self.reduce]
        return {_module_of(fn) for fn in fns if fn is not None}

    def run(self, root: Any, store: dict) -> None:
        for site in self.sites:
            site.visit(root, store, self.replay)

    def finish(self, output: Any, store: dict) -> Any:
        return output if self.reduce is None else self.reduce(output.logits)

    def after(self, store: dict, output: Any) -> Any:
        if self.replay:
            for site in self.sites:
                site.replay(store)
        return output


class GradTraceProgram(TraceProgram):
    """Activations at the sites and the gradient of ``metric(logits)`` with respect to them, taken
    inside the trace (on the server when remote): what attribution patching needs. ``reduce_grads``
    maps ``(value, {name: (activation, gradient)})`` to what comes back instead."""

    def __init__(self, sites: list[Site], replay: bool = False, reduce: Callable | None = None,
                 metric: Callable | None = None, reduce_grads: Callable | None = None) -> None:
        self.sites, self.replay, self.reduce = sites, replay, reduce
        self.metric, self.reduce_grads = metric, reduce_grads

    def modules(self) -> set[str]:
        return {_module_of(fn) for fn in (self.metric, self.reduce_grads) if fn is not None}

    def run(self, root: Any, store: dict) -> None:
        acts = store.setdefault("acts", {})
        for site in self.sites:
            module = envoy_at(root, site.path)
            if site.where == "input":
                acts[site.point.name] = module.input
            else:
                out = module.output
                acts[site.point.name] = out[0] if isinstance(out, tuple | list) else out

    def finish(self, output: Any, store: dict) -> Any:
        acts = store.pop("acts")
        value = self.metric(output.logits)
        grads = torch.autograd.grad(value, [acts[s.point.name] for s in self.sites])
        found = {s.point.name: (s.view(acts[s.point.name]).detach(), s.view(g))
                 for s, g in zip(self.sites, grads, strict=True)}
        if self.reduce_grads is not None:  # only the reduction travels back
            store["reduced"] = self.reduce_grads(value.detach(), found)
        else:
            store["value"], store["grads"] = value.detach(), found
        return None  # the logits stay where they are

    def after(self, store: dict, output: Any) -> Any:
        return store["reduced"] if self.reduce_grads is not None else (store["value"], store["grads"])


def _module_of(fn: Any) -> str:
    """The module a shipped callable (a function or an instance of a class) comes from."""
    return getattr(fn, "__module__", None) or getattr(type(fn), "__module__", None) or ""


class Planner:
    """Turns a handle's active ``(point, fn)`` entries into a :class:`TraceProgram`; module paths found once."""

    def __init__(self, handle: ModelHandle) -> None:
        a = handle.anatomy
        self.anatomy = a
        names = {id(m): n for n, m in handle.model.named_modules()}
        self.paths: dict[str, str] = {}
        for layer in range(a.n_layers):
            dense = () if a.is_moe else (("mlp.hook_post", a.mlp_out(layer)),)  # MoE: no dense neurons
            for suffix, module in (("hook_resid_pre", a.block(layer)), ("attn.hook_pattern", a.attn(layer)),
                                   ("attn.hook_z", a.attn_out(layer)), ("hook_attn_out", a.attn(layer)),
                                   *dense, ("hook_mlp_out", a.mlp_output(layer)), ("hook_resid_post", a.block(layer))):
                self.paths[f"blocks.{layer}.{suffix}"] = names[id(module)]
        self.paths["hook_embed"] = names[id(a.embed)]
        self.remote = handle.backend.remote is not None
        self._ops: tuple[str, str] | None = None
        self._backend = handle.backend

    def attention_call(self) -> tuple[str, str]:
        """The names nnsight gives, inside an attention forward, the lookup of the attention function
        (``ALL_ATTENTION_FUNCTIONS_get_interface_0``: its default is the family's eager attention) and the
        call of it (the last ``attention_interface_N``: ``_0`` is the lookup's result, the call comes after)."""
        if self._ops is None:
            envoy = envoy_at(self._backend.lm, self.paths["blocks.0.attn.hook_pattern"])
            names = envoy.source.names
            calls = [n for n in names if n.startswith("attention_interface_")]
            lookups = [n for n in names if "get_interface" in n]
            if not calls or not lookups:
                from mechkit.errors import MechkitError

                raise MechkitError(f"{type(self.anatomy.attn(0)).__name__} calls no attention function nnsight can reach",
                                   "read patterns with --backend native")
            self._ops = (lookups[0], max(calls, key=lambda n: int(n.rsplit("_", 1)[1])))
        return self._ops

    def sites(self, points: list[HookPoint]) -> list[Site]:
        unserved = sorted({p.suffix for p in points if p.suffix not in ORDER})
        if unserved:
            from mechkit.errors import MechkitError

            raise MechkitError(f"{', '.join(unserved)} {'is' if len(unserved) == 1 else 'are'} not served by the "
                               f"{self._backend.describe()} backend yet", "use --backend native for these hook points")
        out = []
        for point in sorted(points, key=lambda p: (p.layer, ORDER[p.suffix])):
            where = {"hook_resid_pre": "input", "attn.hook_z": "input", "mlp.hook_post": "input",
                     "attn.hook_pattern": "pattern"}.get(point.suffix, "output")
            path = self.paths[point.name]
            if where == "pattern" and self.anatomy.family.pattern == "softmax":
                from mechkit.errors import MechkitError

                raise MechkitError(f"{self.anatomy.family_name} computes its pattern with an inline softmax, which an "
                                   "nnsight trace cannot reach", "read patterns with --backend native")
            if where == "pattern" and self.anatomy.family.pattern is not None:  # inline attention: its pattern module
                where, path = "output", f"{path}.{self.anatomy.family.pattern}"
            lookup, op = self.attention_call() if where == "pattern" else (None, None)
            out.append(Site(point, path, where,
                            d_head=self.anatomy.head_size(point.layer) if point.suffix == "attn.hook_z" else None, op=op, lookup=lookup))
        return out

    def __call__(self, entries: list[tuple[HookPoint, Callable]]) -> TraceProgram:
        by_name: dict[str, tuple[HookPoint, list]] = {}
        for point, fn in entries:
            by_name.setdefault(point.name, (point, []))[1].append(fn)
        sites = self.sites([p for p, _ in by_name.values()])
        for site in sites:
            site.fns = by_name[site.point.name][1]
        return TraceProgram(sites, replay=self.remote)


def planner(handle: ModelHandle) -> Planner:
    backend = handle.backend
    if not isinstance(backend.planner, Planner):
        backend.planner = Planner(handle)
    return backend.planner


@contextlib.contextmanager
def active(handle: ModelHandle, entries: list[tuple[HookPoint, Callable]]) -> Iterator[None]:
    """Add ``entries`` to the functions every trace of ``handle`` runs, until the context exits."""
    backend = handle.backend
    planner(handle)
    backend.entries.extend(entries)
    try:
        yield
    finally:
        ids = {id(e) for e in entries}
        backend.entries[:] = [e for e in backend.entries if id(e) not in ids]


def gradients(handle: ModelHandle, points: list[HookPoint], input_ids: torch.Tensor, metric: Callable,
              **kwargs) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """``(metric value, {name: (activation, gradient)})`` from one trace (see :func:`mechkit.hooking.gradients`)."""
    plan = GradTraceProgram(planner(handle).sites(points), metric=metric)
    with torch.enable_grad():
        return handle.backend.run(input_ids, plan, **kwargs)
