"""parallel=fsdp: FSDP2 ``fully_shard`` per block and root over the mesh's dp dimension (``parallel/techniques/fsdp.py``):
parameters, gradients and optimizer state sharded, whatever ``dp.shard`` says."""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy


class FSDPStrategy(Strategy):
    """FSDP2 over dp whatever ``dp.shard`` says (``Composition(dp="fsdp")``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        ctx.log.info("parallel=fsdp: fully_shard per block and root over dp=%d", ctx.layout.dp)
        return build_engine(ctx=ctx, composition=Composition(dp="fsdp", rank_map=True))
