"""mechkit recordings as TransformerLens ``ActivationCache`` objects, so TL's own tools run on them.

mechkit's hook names are TransformerLens' names for the same activations, so the conversion is the
recording itself, batch dimension kept, handed to ``ActivationCache`` with a ``TransformerBridge`` over
the same model (built once per model from a copy: :func:`mechkit.model.transformer_lens.to_transformer_lens`).
TL's logit lens (``accumulated_resid``), direct logit attribution (``decompose_resid``,
``stack_head_results(apply_ln=True)``) and patching helpers then work on it: what those tools read and
the recording lacks (:data:`TL_NEEDS`: every block's residual stream, attention and MLP outputs, head
outputs and the final norm's scale) is recorded on conversion, by running the recorded forwards again
(native backend; the recording keeps their token ids), so a recording of two names converts to a cache
TL's tools can use. The conversion costs one forward per recorded forward, and only when something is missing.
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
    """What a conversion reads of a recording (a :class:`mechkit.hooking.cache.Cache`): its activations by
    hook name and the model recorded. Named by its shape, since ``Cache`` converts itself through this module."""

    handle: ModelHandle | None

    def items(self) -> Iterable[tuple[str, torch.Tensor]]: ...

TL_NEEDS = ("hook_embed", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_mid", "blocks.*.hook_resid_post",
            "blocks.*.attn.hook_z", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out", "ln_final.hook_scale")

_BRIDGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bridge_for(handle: ModelHandle) -> Any:
    """The ``TransformerBridge`` of ``handle``'s model, built on first use and kept while the model lives."""
    bridge = _BRIDGES.get(handle.model)
    if bridge is None:
        bridge = _BRIDGES[handle.model] = to_transformer_lens(handle)
    return bridge


def activation_cache(cache: Recording, model: Any = None, extra: dict | None = None) -> Any:
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
    elif not hasattr(model, "cfg"):  # a str or a number was taken, then AttributeError at the first TL method
        raise MechkitError(f"model= is a {type(model).__name__}, not a TransformerLens model",
                           "pass a TransformerBridge or HookedTransformer (mk.to_transformer_lens(m)), or leave it out")
    found = {name: tensor for name, tensor in cache.items()}
    found.update({name: t for name, t in (extra or {}).items() if name not in found})
    return ActivationCache(found, model, has_batch_dim=True)
