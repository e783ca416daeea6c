"""parallel=pp and parallel=mp: the same pipeline engine, with micro-batches under a schedule or without."""

from __future__ import annotations

from parallel.core.base import Engine, Strategy, WorkerContext
from parallel.pipeline.engine import build_pipeline_engine


class PipelineStrategy(Strategy):
    """parallel=pp: micro-batches flow through the stages under ``pp.schedule``."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_pipeline_engine(ctx=ctx)


class ModelParallelStrategy(Strategy):
    """parallel=mp: the layers split over ranks, one micro-batch, stages strictly in turn."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_pipeline_engine(ctx=ctx)
