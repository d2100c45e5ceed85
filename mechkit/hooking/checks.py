"""What the hook API accepts, checked where it is called: one line naming the argument, not a TypeError from
deep inside a loop, and a replacement of the wrong shape named at its hook point, not a size mismatch from
the layer that reads it.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Iterator, KeysView, Mapping
from typing import Any

import torch

from mechkit.errors import MechkitError


def _callables(value: Any, where: str, example: str, args: tuple[str, ...] = ()) -> list[Callable]:
    fns = value if isinstance(value, (list, tuple)) else [value]
    bad = [f for f in fns if not callable(f)]  # a list, not next(..., None): [None] was taken for "none bad"
    if bad or not fns:
        got = "an empty list" if not fns else f"a {type(bad[0]).__name__}"
        raise MechkitError(f"{where} maps to {got}, not a function", f"give a function or a list of them, {example}")
    odd = next((f for f in fns if args and not _takes(f, len(args))), None)
    if odd is not None:  # else a TypeError from inside the forward, at the first hook point
        shown, name = ", ".join(args), getattr(odd, "__name__", type(odd).__name__)
        if _signature(odd) is None:
            import sys

            module = getattr(odd, "__module__", None)
            # torch.relu is reachable as torch.relu; a partial or an instance is the user's object, named by them
            reachable = isinstance(module, str) and getattr(sys.modules.get(module), str(name), None) is odd
            import numpy as np

            if isinstance(odd, np.ufunc) and getattr(torch, str(name), None) is not None:
                module, reachable = "torch", True  # NumPy's would turn the tensor into an array: torch's takes it
            # its other arguments (softmax's dim) cannot be read either: the call says where they go
            call = f"{'' if module == 'builtins' else module + '.'}{name}({args[0]})" if reachable \
                else f"your_callable({args[0]})"
            raise MechkitError(f"{where} maps to {name}, whose arguments cannot be read, so it cannot be checked "
                               f"to take ({shown})", f"wrap it in a function: def fn({shown}): return {call}"
                               + (f", adding any other argument {name} needs (softmax's dim=-1, say)"
                                  if "your_callable" not in call else ""))
        if isinstance(odd, torch.nn.Module):  # an SAE or a probe: its forward takes the activation alone
            raise MechkitError(f"{where} maps to the module {name}, whose forward cannot be called as fn({shown})",
                               f"call it from a function: def fn({shown}): return your_module({args[0]})")
        raise MechkitError(f"{where} maps to {name}, which cannot be called as fn({shown})",
                           f"define it as def fn({shown}): ... (return None to only read)")
    return list(fns)


def _signature(fn: Callable) -> Any:
    """What ``fn`` is called with, or ``None`` where that cannot be read: a C function, a ``__signature__`` that
    raises, and a NumPy ufunc (its signature binds a second argument to ``out=``). An ``nn.Module`` (an SAE
    used as a hook) is called through its ``forward``, whose signature ``Module.__call__``'s ``*args`` hid."""
    import inspect

    import numpy as np

    if isinstance(fn, np.ufunc):
        return None
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return inspect.signature(target)
    except Exception:  # a builtin or C function (TypeError, ValueError); a __signature__ that raises
        return None


def _takes(fn: Callable, n: int) -> bool:
    """Whether ``fn`` accepts ``n`` positional arguments; ``False`` where its signature cannot be read: a C
    function such as ``torch.relu`` then failed at the first forward with a raw TypeError, and none of them
    takes an activation and a hook point (the fix wraps it in a function that does)."""
    signature = _signature(fn)
    if signature is None:
        return False
    try:
        signature.bind(*([None] * n))
    except TypeError:
        return False
    return True


def check_hook_fns(fns: Any, who: str, args: tuple[str, ...] = ()) -> dict[str, list[Callable]]:
    """``{hook name: [fn, ...]}`` from ``{name: fn or [fn, ...]}``, refused in one line when it is not that;
    with ``args`` (``("act", "hook")``) also a function that cannot be called with that many arguments."""
    example = "e.g. {\"blocks.0.hook_resid_post\": fn}"
    if not isinstance(fns, Mapping):
        raise MechkitError(f"{who} takes a dict of hook names to functions, not {type(fns).__name__}",
                           f"pass {example}")
    out = {}
    for name, value in fns.items():
        if not isinstance(name, str):
            raise MechkitError(f"{who}: hook name {name!r} is not text", f"name hook points as text, {example}")
        out[name] = _callables(value, f"{who}: {name!r}", example, args)
    return out


def check_layer_fns(fns: Any, n_layers: int, who: str, args: tuple[str, ...] = ()) -> dict[int, list[Callable]]:
    """``{layer: [fn, ...]}`` from ``{layer: fn or [fn, ...]}``, every layer one of the model's; with ``args``
    (``("pattern",)``) also a function that cannot be called with that many arguments (a TypeError at the
    first forward otherwise)."""
    example = "e.g. {0: [fn]}"
    if not isinstance(fns, Mapping):
        raise MechkitError(f"{who} takes a dict of layers to functions, not {type(fns).__name__}", f"pass {example}")
    out = {}
    for layer, value in fns.items():
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not 0 <= layer < n_layers:
            raise MechkitError(f"{who}: layer {layer!r} is not one of the model's layers (0–{n_layers - 1})",
                               f"key the functions by layer index, {example}")
        out[int(layer)] = _callables(value, f"{who}: layer {layer}", example, args)  # a NumPy integer as the layer it names
    return out


def check_names(names: Any, who: str) -> list[str]:
    """Hook names as a list: one name, or a list, tuple, set, dict keys view or generator of names (text).
    A mapping (a cache, a dict of hook functions) is refused: its values would be ignored."""
    listed = [names] if isinstance(names, str) else names
    if isinstance(listed, set | frozenset):  # a set of names is as clear as a list (pass 13: it was refused)
        listed = sorted(listed, key=str)
    elif isinstance(listed, KeysView | Iterator):  # another cache's names (cache.keys()), a generator of them
        listed = list(listed)
    if not isinstance(listed, (list, tuple)) or not listed or not all(isinstance(n, str) for n in listed):
        shown = repr(names) if isinstance(names, (list, tuple, set, frozenset, str)) else type(names).__name__
        hint = " (for its names, pass list(it))" if isinstance(names, Mapping) else ""
        raise MechkitError(f"{who} takes a hook name or a list of them, not {shown}"[:200].replace("\n", " ") + hint,
                           "pass e.g. \"blocks.*.attn.hook_z\" or [\"blocks.0.hook_resid_post\"]")
    return list(listed)


def same_shape(fn: Callable, where: str) -> Callable:
    """``fn`` whose replacement (a tensor it returns) must have the activation's shape: refused naming the
    hook point otherwise, where the layer reading it would fail with a size mismatch (or, broadcast,
    silently compute on something else), and in the activation's dtype and device (:func:`_as_activation`).
    Attributes (such as a read-only mark) are kept."""
    @functools.wraps(fn)
    def checked(act: torch.Tensor, *rest: Any) -> Any:
        new = fn(act, *rest)
        if new is None:
            return None
        if not isinstance(new, torch.Tensor):
            raise MechkitError(f"the function on {where} returned a {type(new).__name__}, not a tensor",
                               "return a tensor of the activation's shape to replace it, or None to only read")
        if new.shape != act.shape:
            raise MechkitError(f"the function on {where} returned shape {list(new.shape)}; the activation there "
                               f"is {list(act.shape)}", "return a tensor of the same shape, or None to only read")
        return _as_activation(new, act, where)

    return checked


def _as_activation(new: torch.Tensor, act: torch.Tensor, where: str) -> torch.Tensor:
    """A replacement of another floating dtype or device, as the activation's: the next layer multiplies it
    with weights of the activation's dtype, and a float64 ``t.double()`` or a NumPy round trip failed there
    ("expected m1 and m2 to have the same dtype", a RuntimeError); the model can only carry it at that
    precision anyway. Integers, booleans or complex numbers for a floating activation (or floats for an
    integer one: a router's expert ids) are refused, not rounded. A replacement without values of its own (on
    the meta device) or not a plain dense tensor (sparse, MKL-DNN, nested) is refused too: the copy or the next
    layer failed on it with a NotImplementedError or a RuntimeError about its layout."""
    refuse_no_values(new, act, where)
    if new.dtype == act.dtype and new.device == act.device:
        return new
    if act.is_floating_point() != new.is_floating_point() or new.is_complex() != act.is_complex():
        raise MechkitError(f"the function on {where} returned {str(new.dtype).removeprefix('torch.')} values; the "
                           f"activation there is {str(act.dtype).removeprefix('torch.')}",
                           "return values of the activation's kind (new.to(act.dtype)), or None to only read")
    return new.to(device=act.device, dtype=act.dtype)


def refuse_no_values(new: torch.Tensor, act: torch.Tensor, where: str) -> None:
    """One line where a hook's replacement has no values to compute with (the meta device, while the activation
    has values) or is not a plain dense tensor (sparse, MKL-DNN, nested): the model cannot run on it."""
    fix = "return a plain tensor with values (new.to_dense(), a tensor on the activation's device), or None to only read"
    if new.device.type == "meta" and act.device.type != "meta":
        raise MechkitError(f"the function on {where} returned a tensor on the meta device (no values)", fix)
    if new.layout != torch.strided or new.is_nested:
        kind = "nested" if new.is_nested else str(new.layout).removeprefix("torch.").removeprefix("_")
        raise MechkitError(f"the function on {where} returned a {kind} tensor, not a plain dense one", fix)
