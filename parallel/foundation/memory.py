"""What a rank's memory may hold (its budget) and what building the model costs it: the growth of its peak memory while the model is built, sharded and
materialised. Peak resident set on CPU (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``), peak
allocated bytes on CUDA."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a function runs: validation reads rank_budget_bytes
    import torch


def rank_budget_bytes(*, device_memory_gb: float, memory_fraction: float) -> float:
    """Memory one rank may use: topology.device_memory_gb x planner.memory_fraction (the planner's budget, the
    memory check of validation, and ``model.init_device=auto``)."""
    return float(device_memory_gb) * 1e9 * float(memory_fraction)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> int | None:
    """Reset this process's peak resident set; returns the current RSS in bytes (None where it cannot)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    rss = _status_kib("VmRSS")
    return rss * 1024 if rss is not None else None


def peak_rss_since_reset() -> int | None:
    hwm = _status_kib("VmHWM")
    return hwm * 1024 if hwm is not None else None


class BuildPeak:
    """Peak memory growth since ``start``: each ``read`` returns the largest growth seen so far."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base: int | None = None
        self.growth: int | None = None

    def start(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = int(torch.cuda.memory_allocated(self.device))
        else:
            self.base = reset_peak_rss()

    def read(self) -> int | None:
        if self.base is None:
            return None
        import torch

        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else peak_rss_since_reset()
        if peak is not None:
            self.growth = max(self.growth or 0, int(peak) - self.base)
        return self.growth
