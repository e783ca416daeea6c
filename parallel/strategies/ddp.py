"""parallel=ddp: DistributedDataParallel over the mesh's dp dimension, with measured communication.

A DDP communication hook wraps the default all-reduce (same arithmetic: divide by the group size,
then sum) and timestamps each bucket from launch to completion. The union of those intervals over a
step is the time gradients spent in all-reduce; ``comm_fraction`` is that over the step time. A Python comm hook
replaces DDP's C++ all-reduce path, which cost 2-5% of the tokens/s on 2 CPU ranks (docs/benchmarks.md);
``dp.measure_comm=false`` keeps the C++ path and reports no DDP communication time. The wrapping
order (after activation checkpointing and compile) is ``parallel/core/compose.py``'s.
"""

from __future__ import annotations

import time

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from parallel.core.base import Engine, Strategy, WorkerContext
from parallel.core.compose import Composition, build_engine
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


def wrap_ddp(model: nn.Module, *, ctx: WorkerContext) -> tuple[DDP, CommTimer | None]:
    """DDP over the dp sub-mesh, SyncBatchNorm if asked, the comm-timing hook registered unless
    ``dp.measure_comm=false`` (then DDP keeps its C++ all-reduce and no timer is returned)."""
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
    if not cfg.get("measure_comm", True):
        return ddp, None
    timer = CommTimer()
    ddp.register_comm_hook(state=group, hook=timer.hook)
    return ddp, timer


class DDPStrategy(Strategy):
    """One replica per process, gradients all-reduced over dp (``Composition(dp="ddp")``)."""

    def build(self, *, ctx: WorkerContext) -> Engine:
        return build_engine(ctx=ctx, composition=Composition(dp="ddp"))
