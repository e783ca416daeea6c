"""A worker keeps the host memory it frees for its next step, instead of handing it back to the OS.

glibc's malloc serves a block at or above its mmap threshold with a fresh ``mmap`` and unmaps it on ``free``, and
gives the top of its heap back once more than its trim threshold is free there. Both thresholds start at 128 KiB
and move with what the process has freed, so whether a step's activations (MiBs each on a small CPU model) come
back as reused memory or as fresh pages depends on the process's history. Measured on the ddp overhead pair's job
(``parallel=ddp model=gpt_small``, 32 x 128 tokens, 2 ranks; docs/benchmarks.md, "Host memory"): a rank's forward
and backward took 2,500-7,700 minor page faults a step (3.7-8.3 ms of kernel time in a ~150 ms step), the
hand-written loop's 750-1,300, and 1-2 with the thresholds below. Setting the mmap threshold alone stops glibc from
moving the trim threshold (it stays at 128 KiB), and setting the trim threshold alone pins the mmap threshold at
128 KiB (40,000 faults a step): they are set together.

Blocks of 32 MiB and more (glibc's largest mmap threshold on 64-bit) are still mapped and unmapped; below that the
heap keeps what was freed, up to ``TRIM_THRESHOLD`` at its top, which the next step allocates again. What tcmalloc
and jemalloc do by default, which CPU training guides preload for the same reason; here without another library.
``topology.reuse_host_memory=false`` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt's parameter numbers (glibc's malloc.h)."""

MMAP_THRESHOLD = 32 * 2**20
"""Blocks from this size up are mapped on their own: glibc's largest accepted value on 64-bit."""

TRIM_THRESHOLD = 2**30
"""Free memory at the heap's top kept before glibc returns it: 1 GiB."""


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)`` for this process; whether glibc took the value."""
    call = ctypes.CDLL(None).mallopt
    call.argtypes, call.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return call(param, value) == 1


def reuse_freed_host_memory() -> str:
    """Set glibc's mmap and trim thresholds for this process (``mallopt``); a line saying what was done, or why
    nothing was (another C library, or glibc refused a value)."""
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return f"host memory: glibc's defaults left alone (the C library is {libc_name or 'not glibc'})"
    refused = [
        name
        for name, param, value in (
            ("mmap threshold", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            ("trim threshold", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
        if not mallopt(param, value)
    ]
    if refused:
        return f"host memory: glibc refused the {' and '.join(refused)}; its defaults apply"
    return (
        f"host memory: freed blocks under {MMAP_THRESHOLD >> 20} MiB are kept for reuse (glibc's mmap threshold "
        f"{MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB; topology.reuse_host_memory=false "
        "keeps its defaults)"
    )
