"""parallel=tp: tensor parallel with DTensor over the mesh's tp dimension, and the engine that
drives any module whose parameters are DTensors (tp, fsdp, and hybrid without pipeline).

The model is built whole on every rank from the same seed (or on the meta device, ``model.init_device``),
then its family's plan (``ModelSpec.parallelize``: ``models/gpt/parallelize.py``, ``models/llama/parallelize.py``)
shards its projections; each tp rank keeps its slice (a meta-built model is materialised after that).
Every tp rank of a replica sees the same batch. The engine times the tp group's collectives
(``tp_comm_time_s``, ``tp_comm_fraction``) on the steps the loop logs, runs forward and backward inside ``loss_parallel()``
when the head is vocabulary-sharded; ``Engine.clip_grad_norm_`` clips by the norm over all shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext, cross_entropy
from parallel.core.comm_timer import CollectiveTimer, SampledCommMeter
from parallel.core.rank_map import announce_rank_map
from parallel.strategies.ddp import CommTimer


def plain_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; a vocabulary-sharded DTensor loss comes back as a plain tensor."""
    loss = cross_entropy(logits, targets)
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def tp_meter(ctx: WorkerContext) -> SampledCommMeter:
    """Times the tp group's collectives on the steps the loop logs (none with tp.measure_comm=false)."""
    timer = None
    if ctx.layout.tp > 1 and ctx.cfg.trainer.get("compile", False):
        # the timer is a TorchDispatchMode: while one is active torch.compile runs the blocks eagerly
        ctx.log.info("tp_comm_time_s is not measured with trainer.compile=true (it would disable compile)")
    elif ctx.layout.tp > 1 and ctx.cfg.tp.get("measure_comm", True):
        timer = CollectiveTimer(group_name=ctx.mesh["tp"].get_group().group_name)
    return SampledCommMeter(timer, every=int(ctx.cfg.trainer.log_every), prefix="tp")


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


class MeshModuleEngine(ModuleEngine):
    """One module whose parameters may be DTensors (TP shards, FSDP2 shards, or both)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        accumulation: int,
        no_sync: Callable[[], AbstractContextManager] | None = None,
        loss_parallel: bool = False,
        tp_meter: SampledCommMeter | None = None,
        rank_map: dict[str, Any] | None = None,
        ddp_timer: CommTimer | None = None,
    ):
        super().__init__(module, accumulation=accumulation, loss_fn=plain_cross_entropy, no_sync=no_sync)
        self.ddp_timer = ddp_timer
        self._step_s = 0.0
        self.loss_parallel = loss_parallel
        self.tp_meter = tp_meter or SampledCommMeter(None, every=1)
        self.rank_map = rank_map or {}

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        with ExitStack() as stack:
            if self.loss_parallel:
                from torch.distributed.tensor.parallel import loss_parallel

                stack.enter_context(loss_parallel())
            stack.enter_context(self.tp_meter.step())
            loss = super().train_step(inputs, targets)
        self._step_s = time.perf_counter() - start
        return loss

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with ExitStack() as stack:
            if self.loss_parallel:
                from torch.distributed.tensor.parallel import loss_parallel

                stack.enter_context(loss_parallel())
            return super().eval_step(inputs, targets)

    def step_metrics(self) -> dict[str, float]:
        out = self.tp_meter.metrics()
        if self.ddp_timer is not None:  # the dp dimension's measured collectives (DDP buckets or FSDP2's)
            busy, count = self.ddp_timer.take()
            out.update(comm_time_s=busy, comm_fraction=min(1.0, busy / max(self._step_s, 1e-9)))
            out[getattr(self.ddp_timer, "count_key", "comm_buckets")] = count
        return out

    def summary(self) -> dict[str, Any]:
        return dict(self.rank_map)


class TPStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        model = ctx.build_model(materialize=False)
        parallelize_for_tp(model, ctx=ctx)
        model = ctx.prepare(ctx.place(model))
        ctx.log.info(
            "parallel=tp: %d-way tensor parallel (sequence_parallel=%s, loss_parallel=%s)",
            ctx.layout.tp,
            ctx.cfg.tp.sequence_parallel,
            ctx.cfg.tp.loss_parallel,
        )
        return MeshModuleEngine(
            model,
            accumulation=ctx.accumulation_steps(),
            loss_parallel=bool(ctx.cfg.tp.loss_parallel),
            tp_meter=tp_meter(ctx),
            rank_map=announce_rank_map(ctx, stage_modules=[model]),
        )
