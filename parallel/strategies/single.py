"""parallel=single: one process, no communication; the reference every strategy must reproduce."""

from __future__ import annotations

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext


class SingleStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        model = ctx.prepare(ctx.build_model().to(ctx.device))
        return ModuleEngine(model, accumulation=ctx.accumulation_steps())
