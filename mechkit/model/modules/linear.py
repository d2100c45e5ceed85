"""One view of a projection's weight, whatever the module type.

GPT-2's ``Conv1D`` stores ``[in, out]`` where ``nn.Linear`` stores ``[out, in]``; analyses that
zero "the input columns of the output projection" should not care. :func:`weight_out_in`
returns a view in ``[out, in]`` layout that shares storage, so in-place edits reach the module.
"""

from __future__ import annotations

import torch
from torch import nn


def is_transposed(module: nn.Module) -> bool:
    """True for modules storing their weight as ``[in, out]`` (GPT-2 Conv1D)."""
    return not isinstance(module, nn.Linear) and hasattr(module, "nf") and hasattr(module, "weight")


def weight_out_in(module: nn.Module) -> torch.Tensor:
    """The weight as an ``[out_features, in_features]`` view sharing the module's storage.

    A weight accelerate offloaded (a ``meta`` parameter) is read from where its hook keeps it: a
    copy, for reading — edit weights through :class:`mechkit.interventions.WeightEdits`.
    """
    w = module.weight
    if w.device.type == "meta":
        from mechkit.model.backends.ndif import refuse_remote_weights
        from mechkit.model.placement.stored import module_tensor

        refuse_remote_weights(module)

        w = module_tensor(module)
    return w.t() if is_transposed(module) else w
