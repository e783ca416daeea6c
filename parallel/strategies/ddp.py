"""parallel=ddp: DistributedDataParallel over the mesh's dp dimension, with measured communication.

A DDP communication hook wraps the default all-reduce (same arithmetic: divide by the group size,
then sum) and timestamps each bucket from launch to completion. The union of those intervals over a
step is the time gradients spent in all-reduce; ``comm_fraction`` is that over the step time.
"""

from __future__ import annotations

import time

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext
from parallel.core.intervals import IntervalLog


class CommTimer(IntervalLog):
    """Collects [launch, completion] of every gradient bucket all-reduce."""

    count_key = "comm_buckets"

    def hook(self, process_group, bucket):
        start = time.perf_counter()
        fut = allreduce_hook(process_group, bucket)

        def done(f):
            self.add(start, time.perf_counter())
            return f.value()

        return fut.then(done)


class DDPEngine(ModuleEngine):
    def __init__(self, module: DDP, *, timer: CommTimer, accumulation: int):
        super().__init__(module, accumulation=accumulation, no_sync=module.no_sync)
        self.timer = timer
        self._step_start = time.perf_counter()

    def train_step(self, inputs, targets):
        self._step_start = time.perf_counter()
        return super().train_step(inputs, targets)

    def step_metrics(self) -> dict[str, float]:
        busy, buckets = self.timer.take()
        elapsed = max(time.perf_counter() - self._step_start, 1e-9)
        return {"comm_time_s": busy, "comm_fraction": min(1.0, busy / elapsed), "comm_buckets": buckets}


def wrap_ddp(model: nn.Module, *, ctx: WorkerContext) -> tuple[DDP, CommTimer]:
    """DDP over the dp sub-mesh, SyncBatchNorm if asked, comm-timing hook registered."""
    cfg = ctx.cfg.dp
    group = ctx.mesh["dp"].get_group()
    if cfg.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    ddp = DDP(
        model,
        process_group=group,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=float(cfg.bucket_cap_mb),
        find_unused_parameters=bool(cfg.find_unused_parameters),
    )
    timer = CommTimer()
    ddp.register_comm_hook(state=group, hook=timer.hook)
    return ddp, timer


class DDPStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        model = ctx.prepare(ctx.build_model().to(ctx.device))
        ddp, timer = wrap_ddp(model, ctx=ctx)
        return DDPEngine(ddp, timer=timer, accumulation=ctx.accumulation_steps())
