"""parallel=pp and parallel=mp: one strategy, the pipeline engine over unwrapped stages.

What makes ``mp`` model parallel (one micro-batch, GPipe, one stage per rank, blocks split evenly,
``mp.split_points``) is its registry entry's ``FixedPipeline`` (``parallel/assembly/registry.py``), which validation
and the pipeline's split read; this class is the same for both.
"""

from __future__ import annotations

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.strategy import Strategy


class PipelineStrategy(Strategy):
    """parallel=pp (micro-batches under ``pp.schedule``) and parallel=mp (stages strictly in turn)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_engine(ctx=ctx, composition=Composition(pipeline=True))
