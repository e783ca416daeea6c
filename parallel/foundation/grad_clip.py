"""Gradient clipping by the global norm: the one path every engine takes (``Engine.clip_grad_norm_``).

After tensor parallel and FSDP2, one model holds parameters sharded over (dp, tp), over dp only,
or replicated plain tensors; a pipeline holds only its stage's. ``torch.nn.utils.clip_grad_norm_``
stacks the per-parameter norms and fails on such a mix. Here squared norms of the local shards are
summed per (mesh, placements) group over the mesh dimensions they are split on (replicated
dimensions hold copies), then over the pipeline group when the engine holds one stage of several,
so every rank clips by the norm one process would compute over the whole model.

A replicated parameter's gradient under sequence parallel is a pending sum (``Partial``): the norm of a sum is not
the sum of norms, so those gradients are summed first, all of one (mesh, placements, dtype) in one flat all-reduce,
and written back as replicated gradients (the same values the optimizer's step would otherwise all-reduce one by one
again). Groups summing their squares over the same mesh dimensions share one all-reduce of the squares. Counted on
the tp pair's model (llama3 debugmodel, 6 layers, tp=2, SP + loss parallel): a step's all-reduces went from 34 (13
norm-weight gradients reduced for the norm, the same 13 again in the optimizer's step, 2 for the squares) to 8.

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
    sq = _squared_norm(groups, device)
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
    if len(by_device) == 1:  # the usual case: the norms are on ``device`` already, no move per tensor
        return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64)).square().sum()
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


def _split_dims(key) -> tuple[object, tuple[int, ...]]:
    """(mesh, the mesh dimensions a (mesh, placements) key is split over); (None, ()) for plain tensors."""
    if key is None:
        return None, ()
    mesh, placements = key
    # Shard, and FSDP2's _StridedShard over TP shards; replicated dimensions hold copies
    return mesh, tuple(dim for dim, placement in enumerate(placements) if not placement.is_replicate())


def _squared_norm(groups: dict[object, list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """Sum of squares of every group of ``groups`` ((mesh, placements) key, or None for plain tensors).

    Local shards first, summed over the groups split over the same mesh dimensions, then one all-reduce per
    such mesh dimension."""
    by_split: dict[tuple[object, tuple[int, ...]], torch.Tensor] = {}
    for key, grads in groups.items():
        local = [g.to_local() if key is not None else g for g in grads]
        split = _split_dims(key)
        sq = _local_squares(local).to(device)
        by_split[split] = by_split[split] + sq if split in by_split else sq
    total = torch.zeros((), dtype=torch.float64, device=device)
    for (mesh, dims), sq in by_split.items():
        for dim in dims:
            dist.all_reduce(sq, group=mesh.get_group(dim))
        total += sq
    return total


def _sum_pending_grads(params: list[torch.nn.Parameter]) -> None:
    """Replace each pending-sum (``Partial(sum)``) DTensor gradient by its sum, replicated over those mesh
    dimensions: the gradients of one (mesh, placements, dtype) flattened into one all-reduce per partial dimension."""
    dtensor = _dtensor_class()
    if dtensor is None:
        return
    from torch.distributed.tensor import Replicate

    groups: dict[tuple[object, tuple, torch.dtype], list[torch.nn.Parameter]] = {}
    for p in params:
        g = p.grad
        if isinstance(g, dtensor) and any(pl.is_partial() for pl in g.placements):
            if all(pl.reduce_op == "sum" for pl in g.placements if pl.is_partial()):
                groups.setdefault((g.device_mesh, tuple(g.placements), g.dtype), []).append(p)
    for (mesh, placements, _), group in groups.items():
        locals_ = [p.grad.to_local() for p in group]
        flat = torch.cat([t.reshape(-1) for t in locals_])
        for dim, placement in enumerate(placements):
            if placement.is_partial():
                dist.all_reduce(flat, group=mesh.get_group(dim))
        summed = [Replicate() if pl.is_partial() else pl for pl in placements]
        for p, piece, t in zip(group, flat.split([t.numel() for t in locals_]), locals_, strict=True):
            g = p.grad
            local = piece.view(t.shape)
            p.grad = dtensor.from_local(local, mesh, summed, run_check=False, shape=g.shape, stride=g.stride())


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
    _sum_pending_grads(params)
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
