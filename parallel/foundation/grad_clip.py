"""Gradient clipping by the global norm: the one path every engine takes (``Engine.clip_grad_norm_``).

After tensor parallel and FSDP2, one model holds parameters sharded over (dp, tp), over dp only,
or replicated plain tensors; a pipeline holds only its stage's. ``torch.nn.utils.clip_grad_norm_``
stacks the per-parameter norms and fails on such a mix. Here squared norms of the local shards are
summed per (mesh, placements) group over the mesh dimensions they are split on (replicated
dimensions hold copies), then over the pipeline group when the engine holds one stage of several,
so every rank clips by the norm one process would compute over the whole model.

Every path sums the squares in float64 (each tensor's or shard's norm by ``torch._foreach_norm`` with
``dtype=float64``, one kernel per device and dtype), so a layout's norm is single's float32 norm, not one a few
float32 roundings away: summed in float32 per shard, fsdp dp2's norm of llama_debug's gradients was 1.2e-6
relative off single's (3.8532204 vs 3.8532157), and its clipping coefficient with it. The coefficient is torch's,
``max_norm / (norm + 1e-6)`` clamped at 1 in float32, kept on the device and multiplied into every gradient
(``torch.nn.utils.clip_grads_with_norm_``): clipping never waits for the GPU.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import torch
import torch.distributed as dist


def total_grad_norm(
    grads: list[torch.Tensor], *, pp_group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """L2 norm (float32) over all ``grads``, and over the other pipeline stages when ``pp_group`` is given.

    The sum of squares is kept in float64 on the gradients' device (NCCL reduces CUDA tensors only).
    """
    dtensor = _dtensor_class()
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        is_dtensor = dtensor is not None and isinstance(g, dtensor)
        g = _without_partial(g) if is_dtensor else g
        key = (g.device_mesh, tuple(g.placements)) if is_dtensor else None
        groups.setdefault(key, []).append(g)
    across_stages = pp_group is not None and dist.get_world_size(pp_group) > 1
    if device is None:
        device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for key, group in groups.items():
        sq += _squared_norm(group, key)
    if across_stages:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt().float()


def _local_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of the squares of ``tensors`` in float64, on the first one's device (0 for none)."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    device = tensors[0].device
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    norms = [n.to(device) for ts in by_device.values() for n in torch._foreach_norm(ts, 2, dtype=torch.float64)]
    return torch.stack(norms).square().sum()


def _dtensor_class() -> type | None:
    """DTensor, when something (tp, fsdp) has imported it; else no gradient can be one, and importing it here
    would add its import time (0.5-2.5 s measured on 2 busy cores) to the first step of ddp and single runs."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _without_partial(g) -> torch.Tensor:
    """A pending sum (a replicated parameter's gradient under sequence parallel) reduced first:
    the norm of a sum is not the sum of norms."""
    from torch.distributed.tensor import Replicate

    if any(p.is_partial() for p in g.placements):
        return g.redistribute(g.device_mesh, [Replicate() if p.is_partial() else p for p in g.placements])
    return g


def _squared_norm(grads: list[torch.Tensor], key) -> torch.Tensor:
    """Sum of squares of ``grads`` sharing one (mesh, placements) key, or all plain (key None).

    Local shards first, then one all-reduce per mesh dimension the grads are split over.
    """
    local = [g.to_local() if key is not None else g for g in grads]
    sq = _local_squares(local)
    if key is not None:
        mesh, placements = key
        for dim, placement in enumerate(placements):
            if not placement.is_replicate():  # Shard, and FSDP2's _StridedShard over TP shards
                dist.all_reduce(sq, group=mesh.get_group(dim))
    return sq


@torch.no_grad()  # as torch's own: DTensor's to_local() is then its local tensor, not an autograd function per gradient
def clip_grad_norm_(
    params: Iterable[torch.nn.Parameter],
    max_norm: float,
    *,
    pp_group: dist.ProcessGroup | None = None,
    uncounted: Iterable[torch.nn.Parameter] = (),
) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm`` (0 or inf: measure only); return the
    norm before clipping. ``pp_group``: the engine's pipeline group, None when it holds the whole model.
    ``uncounted``: parameters among ``params`` whose gradient is a copy of one counted elsewhere (a tied
    embedding's head on the last pipeline stage): clipped, but left out of the norm."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    skip = {id(p) for p in uncounted}
    counted = [p.grad for p in params if p.grad is not None and id(p) not in skip] if skip else grads
    norm = total_grad_norm(counted, pp_group=pp_group, device=params[0].device if params else None)
    if not grads or not 0 < max_norm < math.inf:
        return norm
    # torch's clip_grads_with_norm_: the coefficient stays on the device (no host synchronisation) and
    # multiplies every gradient, 1.0 included; DTensor gradients through their local shards
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    dtensor = _dtensor_class()
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        local = g.to_local() if dtensor is not None and isinstance(g, dtensor) else g
        by_kind.setdefault((local.device, local.dtype), []).append(local)
    for (device, _), tensors in by_kind.items():
        torch._foreach_mul_(tensors, coef.to(device))
    return norm
