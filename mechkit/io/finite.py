"""Nothing non-finite is written: the check every tensor writer makes before it creates a file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    import torch


def non_finite(tensors: Mapping[str, torch.Tensor]) -> tuple[str, str] | None:
    """The first ``(name, "NaN" | "inf")`` among floating-point tensors holding a non-finite entry, else None."""
    import torch

    for name, t in tensors.items():
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            return name, "NaN" if bool(torch.isnan(t).any()) else "inf"
    return None


def refuse_non_finite(tensors: Mapping[str, torch.Tensor], path: Any, fix: str) -> None:
    """Raise before ``path`` is written when one of ``tensors`` holds NaN or inf."""
    bad = non_finite(tensors)
    if bad is not None:
        raise MechkitError(f"refusing to write {path}: tensor {bad[0]} holds {bad[1]} values", fix)
