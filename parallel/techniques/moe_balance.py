"""DeepSeek-V3's auxiliary-loss-free balancing as a step of the composition: after each optimizer step every MoE
block's routing bias moves towards the mean load (``models.moe.update_expert_bias``), from the step's expert counts
summed over the ranks that saw different tokens (dp x cp), so every replica of the router moves its bias alike and
the bias equals one process's whatever the layout."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from models.moe import moe_layers, update_expert_bias


def bias_balancing(module: nn.Module, *, group: dist.ProcessGroup | None) -> Callable[[], None] | None:
    """The after-step hook for ``module``'s bias-balanced MoE blocks (``model.bias_update_rate > 0``); None when it
    has none. ``group``: the data-parallel ranks whose counts are summed (None: this rank's alone)."""
    if not any(m.router.expert_bias is not None for m in moe_layers(module)):
        return None

    def reduce(counts: torch.Tensor) -> None:
        dist.all_reduce(counts, group=group)

    def update() -> None:
        update_expert_bias(module, reduce=reduce if group is not None else None)

    return update
