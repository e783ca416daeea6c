"""parallel=tp: tensor parallel with DTensor over the mesh's tp dimension (``parallel/techniques/tp.py``): the
model family's plan shards its projections; every tp rank of a replica sees the same batch."""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy


class TPStrategy(Strategy):
    """The family's tensor-parallel plan over tp (``Composition(tp=True)``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        ctx.log.info(
            "parallel=tp: %d-way tensor parallel (sequence_parallel=%s, loss_parallel=%s)",
            ctx.layout.tp,
            ctx.run.compose.sequence_parallel,
            ctx.run.compose.loss_parallel,
        )
        return build_engine(ctx=ctx, composition=Composition(tp=True, rank_map=True))
