"""The MoE balance as steps of the composition, both taken over the ranks that run the same micro-batch at once
(dp x cp), so what the router is trained on does not depend on the layout:

- ``scope_balance``: the load-balancing loss's expert counts (``models.moe.MoE.balance_group``): summed over dp x
  cp under ``model.balance_scope=global``, over cp only (the ranks holding parts of the same sequences) under
  ``micro_batch``;
- ``bias_balancing``: DeepSeek-V3's auxiliary-loss-free balancing, after each optimizer step every MoE block's
  routing bias moves towards the mean load (``models.moe.update_expert_bias``), from the step's expert counts
  summed over dp x cp, so every replica of the router moves its bias alike and the bias equals one process's
  whatever the layout."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from models.moe import moe_layers, update_expert_bias


def scope_balance(
    module: nn.Module, *, data_group: dist.ProcessGroup | None, sequence_group: dist.ProcessGroup | None
) -> None:
    """Give every MoE block of ``module`` the group its load-balancing loss's counts are summed over, by its
    ``balance_scope``: ``data_group`` (the loss mesh, dp x cp) for global, ``sequence_group`` (the ranks holding
    chunks of the same samples, cp) for micro_batch (None: the rank's own tokens)."""
    for block in moe_layers(module):
        block.balance_group = data_group if block.balance_scope == "global" else sequence_group
        block.sequence_group = sequence_group


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
