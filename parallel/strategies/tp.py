"""parallel=tp: tensor parallel with DTensor over the mesh's tp dimension; the tp wrapper and meter that
``parallel/core/compose.py`` applies for tp and hybrid.

The model is built whole on every rank from the same seed (or on the meta device, ``model.init_device``),
then its family's plan (``ModelSpec.parallelize``: ``models/gpt/parallelize.py``, ``models/llama/parallelize.py``)
shards its projections; each tp rank keeps its slice (a meta-built model is materialised after that).
Every tp rank of a replica sees the same batch. The engine (``ModuleEngine``) times the tp group's collectives
(``tp_comm_time_s``, ``tp_comm_fraction``) on the steps the loop logs, runs forward and backward inside
``loss_parallel()`` when the head is vocabulary-sharded (a DTensor loss comes back as a plain tensor);
``Engine.clip_grad_norm_`` clips by the norm over all shards.
"""

from __future__ import annotations

from torch import nn

from parallel.core.base import Engine, Strategy, WorkerContext
from parallel.core.comm_timer import CollectiveTimer, SampledCommMeter
from parallel.core.compose import Composition, build_engine


def tp_meter(ctx: WorkerContext) -> SampledCommMeter:
    """Times the tp group's collectives on the steps the loop logs (none with tp.measure_comm=false)."""
    timer = None
    if ctx.layout.tp > 1 and ctx.cfg.trainer.get("compile", False):
        # the timer is a TorchDispatchMode: while one is active torch.compile runs the blocks eagerly
        ctx.log.info("tp_comm_time_s is not measured with trainer.compile=true (it would disable compile)")
    elif ctx.layout.tp > 1 and ctx.cfg.tp.get("measure_comm", True):
        timer = CollectiveTimer(group_name=ctx.mesh["tp"].get_group().group_name)
    return SampledCommMeter(timer, prefix="tp")


def parallelize_for_tp(model: nn.Module, *, ctx: WorkerContext) -> nn.Module:
    """The model's own TP plan (its ``ModelSpec.parallelize``) on the tp sub-mesh; validation refuses
    families without one before spawn."""
    parallelize = ctx.model_spec.parallelize_fn()
    return parallelize(
        model,
        tp_mesh=ctx.mesh["tp"],
        sequence_parallel=bool(ctx.cfg.tp.sequence_parallel),
        loss_parallel=bool(ctx.cfg.tp.loss_parallel),
    )


class TPStrategy(Strategy):
    """The family's tensor-parallel plan over tp (``Composition(tp=True)``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        ctx.log.info(
            "parallel=tp: %d-way tensor parallel (sequence_parallel=%s, loss_parallel=%s)",
            ctx.layout.tp,
            ctx.cfg.tp.sequence_parallel,
            ctx.cfg.tp.loss_parallel,
        )
        return build_engine(ctx=ctx, composition=Composition(tp=True, rank_map=True))
