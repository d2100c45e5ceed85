"""How devices are spelled — torch's way, accelerate's (GPUs as integers) — and which one runs a map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


OFFLOADED = ("cpu", "disk")  # "cpu" offloads only when the main device is an accelerator


def to_accelerate(device: str) -> str | int:
    """accelerate spells GPUs as integers in its maps and memory limits."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else device


def from_accelerate(device: Any) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def torch_device(device: Any) -> torch.device:
    import torch

    if isinstance(device, int):
        kind = "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cuda"
        return torch.device(kind, device)
    return torch.device(device)


def main_device(device_map: Mapping[str, str]) -> str:
    """The device that runs offloaded modules and receives the inputs: the first one not offloaded."""
    return next((d for d in device_map.values() if d not in OFFLOADED), "cpu")
