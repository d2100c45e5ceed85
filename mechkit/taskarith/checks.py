"""Checks every task-arithmetic path shares: finite numbers and tensors, and which base model a vector is of.

**Finite.** A NaN or infinite scale, weight or λ, or a tensor holding one, is refused with one line
(:class:`~mechkit.errors.MechkitError`) before anything is computed from it or written: a NaN
model directory or task-vector file is never produced.

**Base identity.** A task vector records the base model it was extracted from (``meta["base"]``:
``spec``, ``name``, ``sha256`` of the weights, the ``dtype`` they were hashed in, and the config's
``architecture`` fields, with ``pruning``: what a physically pruned model keeps, in the dense model's
numbering, or None for a dense model). Two bases are the same model when their sha256 agree; the hashes are only
comparable in one dtype (a bfloat16 copy of float32 weights hashes differently), so across dtypes,
or where one side has no hash (a base given as a directory), the architecture fields decide.
Vectors written before ``dtype`` was recorded were extracted in float32 (``taskvec extract``
always loads the base so). See :func:`base_mismatch`.

>>> import torch
>>> non_finite({"a": torch.ones(2), "b": torch.tensor([1.0, float("nan")])})
('b', 'NaN')
>>> base_mismatch({"sha256": "aa", "dtype": "float32"}, {"sha256": "bb", "dtype": "float32"})
'the weights differ (sha256 aa… vs bb…)'
>>> base_mismatch({"sha256": "aa", "dtype": "float32"}, {"sha256": "bb", "dtype": "bfloat16"}) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mechkit.errors import MechkitError
from mechkit.io import non_finite, refuse_non_finite
from mechkit.model.edit.surgery import CONFIG_KEY

# Config fields that fix a model's parameter names and shapes: two bases must agree on all they share.
ARCH_KEYS = ("model_type", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads",
             "n_head", "num_key_value_heads", "intermediate_size", "head_dim", "vocab_size")
DEFAULT_DTYPE = "float32"  # what a vector without a recorded dtype was hashed in


def finite_number(value: Any, what: str, example: str) -> float:
    """``value`` as a float, or a one-line error when it is not a finite number (NaN, ±inf, text)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise MechkitError(f"{what} is {value!r}, not a finite number", f"pass e.g. {example}")
    return number


def architecture(config: Mapping) -> dict:
    """The :data:`ARCH_KEYS` fields of a model config (a ``config.to_dict()`` or a parsed config.json), and
    ``pruning``: the units a pruned model keeps (its config's pruning entry; None for a dense model).

    Two models pruned from one dense model to the same shape can keep different heads or neurons, so the
    sizes alone do not tell their tensors apart.

    >>> architecture({"model_type": "llama", "num_hidden_layers": 3, "mechkit_pruning": {"n_layers": 3,
    ...     "head_keep": {"1": [0, 2]}, "biased": []}})
    {'model_type': 'llama', 'num_hidden_layers': 3, 'pruning': {'n_layers': 3, 'head_keep': {'1': [0, 2]}}}
    """
    arch = {k: config[k] for k in ARCH_KEYS
            if k in config and (config[k] is None or isinstance(config[k], (str, int, float)))}
    entry = config.get(CONFIG_KEY)
    arch["pruning"] = {k: v for k, v in entry.items() if k in _KEPT_UNITS} if isinstance(entry, Mapping) else None
    return arch


_KEPT_UNITS = ("n_layers", "mlp_keep", "head_keep", "layers_removed")  # what decides a pruned model's tensors


def _pruning_differs(arch_a: Mapping, arch_b: Mapping) -> str | None:
    """Why two architectures are pruned differently (one dense, or other units kept), or None."""
    a, b = arch_a.get("pruning"), arch_b.get("pruning")
    if a == b:
        return None
    if not a or not b:
        return "one is a pruned model, the other is not" if a or b else None
    return "they are pruned differently (other units kept)"


def base_label(base: Mapping) -> str:
    """``tiny:llama (llama, sha256 1a2b3c4d5e6f…)``: how a recorded base is named in a message."""
    name = base.get("spec") or base.get("name") or "an unnamed model"
    arch = base.get("architecture") if isinstance(base.get("architecture"), Mapping) else {}
    details = [str(arch["model_type"])] if arch.get("model_type") else []
    if base.get("sha256"):
        details.append(f"sha256 {str(base['sha256'])[:12]}…")
    return f"{name} ({', '.join(details)})" if details else str(name)


def architecture_mismatch(a: Mapping | None, b: Mapping | None) -> str | None:
    """Why two recorded bases have other architectures (a field both record differs, or they are pruned
    differently), or None: their tensors then differ in names or shapes, so a vector of one can never be
    applied to the other, not even with ``allow_other_base``."""
    arch_a, arch_b = (a or {}).get("architecture"), (b or {}).get("architecture")
    if not isinstance(arch_a, Mapping) or not isinstance(arch_b, Mapping):
        return None
    for key in ARCH_KEYS:
        if key in arch_a and key in arch_b and arch_a[key] != arch_b[key]:
            return f"{key} {arch_a[key]} vs {arch_b[key]}"
    return _pruning_differs(arch_a, arch_b)


def base_mismatch(a: Mapping | None, b: Mapping | None) -> str | None:
    """Why two recorded bases are different models, or None when they agree or cannot be told apart.

    Architecture fields both record must be equal; then the sha256 when both have one and they were
    taken in the same dtype. Nothing recorded on one side: None (a vector made in Python, say).
    """
    if not a or not b:
        return None
    other = architecture_mismatch(a, b)
    if other is not None:
        return other
    sha_a, sha_b = a.get("sha256"), b.get("sha256")
    same_dtype = (a.get("dtype") or DEFAULT_DTYPE) == (b.get("dtype") or DEFAULT_DTYPE)
    if sha_a and sha_b and same_dtype:
        return f"the weights differ (sha256 {str(sha_a)[:12]}… vs {str(sha_b)[:12]}…)" if sha_a != sha_b else None
    from mechkit.taskarith.probe import probes_differ

    if probes_differ(a.get("probe"), b.get("probe")):  # hashes of two dtypes, or none: the values decide
        return "the weights differ (their values, compared across dtypes)"
    return None


__all__ = ["ARCH_KEYS", "architecture", "architecture_mismatch", "base_label", "base_mismatch", "finite_number", "non_finite",
           "refuse_non_finite"]
