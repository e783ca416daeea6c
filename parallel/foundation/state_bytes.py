"""Bytes of parameters, gradients and optimizer state a rank holds, read from its local shards.

One definition for the trainer's summary (``model_state_bytes_per_rank``) and the planner's dry run
(``parallel/plan/dry_run.py``), so a dry run and a real run of one layout are compared like for like.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def local_bytes(tensors: Iterable[Any], *, materialised: bool = False) -> int:
    """Sum of the local (per-rank) storage of ``tensors``: a DTensor counts its shard only. ``materialised``: only
    storage that exists, a tensor on the meta device (a model not materialised yet) counting nothing; else every
    tensor its size (the dry run's fake tensors what they stand for)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if not (materialised and local.is_meta):
            total += local.numel() * local.element_size()
    return int(total)


def frozen_copy(params: Iterable[Any]) -> list[Any]:
    """A detached clone of each of ``params`` as this rank holds it (a DTensor keeps its placement): a frozen
    reference model sharded like the policy (``trainer/loop/reference.py``), measured by the dry run as built."""
    import torch

    with torch.no_grad():
        return [p.detach().clone() for p in params]


def model_state_bytes(params: list[Any], optimizer: Any) -> dict[str, int]:
    """{params, grads, optimizer, model_state} on this rank; optimizer state counts tensors with a shape
    (Adam's moments), not its step counters."""
    import torch

    state = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    out = {
        "params": local_bytes(params),
        "grads": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": local_bytes(state),
    }
    out["model_state"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def held_state_bytes(params: list[Any], optimizer: Any, *, reference_copy: bool) -> dict[str, int]:
    """``model_state_bytes`` and ``reference``: a frozen reference's copy of ``params`` as the trainer takes it
    (``frozen_copy``), measured when the run holds one (``reference_copy``), else 0."""
    reference = local_bytes(frozen_copy(params)) if reference_copy else 0
    return {**model_state_bytes(params, optimizer), "reference": reference}
