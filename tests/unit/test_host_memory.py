"""A worker keeps the host memory it frees (trainer/launch/host_memory.py): a block freed and allocated again every
step comes back from the heap, not as fresh pages."""

from __future__ import annotations

import platform
import resource

import pytest
import torch

from trainer.launch.host_memory import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt, reuse_freed_host_memory

BLOCK = 4 * 2**20  # an activation of the ddp pair's step is 1-4 MiB
BLOCKS = 6
PAGES = BLOCKS * BLOCK // resource.getpagesize()

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def step() -> None:
    """What a training step does to host memory: ``BLOCKS`` activations of ``BLOCK`` bytes held together, written,
    then freed together."""
    held = [torch.empty(BLOCK, dtype=torch.uint8).fill_(1) for _ in range(BLOCKS)]
    del held


def faults_per_step(steps: int = 4) -> float:
    """Minor page faults of this thread per ``step()``, after three to settle."""
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / steps


def set_glibc_start_values() -> None:
    """Both thresholds at glibc's starting 128 KiB, held there: every block of 128 KiB or more is its own mapping."""
    assert mallopt(M_MMAP_THRESHOLD, 128 * 1024) and mallopt(M_TRIM_THRESHOLD, 128 * 1024)


@glibc_only
def test_blocks_freed_every_step_are_reused_instead_of_faulted_in_again():
    set_glibc_start_values()
    mapped = faults_per_step()
    note = reuse_freed_host_memory()  # the workers' setting stays for the rest of this test process
    kept = faults_per_step()
    print(f"{BLOCKS} x {BLOCK >> 20} MiB freed each step: {mapped:.0f} page faults a step mapped anew, {kept:.0f} kept")
    assert mapped >= PAGES / 8, "the check itself: blocks mapped anew each step fault their pages in each step"
    assert kept < 8
    assert note.startswith("host memory: freed blocks under 32 MiB are kept")
    assert "topology.reuse_host_memory=false" in note


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert reuse_freed_host_memory() == "host memory: glibc's defaults left alone (the C library is musl)"
