"""DistributedDataParallel over the mesh's dp dimension, with measured communication.

DDP's C++ reducer times its own backward when asked (``_set_ddp_runtime_logging_sample_rate``): from the first
bucket's all-reduce launch to the last one's completion, and how much of that overlapped the backward's compute.
``ReducerCommMeter`` turns that on for the steps the loop measures (logged ones, ``trainer.measure_every``) and
reads it after them, so DDP keeps its C++ all-reduce path on every step. A Python comm hook would time each
bucket, but it replaces that path and cost 2-5% of the tokens/s on 2 CPU ranks (docs/benchmarks.md).
``dp.measure_comm=false`` measures nothing. The wrapping order (after activation checkpointing and compile) is
``parallel/assembly/compose.py``'s.

Gradients are views into DDP's all-reduce buckets (``gradient_as_bucket_view``, as Megatron's contiguous gradient
buffer): no copy of the reduced buckets back into separate gradients each step (0.25 ms a step for gpt_small's
0.87M gradients on this machine's one thread), and the gradients' memory held once instead of twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel as DDP

#: DDP's sample rate between measured steps: never (its first 10 iterations are always timed)
_NEVER = 2**31 - 1


class ReducerCommMeter:
    """DDP's C++ reducer timer on the steps the loop measures (it says which: ``Engine.measure_step``).

    ``step(measure)`` wraps a whole step (every micro-batch); ``take()`` after it gives (seconds from the first bucket
    all-reduce's launch to the last one's completion in the step's synchronising backward, buckets reduced),
    or None on a step that was not measured. On CUDA the reducer reads its events with a synchronisation, which
    is why unmeasured steps leave the timer off.
    """

    count_key = "comm_buckets"

    def __init__(self, ddp: DDP):
        self.ddp = ddp
        self.active = False
        ddp._set_ddp_runtime_logging_sample_rate(_NEVER)

    def step(self, measure: bool = True) -> AbstractContextManager:
        self.active = measure
        return self._measuring() if self.active else nullcontext()

    @contextmanager
    def _measuring(self) -> Iterator[None]:
        self.ddp._set_ddp_runtime_logging_sample_rate(1)
        try:
            yield
        finally:
            self.ddp._set_ddp_runtime_logging_sample_rate(_NEVER)

    def take(self) -> tuple[float, int] | None:
        if not self.active:
            return None
        self.active = False
        self.ddp.logger.set_runtime_stats_and_log()  # DDP would compute them at the next forward
        stats = self.ddp._get_ddp_logging_data()
        return float(stats.get("backward_comm_time", 0)) / 1e9, int(stats.get("num_buckets_reduced", 0))


def wrap_ddp(
    model: nn.Module,
    *,
    dp_mesh: DeviceMesh,
    device: torch.device,
    bucket_cap_mb: float | None = None,
    find_unused_parameters: bool = False,
    sync_batchnorm: bool = False,
    measure_comm: bool = True,
) -> tuple[DDP, ReducerCommMeter | None]:
    """DDP over ``dp_mesh`` (the gradient-reduction mesh, ``parallel/foundation/meshes.py``: dp, and cp once it is a
    dimension), SyncBatchNorm if asked, its reducer timing the measured steps unless
    ``measure_comm`` is off (``dp.measure_comm=false``). ``bucket_cap_mb`` None keeps torch's default buckets: 25 MiB
    after a first of 1 MiB, whose all-reduce overlaps the rest of the backward. Any number, 25 included, makes the
    first bucket that size too (torch's rule): gpt_small's 3.5 MB of gradients then went in one all-reduce after the
    whole backward (docs/benchmarks.md)."""
    group = dp_mesh.get_group()
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    ddp = DDP(
        model,
        process_group=group,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=None if bucket_cap_mb is None else float(bucket_cap_mb),
        find_unused_parameters=bool(find_unused_parameters),
        gradient_as_bucket_view=True,
    )
    if not measure_comm:
        return ddp, None
    return ddp, ReducerCommMeter(ddp)
