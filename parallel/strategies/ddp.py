"""parallel=ddp: DistributedDataParallel over the mesh's dp dimension (``parallel/techniques/ddp.py``), one replica
per process, with its reducer's own communication timer on the logged steps."""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy


class DDPStrategy(Strategy):
    """One replica per process, gradients all-reduced over dp (``Composition(dp="ddp")``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_engine(ctx=ctx, composition=Composition(dp="ddp"))
