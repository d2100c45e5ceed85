"""Steps that read weights (W_O norms, OV circuits, function vectors) run where the weights are.

Natively and on the in-process nnsight backend the weights are here. On a remote model they are on the
server — the client holds the structure only — so :func:`read_weights` sends the step there as one job
(``model.session``): the step, shipped by value, runs on the server's model and only its result (a
layer × head grid, one vector) comes back. ``--remote local`` runs it the same way on a simulated server,
so a step that would reach for mechkit there (a lazy import) fails here first.

A step is ``fn(view, *args)`` where ``view`` has the two attributes weight readers use, ``.model`` (the
HF model) and ``.anatomy``; a :class:`~mechkit.model.handle.ModelHandle` is one. Remote, what travels is
plain data (:func:`~mechkit.model.backends.whitelist.plain`: NDIF refuses ``dataclasses``): the anatomy's sizes and
family paths, and a plain class holding :class:`~mechkit.model.anatomy.Anatomy`'s methods, on which the
server sets the modules of its own model; dataclass arguments arrive as their fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from mechkit.model.anatomy import Anatomy
from mechkit.model.backends.whitelist import plain

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

T = TypeVar("T")


def read_weights(handle: ModelHandle, fn: Callable[..., T], *args: Any) -> T:
    """``fn(handle, *args)`` where the model's weights are (here, or as one job on its server).

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:gpt2")
    >>> read_weights(m, lambda view: view.anatomy.n_layers)
    2
    """
    backend = handle.backend
    if not getattr(backend, "remote", None):
        return fn(handle, *args)
    a = handle.anatomy
    sizes = {f.name: getattr(a, f.name) for f in fields(a) if f.name not in ("family", "layers", "embed", "final_norm")}
    return backend.call(_on_server, sizes, plain(a.family), _anatomy_class(), fn, plain(args))


def _anatomy_class() -> type:
    """A plain class with :class:`~mechkit.model.anatomy.Anatomy`'s methods (not its dataclass machinery)."""
    members = {name: member for name, member in vars(Anatomy).items()
               if not name.startswith("__") and (callable(member) or isinstance(member, property))}
    return type("AnatomyView", (), members)


def _on_server(lm: Any, sizes: dict, family: Any, view: type, fn: Callable, args: tuple) -> Any:
    """Run on the server: an anatomy over the server's model, its modules found by path."""
    model = lm._module
    anatomy = view()
    for name, value in sizes.items():
        setattr(anatomy, name, value)
    anatomy.family = family
    anatomy.layers = list(model.get_submodule(family.layers))
    anatomy.embed = model.get_submodule(family.embed)
    anatomy.final_norm = dict(model.named_modules()).get(family.final_norm)
    return fn(SimpleNamespace(model=model, anatomy=anatomy), *args)
