"""The optimizer settings every engine's parameters need, shared by the trainer and the calibration."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def foreach_for(params: Iterable[torch.Tensor]) -> bool | None:
    """``foreach`` for a torch optimizer over ``params``: None (torch's default: the foreach kernels on CUDA, a
    loop on CPU) when the parameters are all plain tensors or all DTensors of one mesh (FSDP2 alone, TP alone
    with every parameter distributed); False when they mix plain tensors and DTensors or DTensors of several
    meshes (FSDP2 over TP, a plain norm beside TP's shards), which one foreach kernel cannot take. A loop over
    DTensors dispatches every parameter's every op through DTensor on the host (docs/benchmarks.md, "On a GPU").
    By type name: a run without DTensors need not import torch.distributed.tensor."""
    kinds = {p.device_mesh if type(p).__name__ == "DTensor" else None for p in params}
    return None if len(kinds) <= 1 else False
