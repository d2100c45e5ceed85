"""The peak memory a report records: what a user needs to size the next run on this machine."""

from __future__ import annotations

import contextlib
from pathlib import Path


def reset_memory_peaks() -> None:
    """Start the peak-memory counters afresh — the kernel's RSS high-water mark (Linux
    ``/proc/self/clear_refs``) and each CUDA device's — so the report's peaks are this run's."""
    import torch

    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    # Before CUDA's first use in this process there is nothing to reset, and torch refuses the call
    # ("Invalid device argument"); asking must not start CUDA in a run that may stay on the CPU.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            with contextlib.suppress(RuntimeError):  # a device this process never used: nothing to reset
                torch.cuda.reset_peak_memory_stats(i)


def _rss_high_water_mb() -> float:
    """The process's resident-memory high-water mark: ``VmHWM`` (reset per run) where Linux gives it,
    else ``ru_maxrss`` (the whole process's life)."""
    import resource
    import sys

    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return round(int(line.split()[1]) / 2**10, 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)


def memory_peaks() -> dict:
    """``peak_rss_mb``: the process's peak resident memory during the run (model loading and the
    model's weights included), and on CUDA ``peak_cuda{i}_mb``, each used device's peak allocated
    memory — what a user needs to size the next run."""
    import torch

    out = {"peak_rss_mb": _rss_high_water_mb()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # a run that never used CUDA: no peaks
        for i in range(torch.cuda.device_count()):
            try:
                peak = torch.cuda.max_memory_allocated(i)
            except RuntimeError:  # as above: a device never used holds no peak
                continue
            if peak > 0:
                out[f"peak_cuda{i}_mb"] = round(peak / 2**20, 1)
    return out
