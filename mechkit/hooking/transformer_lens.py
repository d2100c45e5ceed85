"""mechkit recordings as TransformerLens ``ActivationCache`` objects, so TL's own tools run on them.

mechkit's hook names are TransformerLens' names for the same activations, so the conversion is the
recording itself, batch dimension kept, handed to ``ActivationCache`` with a ``TransformerBridge`` over
the same model (built once per model from a copy: :func:`mechkit.model.transformer_lens.to_transformer_lens`).
TL's logit lens (``accumulated_resid``), direct logit attribution (``decompose_resid``,
``stack_head_results``… where they need only recorded points) and patching helpers then work on it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from mechkit.errors import MechkitError
from mechkit.model.transformer_lens import to_transformer_lens

if TYPE_CHECKING:
    import torch

    from mechkit.model.handle import ModelHandle


class Recording(Protocol):
    """What a conversion reads of a recording (a :class:`mechkit.hooking.core.Cache`): its activations by
    hook name and the model recorded. Named by its shape, since ``Cache`` converts itself through this module."""

    handle: ModelHandle | None

    def items(self) -> Iterable[tuple[str, torch.Tensor]]: ...

_BRIDGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bridge_for(handle: ModelHandle) -> Any:
    """The ``TransformerBridge`` of ``handle``'s model, built on first use and kept while the model lives."""
    bridge = _BRIDGES.get(handle.model)
    if bridge is None:
        bridge = _BRIDGES[handle.model] = to_transformer_lens(handle)
    return bridge


def activation_cache(cache: Recording, model: Any = None) -> Any:
    """``cache`` as a TL ``ActivationCache`` over ``model`` (default: the bridge of the recorded model).
    (The example needs TransformerLens, the ``interop`` extra, so it is not run by the doctest suite.)

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:gpt2")
    >>> with mk.record(m, "blocks.*.hook_resid_post") as cache:
    ...     _ = m(m.to_tokens("hello"))
    >>> tl = cache.to_transformer_lens()  # doctest: +SKIP
    >>> tl.accumulated_resid(layer=2).shape  # doctest: +SKIP
    """
    from mechkit.model.transformer_lens import check_version

    check_version()
    from transformer_lens.ActivationCache import ActivationCache

    if model is None:
        if cache.handle is None:
            raise MechkitError("this recording does not know its model", "pass model= (a TransformerBridge)")
        model = bridge_for(cache.handle)
    return ActivationCache({name: tensor for name, tensor in cache.items()}, model, has_batch_dim=True)
