"""The optimizer settings every engine's parameters need, shared by the trainer and the calibration."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def foreach_for(params: Iterable[torch.Tensor]) -> bool | None:
    """``foreach`` for a torch optimizer over ``params``: False when any is a DTensor (foreach kernels mix
    badly with DTensor parameters of different meshes; plain loops are exact too), else None (torch's
    default). By type name: a run without DTensors need not import torch.distributed.tensor."""
    return False if any(type(p).__name__ == "DTensor" for p in params) else None
