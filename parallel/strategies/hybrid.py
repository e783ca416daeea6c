"""parallel=hybrid: pipeline × data × tensor parallel on one DeviceMesh (pp, dp, tp).

Its composition comes from the degrees: tensor parallel when tp > 1; on the dp dimension FSDP2 ``fully_shard``
when ``dp.shard``, else DDP; with tp > 1 or pp > 1 always FSDP2 (DDP over DTensor modules fails on torch 2.13, and
DDP inside a ``PipelineStage`` with several micro-batches crashes or gives wrong gradients; ``build_layout`` sets
``dp_shard`` and ``trainer/validate.py`` says why); a pipeline when pp > 1. ``parallel/assembly/compose.py`` applies
them in its one order (TP → activation checkpointing → compile → FSDP2/DDP) to the whole model, or, pipelined, to
each stage this rank keeps before it becomes a ``PipelineStage`` driven by ``pp.schedule``.

The engine adds to its own measurements the tp group's communication time and the dp dimension's collectives
(FSDP2's all-gathers and reduce-scatters, or DDP's bucket all-reduces); a pipelined engine's ``pp_group`` makes
``Engine.clip_grad_norm_`` clip by the norm over every stage and shard.
"""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy
from parallel.foundation.dims import mesh_names
from parallel.foundation.layout import why_dp_needs_fsdp


def describe_dp(ctx: WorkerContext) -> str:
    layout = ctx.layout
    if layout.data_size == 1:
        return "none"
    if not layout.dp_shard:
        return "DDP"
    if not ctx.run.dp_shard:
        return f"FSDP2 (dp.shard=false overridden: {why_dp_needs_fsdp(layout)})"
    return "FSDP2"


class HybridStrategy(Strategy):
    """Every dimension the layout uses, composed: ``Composition.from_degrees``."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        layout = ctx.layout
        degrees = " x ".join(f"{name}={layout.size(name)}" for name in mesh_names())
        ctx.log.info("parallel=hybrid: %s; dp dimension: %s", degrees, describe_dp(ctx))
        return build_engine(ctx=ctx, composition=Composition.from_degrees(layout))
