"""Context parallel, DeepSpeed-Ulysses style: each sample's sequence split into cp contiguous chunks, attention by
all-to-all. One step of ``parallel/assembly/compose.py``'s order, after tensor parallel.

Every rank of a cp group holds the same weights (replicated across cp; FSDP2 or DDP reduce the gradients over
dp x cp, ``parallel/foundation/meshes.py``) and ``tokens / cp`` contiguous tokens of each sample
(``Engine.local_batch``). Everything but attention is per token, so it runs on the chunk unchanged; positions
start at the chunk's first token (the model's ``seq_chunk``, ``models/attention.py``). Attention needs the whole
sequence: q, k and v, split by sequence, become split by heads over the full sequence by one all-to-all over
the cp group; the model's own kernel (causal SDPA) runs on ``heads / cp`` heads, and one all-to-all brings the
output back to the sequence split. Any kernel works, on CPU and CUDA (torch's ``context_parallel`` intercepts
only the CUDA SDPA kernels; FlexAttention has no CPU backward: both seen with torch 2.13).

Grouped-query attention: the key/value heads are split over cp like the query heads; when cp does not divide
them, each is repeated (to the least common multiple of kv heads and cp) first, so every rank gets whole heads.
Under tensor parallel the heads are those of this tp rank: heads / tp must divide by cp (validation). The
all-to-all is ``all_to_all_single_autograd`` (its backward is the reverse all-to-all), over gloo or NCCL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh

from models.shape import kv_repeats
from parallel.config import CP_ATTENTION
from parallel.foundation.all_to_all import timed_all_to_all
from parallel.foundation.comm_timer import SampledCommMeter
from parallel.foundation.intervals import union_seconds

Attend = Callable[..., torch.Tensor]


class AllToAllTimer:
    """This rank's cp all-to-alls, forward and backward, timed while it is entered (``SampledCommMeter`` enters it
    on the steps the loop measures): each from its issue to its completion, as ``cp_comm_time_s`` (the union of those
    intervals), ``cp_comm_fraction`` and ``cp_collectives``. Unmeasured steps (and compiled blocks) take the
    traceable ``all_to_all_single_autograd`` instead."""

    def __init__(self) -> None:
        self.active = False
        self.intervals: list[tuple[float, float]] = []
        self.count = 0

    def __enter__(self) -> AllToAllTimer:
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False

    def add(self, start: float, end: float) -> None:
        self.intervals.append((start, end))
        self.count += 1

    def take(self) -> tuple[float, int]:
        seconds, count = union_seconds(self.intervals), self.count
        self.intervals, self.count = [], 0
        return seconds, count


def _exchange(x: torch.Tensor, group, timer: AllToAllTimer | None = None) -> torch.Tensor:
    """All-to-all of a (cp, ...) tensor: slab j goes to rank j, slab i of the result came from rank i (even splits;
    the backward of an all-to-all is the same all-to-all of the gradients), timed on measured steps."""
    if timer is not None and timer.active:
        return timed_all_to_all(x, group=group, log=timer)
    return all_to_all_single_autograd(x.contiguous(), None, None, group)


def seq_to_heads(x: torch.Tensor, *, cp: int, group, timer: AllToAllTimer | None = None) -> torch.Tensor:
    """(b, t, heads, d) of this rank's chunk -> (b, cp x t, heads / cp, d): the whole sequence, this rank's heads."""
    b, t, h, d = x.shape
    slabs = x.reshape(b, t, cp, h // cp, d).permute(2, 0, 1, 3, 4)  # (cp, b, t, h/cp, d): head group j to rank j
    got = _exchange(slabs, group, timer)  # (cp, b, t, h/cp, d): slab i is sequence chunk i
    return got.permute(1, 0, 2, 3, 4).reshape(b, cp * t, h // cp, d)


def heads_to_seq(y: torch.Tensor, *, cp: int, group, timer: AllToAllTimer | None = None) -> torch.Tensor:
    """The inverse of ``seq_to_heads``: (b, cp x t, heads / cp, d) -> (b, t, heads, d) of this rank's chunk."""
    b, s, hc, d = y.shape
    slabs = y.reshape(b, cp, s // cp, hc, d).permute(1, 0, 2, 3, 4)  # (cp, b, t, h/cp, d): chunk j to rank j
    got = _exchange(slabs, group, timer)  # (cp, b, t, h/cp, d): slab i is head group i
    return got.permute(1, 2, 0, 3, 4).reshape(b, s // cp, hc * cp, d)


def ulysses(attend: Attend, *, group, cp: int, timer: AllToAllTimer | None = None) -> Attend:
    """``attend`` (b, t, heads, d) -> (b, t, heads, d) over the full sequence, run on this rank's chunk: q, k, v to
    head-split, ``attend`` on ``heads / cp`` heads, the output back to sequence-split."""

    def attend_cp(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        if mask is not None:  # validation refuses data.packing=documents with cp.size > 1
            raise ValueError("context parallel: packed documents' attention mask is not split over cp")
        if q.shape[2] % cp:
            raise ValueError(f"context parallel: {q.shape[2]} query heads on this rank do not split over cp={cp}")
        repeat = kv_repeats(k.shape[2], cp)
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        q, k, v = (seq_to_heads(x, cp=cp, group=group, timer=timer) for x in (q, k, v))
        return heads_to_seq(attend(q, k, v, **kwargs), cp=cp, group=group, timer=timer)

    attend_cp.inner = attend  # type: ignore[attr-defined]
    return attend_cp


def apply_cp(
    module: nn.Module, *, cp_mesh: DeviceMesh, attention: str = "ulysses", timer: AllToAllTimer | None = None
) -> int:
    """Swap every attention module's ``attend`` for ``ulysses`` over ``cp_mesh`` and set the module's
    ``seq_chunk`` to this rank's cp coordinate (``models/attention.py``); ``timer`` times the all-to-alls on
    measured steps. Returns how many attentions it wrapped."""
    if attention not in CP_ATTENTION:
        raise ValueError(f"cp.attention={attention}: use one of {', '.join(CP_ATTENTION)}")
    cp, group = cp_mesh.size(), cp_mesh.get_group()
    wrapped = 0
    for sub in module.modules():
        attend = getattr(sub, "attend", None)
        if callable(attend):
            sub.attend = ulysses(getattr(attend, "inner", attend), group=group, cp=cp, timer=timer)
            wrapped += 1
    has_chunk = [m for m in module.modules() if hasattr(m, "seq_chunk")]
    if not has_chunk and wrapped:
        raise ValueError(f"context parallel: {type(module).__name__} has no seq_chunk for its positions")
    for m in has_chunk:
        m.seq_chunk = cp_mesh.get_local_rank()
    return wrapped


def local_chunk(x: torch.Tensor, *, cp: int, index: int) -> torch.Tensor:
    """Chunk ``index`` of ``cp`` contiguous chunks of each sample's sequence (the last dimension: tokens and targets
    are ``(batch, seq)``)."""
    if cp == 1:
        return x
    t = x.shape[-1] // cp
    return x[..., index * t : (index + 1) * t]


def sequence_share(cp_mesh: DeviceMesh) -> Callable[[torch.Tensor], torch.Tensor]:
    """What this rank keeps of each sample, inputs and targets alike (``Engine.sample_shares``): its cp
    coordinate's contiguous chunk of the sequence."""
    cp, index = cp_mesh.size(), cp_mesh.get_local_rank()
    return lambda x: local_chunk(x, cp=cp, index=index)


def cp_meter(timer: AllToAllTimer | None) -> SampledCommMeter:
    """The cp all-to-alls as an engine's meter (``cp_comm_time_s``, ``cp_comm_fraction``, ``cp_collectives``; their
    medians in the summary), on the steps the loop measures."""
    return SampledCommMeter(timer, prefix="cp")


class ContextParallel:
    """cp as ``compose`` applies it, after tensor parallel (``MeshDim.technique``): Ulysses attention over the cp
    sub-mesh, one all-to-all timer over every part, each sample's contiguous chunk as this rank's share."""

    step = "context parallel"

    def __init__(self, *, mesh: Any, sizes: Any, settings: Any):
        self.mesh = mesh["cp"]
        self.attention = str(settings.options.get("cp", {}).get("attention", CP_ATTENTION[0]))
        # compiled blocks keep the traceable all-to-all: no timer (as tp_comm_time_s, not measured under compile)
        self.timer = AllToAllTimer() if not settings.compile else None

    def apply(self, module: nn.Module) -> list[tuple[nn.Module, DeviceMesh]]:
        """Attention by all-to-all; no unit of its own to shard."""
        apply_cp(module, cp_mesh=self.mesh, attention=self.attention, timer=self.timer)
        return []

    def meter(self) -> SampledCommMeter:
        return cp_meter(self.timer)

    def sample_share(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return sequence_share(self.mesh)


technique = ContextParallel
"""What ``compose`` makes of this module for a run (``technique(mesh=..., sizes=..., settings=...)``)."""
