"""parallel=single: one process, no communication; the reference every strategy must reproduce."""

from __future__ import annotations

from parallel.assembly.base import Engine, Strategy, WorkerContext
from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition


class SingleStrategy(Strategy):
    """No wrapper but activation checkpointing, compile and autocast (``Composition()``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_engine(ctx=ctx, composition=Composition())
