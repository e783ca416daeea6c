"""The one order in which a module is wrapped, for every strategy: tensor parallel → activation checkpointing →
compile → (bf16 autocast unless FSDP2 casts) → FSDP2 or DDP, placed on the rank's device; a pipelined layout then
makes each wrapped stage a ``PipelineStage`` (``parallel/pipeline/engine.py``). torchtitan's order.

A named strategy (``parallel=single|ddp|fsdp|tp|pp|mp|hybrid``) is a preset: a ``Composition`` of wrappers chosen
from its name and the layout's degrees. ``build_engine`` turns a composition into the rank's engine, so no
strategy repeats the order. A user's own ``Strategy`` subclass may call ``compose`` and ``build_engine`` too, or
build its engine its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from parallel.core.base import Engine, WorkerContext
    from parallel.core.intervals import StepCommMeter

#: how the dp dimension wraps a module: not at all, DistributedDataParallel, or FSDP2 ``fully_shard``
DP_WRAPS = ("none", "ddp", "fsdp")


@dataclass(frozen=True)
class Composition:
    """Which wrappers a strategy applies (``compose`` fixes their order) and how its engine runs them."""

    tp: bool = False
    """Apply the model family's tensor-parallel plan over the tp sub-mesh."""
    dp: str = "none"
    """How the dp dimension wraps the module: one of ``DP_WRAPS``."""
    pipeline: bool = False
    """Split the model into stages driven by ``pp.schedule``; each stage is composed on its own."""
    rank_map: bool = False
    """Gather, log and draw which rank holds which layers (``summary.json``'s ``rank_map``, ``rank_map.png``)."""

    def __post_init__(self) -> None:
        if self.dp not in DP_WRAPS:
            raise ValueError(f"Composition(dp={self.dp!r}): use one of {DP_WRAPS}")

    @classmethod
    def from_degrees(cls, layout: Any, *, rank_map: bool = True) -> Composition:
        """Every dimension the layout uses (``parallel=hybrid``): a new mesh dimension's wrapper is chosen
        here, from its degree, beside the others."""
        return cls(tp=layout.tp > 1, dp=cls.dp_wrap(layout), pipeline=layout.pp > 1, rank_map=rank_map)

    @staticmethod
    def dp_wrap(layout: Any) -> str:
        """What the layout's dp degree asks for: nothing at dp=1, FSDP2 where the layout shards dp
        (``dp.shard``, or forced by tp/pp > 1: ``parallel/core/layout.py``), DDP otherwise."""
        if layout.dp == 1:
            return "none"
        return "fsdp" if layout.dp_shard else "ddp"


@dataclass
class Composed:
    """A wrapped module and what its engine drives it with."""

    module: nn.Module
    no_sync: Callable[[], AbstractContextManager] | None = None
    """Context factory that skips the dp gradient reduction (all but the last accumulated chunk)."""
    dp_timer: StepCommMeter | None = None
    """The dp dimension's measured collectives: DDP's bucket all-reduces (its reducer's timer, on logged steps)
    or FSDP2's all-gathers and reduce-scatters (every step; ``count_key`` names the metric)."""


def compose(module: nn.Module, *, ctx: WorkerContext, composition: Composition) -> Composed:
    """Wrap ``module`` (a whole model or a pipeline stage, possibly built on the meta device) in the fixed
    order and place it on this rank's device: a meta-built module gets storage after sharding, before DDP."""
    if composition.tp:
        from parallel.strategies.tp import parallelize_for_tp

        parallelize_for_tp(module, ctx=ctx)
    fsdp = composition.dp == "fsdp"
    ctx.prepare(module, fsdp=fsdp)  # activation checkpointing, compile, autocast (unless FSDP2 casts)
    if composition.dp == "none":
        return Composed(ctx.place(module))
    if fsdp:
        from parallel.core.meshes import fsdp_mesh
        from parallel.strategies.fsdp import FSDPCommTimer, apply_fsdp, fsdp_no_sync

        apply_fsdp(module, dp_mesh=fsdp_mesh(ctx.mesh, ctx.layout.sizes), mp_policy=ctx.fsdp_mp_policy())
        module = ctx.place(module)  # storage for this rank's shards only, then their init
        timer = FSDPCommTimer().attach(module) if ctx.cfg.dp.get("measure_comm", True) else None
        return Composed(module, no_sync=fsdp_no_sync(module), dp_timer=timer)
    from parallel.strategies.ddp import wrap_ddp

    ddp, timer = wrap_ddp(ctx.place(module), ctx=ctx)
    return Composed(ddp, no_sync=ddp.no_sync, dp_timer=timer)


def build_engine(*, ctx: WorkerContext, composition: Composition) -> Engine:
    """This rank's engine for ``composition``: the pipeline engine over composed stages, or one composed
    module with gradient accumulation (``data.micro_batch_size``)."""
    from parallel.core.base import ModuleEngine
    from parallel.core.rank_map import announce_rank_map
    from parallel.strategies.tp import tp_meter

    if composition.pipeline:
        from parallel.pipeline.engine import build_pipeline_engine

        return build_pipeline_engine(ctx=ctx, composition=composition)
    composed = compose(ctx.build_model(materialize=False), ctx=ctx, composition=composition)
    return ModuleEngine(
        composed.module,
        accumulation=ctx.accumulation_steps(),
        loss_fn=ctx.model_spec.loss_fn(),
        no_sync=composed.no_sync,
        dp_timer=composed.dp_timer,
        loss_parallel=loss_parallel(ctx, composition),
        tp_meter=tp_meter(ctx) if composition.tp else None,
        rank_map=announce_rank_map(ctx, stage_modules=[composed.module]) if composition.rank_map else None,
    )


def loss_parallel(ctx: WorkerContext, composition: Composition) -> bool:
    """Whether the loss runs on vocabulary-sharded logits (``tp.loss_parallel`` with a tp degree > 1)."""
    return composition.tp and ctx.layout.tp > 1 and bool(ctx.cfg.tp.loss_parallel)
