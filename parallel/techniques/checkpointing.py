"""Activation checkpointing, per block of a model (or a pipeline stage): one step of ``parallel/assembly/compose.py``'s
order, after tensor parallel, before compile and data parallel (torchtitan's TP → AC → compile → FSDP).

Each block in ``module.layers`` keeps its name: its instance ``forward`` is replaced by a checkpointed one, so
parameter names (checkpoints, split points, TP plans) do not change and FSDP2's per-block hooks stay outside.

- ``full``: every block's activations are recomputed in backward; only the block's input is kept.
- ``selective`` with ``every=1`` (``trainer.ac_every``, default): torch's op-level selective checkpointing
  (``create_selective_checkpoint_contexts``) keeps the outputs of matmuls (mm, addmm, bmm, attention)
  and recomputes the cheap element-wise and normalisation ops.
- ``selective`` with ``every=k > 1``: block-level selective: every k-th block (global block index k-1, 2k-1,
  ...) is checkpointed in full, the others keep everything.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from parallel.foundation.activations import CountingSACStorage, active_meter, hold_inputs


def _matmul_ops() -> frozenset:
    aten = torch.ops.aten
    ops = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]
    for name in (
        "_scaled_mm",  # float8 matmuls (trainer.precision=fp8 on a GPU; emulation runs aten.mm), as torchtitan's list
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    ):
        op = getattr(aten, name, None)
        if op is not None:
            ops.append(op.default)
    return frozenset(ops)


SAVE_OPS = _matmul_ops()

# Profiler ranges carry no tensor and their count is not the forward's in the recompute: FSDP2's hooks on a module
# inside a block (expert parallel's experts, sharded over their own mesh) open one per pre/post-forward, and skip or
# add some while backward recomputes. Counted, op-level selective checkpointing failed the recompute ("profiler.
# _record_function_enter_new invocation index 2 ... not found in storage"); torch's own list holds ops of that kind.
SAC_IGNORED_OPS.update(
    {
        torch.ops.profiler._record_function_enter.default,
        torch.ops.profiler._record_function_enter_new.default,
        torch.ops.profiler._record_function_exit.default,
        torch.ops.profiler._record_function_exit._RecordFunction,
    }
)


def save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep matmul and attention outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> tuple:
    """The policy's two dispatch modes with a cache that the activation meter counts (eager only)."""
    caching, cached = create_selective_checkpoint_contexts(save_matmuls_policy)
    storage = CountingSACStorage(active_meter())
    caching.storage = cached.storage = storage
    return caching, cached


def checkpoint_block(block: nn.Module, *, selective: bool, for_compile: bool = False) -> None:
    """Recompute ``block``'s forward in backward: everything (``selective=False``) or all but matmuls."""
    inner = block.forward
    if selective:
        # torch.compile accepts a functools.partial of create_selective_checkpoint_contexts only
        context_fn = (
            functools.partial(create_selective_checkpoint_contexts, save_matmuls_policy)
            if for_compile
            else _selective_contexts
        )
    else:
        context_fn = None

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        args = hold_inputs(args)
        if context_fn is None:
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    block.forward = forward  # type: ignore[method-assign]


def blocks_of(module: nn.Module) -> list[tuple[int, nn.Module]]:
    """(global block index, block) of the blocks this module (or pipeline stage) holds."""
    layers = getattr(module, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        return []
    return [(int(key), block) for key, block in layers.items()]


def checkpoint_plan(mode: str, every: int, index: int) -> str:
    """How block ``index`` is checkpointed: none, full or selective."""
    if mode == "full":
        return "full"
    if mode == "selective":
        if every > 1:
            return "full" if (index + 1) % every == 0 else "none"
        return "selective"
    return "none"


def apply_activation_checkpointing(module: nn.Module, *, mode: str, every: int = 1, for_compile: bool = False) -> None:
    """Checkpoint the blocks of ``module`` as ``mode`` (none, full, selective) and ``every`` say; ``for_compile``:
    the blocks are compiled next (a selective policy torch.compile accepts)."""
    for index, block in blocks_of(module):
        how = checkpoint_plan(mode, every, index)
        if how != "none":
            checkpoint_block(block, selective=how == "selective", for_compile=for_compile)
