"""Regional compile: each block of a model (or pipeline stage) compiled on its own, one step of
``parallel/core/compose.py``'s order (after activation checkpointing, before FSDP2/DDP).

One compiled graph is reused by every block of the same shape, so compile time does not grow with depth; the
block's instance ``forward`` is replaced, so parameter names do not change and FSDP2's per-block hooks stay
outside the compiled region.
"""

from __future__ import annotations

import torch
from torch import nn

from parallel.techniques.checkpointing import blocks_of


def compile_block(block: nn.Module) -> None:
    block.forward = torch.compile(block.forward)  # type: ignore[method-assign]


def apply_compile(module: nn.Module) -> None:
    """Compile every block in ``module.layers`` on its own."""
    for _, block in blocks_of(module):
        compile_block(block)
