"""A rank's engine from a ``Composition``: ``compose`` (``parallel/assembly/compose.py``) wraps the model, and the
engine that drives it is the pipeline engine (``parallel/assembly/pipeline_engine.py``) or one module with gradient
accumulation (``parallel/assembly/module_engine.py``). Every named strategy calls ``build_engine``; a user's own
``Strategy`` subclass may too, or build its engine its own way.
"""

from __future__ import annotations

from parallel.assembly.compose import Composition, compose_on_rank
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.module_engine import ModuleEngine
from parallel.assembly.pipeline_engine import build_pipeline_engine
from parallel.foundation.rank_map import announce_rank_map


def build_engine(*, ctx: WorkerContext, composition: Composition) -> Engine:
    """This rank's engine for ``composition``: the pipeline engine over composed stages, or one composed
    module with gradient accumulation (``data.micro_batch_size``)."""
    settings = ctx.compose_settings()
    if composition.pipeline:
        return build_pipeline_engine(ctx=ctx, composition=composition, settings=settings)
    composed = compose_on_rank(ctx, ctx.build_model(materialize=False), composition=composition)
    part = composed.parts[0]
    engine = ModuleEngine(
        part.module,
        accumulation=ctx.accumulation_steps(),
        loss_fn=ctx.loss_fn(),
        loss_mesh=ctx.loss_mesh(),
        no_sync=part.no_sync,
        dp_timer=part.dp_timer,
        loss_parallel=composition.tp and ctx.layout.tp > 1 and settings.loss_parallel,
        meters=composed.meters,
        rank_map=announce_rank_map(ctx, stage_modules=[part.module]) if composition.rank_map else None,
    )
    engine.after_update = composed.after_update
    engine.sample_shares = composed.sample_shares
    return engine
