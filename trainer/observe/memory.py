"""Peak memory of this rank: max allocated on CUDA, peak resident set size on CPU."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


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
    """Reset this process's peak resident set (Linux: ``/proc/self/clear_refs``); returns the current RSS
    in bytes, or None where the peak cannot be reset (the build peak is then not reported)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    rss = _status_kib("VmRSS")
    return rss * 1024 if rss is not None else None


def peak_rss_since_reset() -> int | None:
    """Peak resident set in bytes since ``reset_peak_rss`` (Linux ``VmHWM``)."""
    hwm = _status_kib("VmHWM")
    return hwm * 1024 if hwm is not None else None


class BuildMemory:
    """What building the model cost this rank: peak RSS growth during ``strategy.build`` (CPU; on CUDA the
    peak allocated bytes) and the bytes of parameters the rank holds afterwards (local shards only)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.rss_before: int | None = None

    def __enter__(self) -> BuildMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.rss_before = int(torch.cuda.memory_allocated(self.device))
        else:
            self.rss_before = reset_peak_rss()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def peak_growth_bytes(self) -> int | None:
        if self.rss_before is None:
            return None
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)) - self.rss_before
        peak = peak_rss_since_reset()
        return peak - self.rss_before if peak is not None else None


def local_param_bytes(params) -> int:
    """Bytes of parameter storage this rank holds (a DTensor counts its local shard)."""
    total = 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return int(total)
