"""The global gradient norm when parameters are DTensors on different meshes, or plain tensors.

After tensor parallel and FSDP2, one model holds parameters sharded over (dp, tp), over dp only,
or replicated plain tensors; a pipeline holds only its stage's. ``torch.nn.utils.clip_grad_norm_``
stacks the per-parameter norms and fails on such a mix. Here norms are taken per mesh (one
reduction each, ``full_tensor``), summed as squares, and summed over the pipeline group, so every
rank clips by the same norm that one process would compute over the whole model.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_grad_norm(grads: list[torch.Tensor], *, pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """L2 norm over all ``grads`` (and over the other pipeline stages when ``pp_group`` is given)."""
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    sq = torch.zeros((), dtype=torch.float64)
    for mesh, group in by_mesh.items():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        sq += norm.double().cpu() ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt()


def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float, *,
                    pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm``; return the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = total_grad_norm(grads, pp_group=pp_group)
    if max_norm > 0:
        coef = max_norm / (float(norm) + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm.float()
