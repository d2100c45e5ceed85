"""An nnsight model around a HF model or a hub id, and the error every backend refusal raises.

Below both :mod:`mechkit.model.backend` and :mod:`mechkit.model.ndif`, so neither imports the other
for them.
"""

from __future__ import annotations

from typing import Any

from mechkit.errors import MechkitError


class BackendError(MechkitError):
    """A backend, a remote or a pairing of plugin and backend that cannot work."""


def nnsight_model(model_or_id: Any, tokenizer: Any = None, **kwargs) -> Any:
    """nnsight's ``TransformersModel`` of ``model_or_id`` (one line where nnsight is missing)."""
    import warnings

    try:
        from nnsight.modeling.transformers import TransformersModel
    except ImportError as err:
        raise BackendError("the nnsight backend needs the nnsight package",
                           "pip install 'mechkit[interop]' (or pip install 'nnsight>=0.8')") from err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tokenizer is not None:
            return TransformersModel(model_or_id, tokenizer=tokenizer, task="text-generation", **kwargs)
        return TransformersModel(model_or_id, task="text-generation", **kwargs)
