"""The training loss as the mean over the target tokens of the global batch, whatever engine computes it.

Chat data masks prompt tokens (``models.losses.IGNORE_INDEX``), so ranks and micro-batches hold different
numbers of targets: a mean of per-micro-batch or per-rank means would weigh a token by how crowded its
micro-batch is. Instead every engine sums the token losses of each micro-batch (the family's loss with
``reduction="sum"``) and divides by one number per step, ``TokenMean.start(targets)``: this rank's count of
targets all-reduced over the loss mesh (``parallel/foundation/meshes.py``'s ``loss_mesh``: the ranks that see different
tokens, dp x cp), divided by that mesh's size because the gradient reduction (DDP, FSDP2) averages over it. So the
gradients after the reduction are those of ``sum of token losses / global count``, and the value an engine
returns (the sum of its micro-batches' terms) averages over the ranks that computed one to that same loss (the
loop's ``_agree`` on logged steps; tp ranks hold equal copies). With no masked tokens and equal lengths every term
equals what a mean per micro-batch gave, up to rounding.

The loss mesh's ranks together hold the whole global batch, which every rank builds (the loop slices its share), so
the loop counts the global batch's targets itself and hands the number in (``start(targets, global_count=...)``): the
same count, without the all-reduce (one collective per step fewer; docs/benchmarks.md, the ddp pair).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from models.losses import count_targets


class TokenMean:
    """The family's loss divided by the step's global count of targets (over the loss mesh's ranks)."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor], *, loss_mesh: Any = None):
        self.loss_fn = loss_fn
        spans = loss_mesh is not None and loss_mesh.size() > 1
        self.group = loss_mesh.get_group() if spans else None
        self.replicas = loss_mesh.size() if spans else 1
        self.divisor: torch.Tensor | None = None
        self.count: torch.Tensor | None = None
        self._summing: Any = None
        """The count's all-reduce in flight (``start``), waited for by the step's first micro-batch's term."""
        self._given: tuple[tuple[int, torch.device], torch.Tensor, torch.Tensor] | None = None
        """The last ``global_count``'s (value and device, count, divisor): built again only when it changes."""

    def start(self, targets: torch.Tensor, *, global_count: int | None = None) -> torch.Tensor:
        """Count this rank's targets for the step (or evaluation batch) about to run, all-reduced over the loss
        mesh: every rank of that mesh calls it with its own targets. The all-reduce runs while the forward does (the
        first term waits for it, after its own loss): the start of a step is no point where the ranks wait for each
        other. Returns the count tensor, the global count once the first term is taken (at once without a mesh).

        ``global_count``: the loss mesh's count of targets, counted by the caller on the global batch those ranks'
        shares make up: taken as it is (no ops, no all-reduce). A loss that counts something else (pairs) counts."""
        counter = getattr(self.loss_fn, "count", None)  # a loss over pairs counts pairs
        if global_count is not None and counter is None:
            key = (int(global_count), targets.device)
            if self._given is None or self._given[0] != key:
                count = torch.tensor(key[0], dtype=torch.int64, device=targets.device)
                self._given = (key, count, count.clamp(min=1).to(torch.float32) / self.replicas)
            _, self.count, self.divisor = self._given
            self._summing = None
            return self.count
        count = (counter or count_targets)(targets)
        self._summing = dist.all_reduce(count, group=self.group, async_op=True) if self.group is not None else None
        self.count, self.divisor = count, None
        return count

    def __call__(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """One micro-batch's term: its summed token losses over the step's divisor (``start`` first)."""
        if self.count is None:
            raise RuntimeError("TokenMean called before start(targets) counted the step's targets")
        loss = self.loss_fn(output, targets, reduction="sum")
        if isinstance(loss, DTensor):  # vocabulary-sharded logits (tp.loss_parallel): a replicated scalar
            loss = loss.full_tensor()
        if self.divisor is None:
            if self._summing is not None:
                self._summing.wait()
                self._summing = None
            # a batch without any target (every token masked) gives a loss of 0 and no gradient, not 0 / 0
            self.divisor = self.count.clamp(min=1).to(torch.float32) / self.replicas
        return loss / self.divisor.to(loss.device)
