"""parallel=hybrid: pipeline × data × tensor parallel on one DeviceMesh (pp, dp, tp).

How one rank's model is built, in this order (torchtitan's):
1. pipeline (pp > 1): the model is split into stages by names (``parallel/pipeline/engine.py``); this rank
   keeps its stage(s);
2. tensor parallel (tp > 1): the model's plan (its ``ModelSpec.parallelize``) on the tp sub-mesh, applied
   to each stage module; then activation checkpointing and compile per block, and bf16 autocast unless
   FSDP2 casts (``parallel/core/regional.py``);
3. data parallel (dp > 1): FSDP2 ``fully_shard`` on the dp sub-mesh when ``dp.shard``, else DDP; with
   tp > 1 or pp > 1 always FSDP2 (DDP over DTensor modules fails on torch 2.13, and DDP inside a
   ``PipelineStage`` with several micro-batches crashes or gives wrong gradients; see
   ``trainer/validate.py``);
4. the stage becomes a ``PipelineStage`` driven by ``pp.schedule`` (``build_pipeline_engine``'s
   ``wrap_stage`` hook runs steps 2–3), or, with pp = 1, one module with gradient accumulation.

The engine adds to the pipeline's measurements the tp group's communication time and the dp
dimension's (DDP buckets); its ``pp_group`` makes ``Engine.clip_grad_norm_`` clip by the norm over every
stage and shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from parallel.core.base import Engine, Strategy, WorkerContext
from parallel.core.comm_timer import SampledCommMeter
from parallel.core.intervals import union_seconds
from parallel.core.layout import why_dp_needs_fsdp
from parallel.core.rank_map import announce_rank_map
from parallel.strategies.ddp import CommTimer, wrap_ddp
from parallel.strategies.fsdp import FSDPCommTimer, apply_fsdp, fsdp_no_sync
from parallel.strategies.tp import MeshModuleEngine, parallelize_for_tp, tp_meter


def shard_replica(
    module: nn.Module, *, ctx: WorkerContext
) -> tuple[nn.Module, Callable[[], AbstractContextManager] | None, CommTimer | FSDPCommTimer | None]:
    """Tensor parallel, then data parallel, on one module (a whole model or a pipeline stage), placed on
    this rank's device (a meta-built module materialised after sharding, before DDP).

    Returns the module to run, its no-sync context factory for accumulation, and DDP's bucket timer.
    """
    layout = ctx.layout
    if layout.tp > 1:
        parallelize_for_tp(module, ctx=ctx)
    fsdp = layout.dp > 1 and layout.dp_shard
    ctx.prepare(module, fsdp=fsdp)  # activation checkpointing, compile, autocast (unless FSDP2 casts)
    if layout.dp == 1:
        return ctx.place(module), None, None
    if fsdp:
        apply_fsdp(module, dp_mesh=ctx.mesh["dp"], mp_policy=ctx.fsdp_mp_policy())
        module = ctx.place(module)
        return module, fsdp_no_sync(module), FSDPCommTimer().attach(module)
    ddp, timer = wrap_ddp(ctx.place(module), ctx=ctx)
    return ddp, ddp.no_sync, timer


def describe_dp(ctx: WorkerContext) -> str:
    layout = ctx.layout
    if layout.dp == 1:
        return "none"
    if not layout.dp_shard:
        return "DDP"
    if not ctx.cfg.dp.shard:
        return f"FSDP2 (dp.shard=false overridden: {why_dp_needs_fsdp(layout)})"
    return "FSDP2"


class HybridPipelineEngine(Engine):
    """The pipeline engine of this rank's TP/DP-wrapped stages, plus tp/dp measurements."""

    def __init__(
        self,
        pipeline: Engine,
        *,
        pp_group,
        tp_meter: SampledCommMeter,
        ddp_timers: list[CommTimer | FSDPCommTimer],
        rank_map: dict[str, Any],
    ):
        self.pipeline = pipeline
        self.model_parts = pipeline.model_parts
        self.pp_group = pp_group
        self.tp_meter = tp_meter
        self.ddp_timers = ddp_timers
        self.rank_map = rank_map
        self._step = (0.0, 0.0)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        start = time.perf_counter()
        try:
            with self.tp_meter.step():
                return self.pipeline.train_step(inputs, targets)
        finally:
            self._step = (start, time.perf_counter())

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        return self.pipeline.eval_step(inputs, targets)

    def step_metrics(self) -> dict[str, float]:
        out = {**self.pipeline.step_metrics(), **self.tp_meter.metrics()}
        if self.ddp_timers:  # the dp dimension's collectives (FSDP2's, of every stage on this rank), as a union
            intervals = [i for t in self.ddp_timers for i in t.take_intervals()]
            busy = union_seconds(intervals)
            elapsed = max(self._step[1] - self._step[0], 1e-9)
            out.update(dp_comm_time_s=busy, comm_time_s=busy, comm_fraction=min(1.0, busy / elapsed))
            out["comm_collectives"] = len(intervals)
        return out

    def summary(self) -> dict[str, Any]:
        out = self.pipeline.summary()
        artifacts = [out.pop("artifacts", None) or {}, self.rank_map.get("artifacts") or {}]
        out.update({k: v for k, v in self.rank_map.items() if k != "artifacts"})
        images = {k: v for part in artifacts for k, v in part.get("images", {}).items()}
        files = [f for part in artifacts for f in part.get("files", [])]
        if images or files:
            out["artifacts"] = {"images": images, "files": files}
        return out

    def train(self, mode: bool = True) -> None:
        self.pipeline.train(mode)

    def close(self) -> None:
        self.pipeline.close()
        super().close()


def build_hybrid_pipeline(ctx: WorkerContext) -> Engine:
    from parallel.pipeline.engine import build_pipeline_engine

    ddp_timers: list[CommTimer | FSDPCommTimer] = []
    held: list[tuple[int, nn.Module]] = []

    def wrap_stage(module: nn.Module, spec) -> nn.Module:
        wrapped, _, timer = shard_replica(module, ctx=ctx)  # PipelineStage drives no-sync itself
        if timer is not None:
            ddp_timers.append(timer)
        held.append((spec.index, wrapped))
        return wrapped

    pipeline = build_pipeline_engine(ctx=ctx, wrap_stage=wrap_stage)
    rank_map = announce_rank_map(ctx, stage_modules=[m for _, m in held], stages=[i for i, _ in held])
    return HybridPipelineEngine(
        pipeline, pp_group=ctx.mesh["pp"].get_group(), tp_meter=tp_meter(ctx), ddp_timers=ddp_timers, rank_map=rank_map
    )


class HybridStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        layout = ctx.layout
        ctx.log.info(
            "parallel=hybrid: pp=%d x dp=%d x tp=%d; dp dimension: %s",
            layout.pp,
            layout.dp,
            layout.tp,
            describe_dp(ctx),
        )
        if layout.pp > 1:
            return build_hybrid_pipeline(ctx)
        model = ctx.build_model(materialize=False)
        module, no_sync, ddp_timer = shard_replica(model, ctx=ctx)
        return MeshModuleEngine(
            module,
            accumulation=ctx.accumulation_steps(),
            no_sync=no_sync,
            ddp_timer=ddp_timer,
            loss_parallel=bool(ctx.cfg.tp.loss_parallel) and layout.tp > 1,
            tp_meter=tp_meter(ctx),
            rank_map=announce_rank_map(ctx, stage_modules=[module]),
        )
