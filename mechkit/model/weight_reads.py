"""Steps that read weights (W_O norms, OV circuits, function vectors) run where the weights are.

Natively and on the in-process nnsight backend the weights are here. On a remote model they are on the
server — the client holds the structure only — so :func:`read_weights` sends the step there as one job
(``model.session``): the step, shipped by value, runs on the server's model and only its result (a
layer × head grid, one vector) comes back. ``--remote local`` runs it the same way on a simulated server,
so a step that would reach for mechkit there (a lazy import) fails here first.

A step is ``fn(view, *args)`` where ``view`` has the two attributes weight readers use, ``.model`` (the
HF model) and ``.anatomy``; a :class:`~mechkit.model.handle.ModelHandle` is one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

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
    shell = replace(handle.anatomy, layers=[], embed=None, final_norm=None)  # the shape, not the modules
    return backend.call(_on_server, shell, fn, args)


def _on_server(lm: Any, shell: Any, fn: Callable, args: tuple) -> Any:
    """Run on the server: the anatomy's modules found again in the server's model, by path."""
    model = lm._module
    family = shell.family
    anatomy = replace(shell, layers=list(model.get_submodule(family.layers)),
                      embed=model.get_submodule(family.embed),
                      final_norm=dict(model.named_modules()).get(family.final_norm))
    return fn(SimpleNamespace(model=model, anatomy=anatomy), *args)
