"""The global gradient norm when parameters are DTensors on different meshes, or plain tensors.

After tensor parallel and FSDP2, one model holds parameters sharded over (dp, tp), over dp only,
or replicated plain tensors; a pipeline holds only its stage's. ``torch.nn.utils.clip_grad_norm_``
stacks the per-parameter norms and fails on such a mix. Here squared norms of the local shards are
summed per (mesh, placements) group over the mesh dimensions they are split on (replicated
dimensions hold copies), then over the pipeline group, so every rank clips by the norm one process
would compute over the whole model.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate


def total_grad_norm(grads: list[torch.Tensor], *, pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """L2 norm over all ``grads`` (and over the other pipeline stages when ``pp_group`` is given)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        g = _without_partial(g)
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    sq = torch.zeros((), dtype=torch.float64)
    for key, group in groups.items():
        sq += _squared_norm(group, key)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt()


def _without_partial(g: torch.Tensor) -> torch.Tensor:
    """A pending sum (a replicated parameter's gradient under sequence parallel) reduced first:
    the norm of a sum is not the sum of norms."""
    if isinstance(g, DTensor) and any(p.is_partial() for p in g.placements):
        return g.redistribute(g.device_mesh, [Replicate() if p.is_partial() else p for p in g.placements])
    return g


def _squared_norm(grads: list[torch.Tensor], key) -> torch.Tensor:
    """Sum of squares of ``grads`` sharing one (mesh, placements) key, or all plain (key None).

    Local shards first, then one all-reduce per mesh dimension the grads are split over.
    """
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    sq = torch.nn.utils.get_total_norm(local, norm_type=2.0, foreach=False).detach().double().cpu() ** 2
    if key is not None:
        mesh, placements = key
        for dim, placement in enumerate(placements):
            if not placement.is_replicate():  # Shard, and FSDP2's _StridedShard over TP shards
                dist.all_reduce(sq, group=mesh.get_group(dim))
    return sq


def clip_grad_norm_(
    params: Iterable[torch.nn.Parameter], max_norm: float, *, pp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm``; return the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = total_grad_norm(grads, pp_group=pp_group)
    if max_norm > 0:
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm.float()
