"""FSDP2 (``fully_shard``) over the mesh's dp dimension: how it wraps a model or a pipeline stage.

Each block becomes its own FSDP unit (its parameters all-gathered just before it runs and freed
after), then the root takes what is left (embeddings, final norm, head), the order torchtitan uses.
Parameters, gradients and optimizer state are sharded over dp; gradients are reduce-scattered with
the mean over replicas, so the update equals one process on the global batch. Applied after tensor
parallel, ``fully_shard`` sees DTensor parameters and shards them over (dp, tp) in 2-D.
Gradient accumulation skips the reduce-scatter on all but the last micro-batch
(``set_requires_gradient_sync(False)``).

Communication is measured per step: ``FSDPCommTimer`` replaces FSDP2's all-gather and reduce-scatter
with the same calls timed (``set_custom_all_gather`` / ``set_custom_reduce_scatter``), from issue to the
``wait`` FSDP2 does on the work; the union of those intervals over a step is ``comm_time_s``. That is
host time: on gloo the whole collective; on CUDA, where FSDP2 runs them on side streams, the launch
and any wait the host does, not the kernels' device time. ``dp.measure_comm=false`` leaves FSDP2's own
collectives in place, except under fp8's float8 all-gather.

Every all-gather here passes a float8 buffer (``trainer.precision=fp8``: FSDP2 gathers float8 weights in a
float8 buffer when a unit holds nothing else) as its bytes: gloo refuses float8 dtypes ("Invalid scalar type",
measured on torch 2.13), and the bytes are the same on NCCL.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from parallel.foundation.intervals import IntervalLog


class FSDPCommTimer(IntervalLog):
    """[issue, completion] of every all-gather and reduce-scatter FSDP2 runs on this rank."""

    count_key = "comm_collectives"

    def attach(self, model: nn.Module) -> FSDPCommTimer:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_all_gather(_TimedAllGather(self))
                module.set_custom_reduce_scatter(_TimedReduceScatter(self))
        return self


class _TimedWork(dist.Work):
    """An async collective's work: its ``wait`` ends the interval.

    A ``dist.Work`` itself: FSDP2 waits on an async all-gather only when its work is one
    (``isinstance(work, dist.distributed_c10d.Work)``) and otherwise copies the output out unwaited. Async
    all-gathers are what torch's multi-stage pipeline schedules issue (their UNSHARD action,
    ``unshard(async_op=True)``): a plain wrapper here gave two stages per rank under FSDP2 garbage parameters."""

    def __init__(self, work: dist.Work, start: float, timer: FSDPCommTimer):
        super().__init__()
        self._work, self._start, self._timer = work, start, timer

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        if self._timer is not None:
            self._timer.add(self._start, time.perf_counter())
            self._timer = None
        return out

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()

    def result(self):
        return self._work.result()

    def __getattr__(self, name: str):
        return getattr(self._work, name)


def _timed(timer: FSDPCommTimer, call):
    start = time.perf_counter()
    work = call()
    if work is None:
        timer.add(start, time.perf_counter())
        return None
    return _TimedWork(work, start, timer)


#: dtypes gloo cannot carry: all-gathered as their bytes
_FLOAT8 = frozenset(getattr(torch, n) for n in dir(torch) if n.startswith("float8_"))


class _BytesAllGather(DefaultAllGather):
    """FSDP2's all-gather, with a float8 buffer passed as uint8 (the same bytes)."""

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        if output_tensor.dtype in _FLOAT8:
            output_tensor, input_tensor = output_tensor.view(torch.uint8), input_tensor.view(torch.uint8)
        return super().__call__(output_tensor, input_tensor, group, async_op)


class _TimedAllGather(_BytesAllGather):
    def __init__(self, timer: FSDPCommTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        return _timed(
            self.timer, lambda: super(_TimedAllGather, self).__call__(output_tensor, input_tensor, group, async_op)
        )


def float8_bytes_all_gather(model: nn.Module) -> None:
    """Every FSDP2 unit of ``model`` all-gathers float8 buffers as bytes (what ``FSDPCommTimer`` does too)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(_BytesAllGather())


class _TimedReduceScatter(DefaultReduceScatter):
    def __init__(self, timer: FSDPCommTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        return _timed(
            self.timer,
            lambda: super(_TimedReduceScatter, self).__call__(output_tensor, input_tensor, group, op, async_op),
        )


def apply_fsdp(
    model: nn.Module, *, dp_mesh: DeviceMesh, reshard_after_forward: bool = True, mp_policy: Any = None
) -> nn.Module:
    """Shard ``model`` in place: every block in ``model.layers`` (when it has them), then the root.

    ``reshard_after_forward`` is the blocks'; the root keeps its parameters gathered from forward to backward
    (torch's own default for a root, and torchtitan's), since backward needs them first: resharding it cost one
    more all-gather of the embeddings, final norm and head per step (measured: 10 all-gathers per llama_debug
    step against a hand-written FSDP2 loop's 9, docs/benchmarks.md).

    ``mp_policy``: FSDP2's ``MixedPrecisionPolicy`` (bf16-mixed: bf16 all-gather and compute, fp32
    gradient reduce-scatter into fp32 sharded parameters); None keeps the parameters' dtype.
    """
    extra = {"mp_policy": mp_policy} if mp_policy is not None else {}
    # With TP the root returns ``to_local()`` of the gathered logits, a view; FSDP2 warns that an in-place
    # op on it would skip its pre-backward hook. Engines here never modify outputs in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    blocks = getattr(model, "layers", None)
    if isinstance(blocks, nn.ModuleDict):
        for block in blocks.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, **extra)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, **extra)
    return model


def fsdp_no_sync(module: nn.Module):
    """A context factory: inside it, backward keeps gradients unsharded-local (no reduce-scatter)."""

    @contextmanager
    def no_sync() -> Iterator[None]:
        assert isinstance(module, FSDPModule)
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return no_sync
