"""parallel=single: one process, no communication; the reference every strategy must reproduce."""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy


class SingleStrategy(Strategy):
    """No wrapper but activation checkpointing, compile and autocast (``Composition()``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_engine(ctx=ctx, composition=Composition())
