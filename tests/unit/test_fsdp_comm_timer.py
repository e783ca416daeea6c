"""The FSDP2 communication timer keeps FSDP2's own synchronisation. FSDP2 waits on an async collective's work only
when it is a ``dist.Work`` (``isinstance(work, dist.distributed_c10d.Work)`` before its copy-out): a timed work of
another type was never waited on, so the async all-gathers torch's multi-stage pipeline schedules issue for each
stage (``unshard(async_op=True)``) were copied out unfinished, and two stages per rank under FSDP2 trained on
garbage (non-finite at step 1 on gloo). The end-to-end check: tests/integration/test_hybrid_parity.py's dp 2 x pp 2
runs with two stages per rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.techniques.fsdp import FSDPCommTimer, _TimedAllGather, _TimedReduceScatter


def test_timed_async_collectives_are_works_fsdp2_waits_on(gloo_one_rank):
    timer = FSDPCommTimer()
    gathered = torch.zeros(4)
    work = _TimedAllGather(timer)(gathered, torch.arange(4.0), dist.group.WORLD, async_op=True)
    assert isinstance(work, dist.distributed_c10d.Work)  # the type FSDP2 checks before it waits
    work.wait()
    assert torch.equal(gathered, torch.arange(4.0)) and work.is_completed()
    reduced = torch.zeros(4)
    work = _TimedReduceScatter(timer)(reduced, torch.ones(4), dist.group.WORLD, dist.ReduceOp.SUM, async_op=True)
    assert isinstance(work, dist.distributed_c10d.Work)
    work.wait()
    assert torch.equal(reduced, torch.ones(4))
    assert len(timer.take_intervals()) == 2  # each interval ends at its work's wait
    assert _TimedAllGather(timer)(gathered, torch.ones(4), dist.group.WORLD) is None  # a sync call: no work
    assert len(timer.take_intervals()) == 1
