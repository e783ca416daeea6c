"""parallel=ddp: DistributedDataParallel over the mesh's dp dimension, with measured communication.

A DDP communication hook wraps the default all-reduce (same arithmetic: divide by the group size,
then sum) and timestamps each bucket from launch to completion. The union of those intervals over a
step is the time gradients spent in all-reduce; ``comm_fraction`` is that over the step time.
"""

from __future__ import annotations

import threading
import time

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext
from parallel.core.intervals import union_seconds


class CommTimer:
    """Collects [launch, completion] of every gradient bucket all-reduce."""

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self.buckets = 0

    def hook(self, process_group, bucket):
        start = time.perf_counter()
        fut = allreduce_hook(process_group, bucket)

        def done(f):
            with self._lock:
                self._intervals.append((start, time.perf_counter()))
            return f.value()

        return fut.then(done)

    count_key = "comm_buckets"

    def take_intervals(self) -> list[tuple[float, float]]:
        with self._lock:
            intervals, self._intervals = self._intervals, []
        return intervals

    def take(self) -> tuple[float, int]:
        """(busy seconds, bucket count) since the last call."""
        intervals = self.take_intervals()
        return union_seconds(intervals), len(intervals)


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
