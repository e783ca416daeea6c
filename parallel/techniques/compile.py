"""Regional compile: each block of a model (or pipeline stage) compiled on its own, one step of
``parallel/assembly/compose.py``'s order (after activation checkpointing, before FSDP2/DDP).

One compiled graph is reused by every block of the same shape, so compile time does not grow with depth; the
block's instance ``forward`` is replaced, so parameter names do not change and FSDP2's per-block hooks stay
outside the compiled region.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

from parallel.techniques.checkpointing import blocks_of


def _forget_inherited_compile_threads() -> None:
    """In a forked child: drop the parent's inductor thread pool (its threads did not survive the fork). torch 2.13
    resets its compile process pool after a fork but not this one; a worker forked by a launcher that had compiled
    in-process (a multirun's parallel=single job, then a job with workers) queued its C++ builds on the dead pool
    and waited forever."""
    pool = getattr(getattr(sys.modules.get("torch._inductor.async_compile"), "AsyncCompile", None), "pool", None)
    if callable(getattr(pool, "cache_clear", None)):  # a cached pool (torch 2.13); other versions may keep none
        pool.cache_clear()


os.register_at_fork(after_in_child=_forget_inherited_compile_threads)


def compile_block(block: nn.Module) -> None:
    block.forward = torch.compile(block.forward)  # type: ignore[method-assign]


def apply_compile(module: nn.Module) -> None:
    """Compile every block in ``module.layers`` on its own."""
    for _, block in blocks_of(module):
        compile_block(block)
