"""The engine of every strategy without a pipeline (single, ddp, fsdp, tp, hybrid with pp.size=1): ``ModuleEngine``,
one (possibly wrapped) module per rank with gradient accumulation. Its sibling for pipelines is
``parallel/assembly/pipeline_engine.py``."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from models.losses import token_cross_entropy
from models.moe import moe_layers, set_aux_loss_scale
from models.mtp import mtp_metrics, mtp_modules
from parallel.assembly.engine import Engine
from parallel.foundation.expert_load import ExpertLoad
from parallel.foundation.intervals import Meter, StepCommMeter
from parallel.foundation.token_loss import TokenMean


class ModuleEngine(Engine):
    """One (possibly wrapped) module per rank; gradient accumulation over ``accumulation`` chunks
    (``parallel/assembly/compose.py`` wraps it).

    ``loss_fn`` is the model family's loss (``ctx.model_spec.loss_fn()``), summed over each chunk's target tokens
    and divided by the step's count of targets over ``loss_mesh`` (``TokenMean``); a loss that comes back as a
    DTensor (vocabulary-sharded logits) is returned as a plain tensor. ``no_sync`` suppresses gradient
    synchronisation on all but the last chunk (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``), so
    accumulation costs one reduction per step. ``loss_parallel`` runs forward and backward inside torch's
    ``loss_parallel()`` (the head is vocabulary-sharded). Measured: ``dp_timer``, the dp dimension's collectives
    (DDP buckets or FSDP2's), as ``comm_time_s`` / ``comm_fraction`` over the step; ``meters``, the techniques'
    own (``Engine.meters``); a MoE's tokens per expert. ``rank_map`` goes to the summary.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        accumulation: int = 1,
        loss_fn: Callable[..., torch.Tensor] = token_cross_entropy,
        loss_mesh: Any = None,
        no_sync: Callable[[], AbstractContextManager] | None = None,
        dp_timer: StepCommMeter | None = None,
        loss_parallel: bool = False,
        meters: list[Meter] | None = None,
        rank_map: dict[str, Any] | None = None,
    ):
        self.module = module
        self.expert_load = ExpertLoad()
        self.model_parts = [module]
        self.accumulation = accumulation
        self.loss = TokenMean(loss_fn, loss_mesh=loss_mesh)
        self.no_sync = no_sync or nullcontext
        self.dp_timer = dp_timer
        self.loss_parallel = loss_parallel
        self.meters = list(meters or ())
        self.rank_map = rank_map or {}
        self._step_start = time.perf_counter()
        # looked for once: the module tree is built, and walking it after every step is host time (docs/benchmarks.md)
        self.moe = bool(moe_layers(module))
        self.mtp = bool(mtp_modules([module]))
        set_aux_loss_scale(module, 1.0 / accumulation)  # a MoE's auxiliary loss scaled as the LM loss (loss / n)

    def _loss_context(self, stack: ExitStack) -> None:
        if self.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self._step_start = time.perf_counter()
        n = self.accumulation
        total = None
        self.loss.start(targets, global_count=self.batch_targets)
        with ExitStack() as stack:
            self._loss_context(stack)
            self.metered(stack)
            if self.dp_timer is not None:
                stack.enter_context(self.dp_timer.step(self.measure_step))
            for i, (x, y) in enumerate(micro_batches(inputs, targets, n)):
                with self.no_sync() if i < n - 1 else nullcontext():
                    loss = self.loss(self.module(x), y)
                    loss.backward()
                total = loss.detach() if total is None else total + loss.detach()
        return total

    @torch.no_grad()
    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = self.accumulation  # the training chunks: no more activation memory than a training step
        total = torch.zeros((), device=inputs.device)
        with ExitStack() as stack:
            self._loss_context(stack)
            self.loss.start(targets, global_count=self.batch_targets)
            for x, y in micro_batches(inputs, targets, n):
                total += self.loss(self.module(x), y)
        return total

    def step_metrics(self) -> dict[str, Any]:
        elapsed = max(time.perf_counter() - self._step_start, 1e-9)  # the loop's step: forward/backward, clip, update
        out = self.meter_metrics(elapsed)
        if self.moe:
            out.update(self.expert_load.take(self.module, reduce=self._sum_over_data_ranks))
        if self.mtp:  # every data-parallel rank holds the same modules
            out.update(
                mtp_metrics(
                    [self.module], device=next(self.module.parameters()).device, reduce=self._sum_over_data_ranks
                )
            )
        taken = self.dp_timer.take() if self.dp_timer is not None else None
        if taken is not None:
            busy, count = taken
            out.update(comm_time_s=busy, comm_fraction=min(1.0, busy / elapsed))
            out[self.dp_timer.count_key] = count
        return out

    def _sum_over_data_ranks(self, t: torch.Tensor) -> None:
        """In place over the loss mesh (dp x cp), the ranks that see different tokens."""
        if self.loss.group is not None:
            dist.all_reduce(t, group=self.loss.group)

    def summary(self) -> dict[str, Any]:
        # every training step's routing, summed over the data-parallel ranks
        return {**self.rank_map, **self.meter_summary(), **self.expert_load.summary()}

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        super().close()


def micro_batches(inputs: torch.Tensor, targets: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The step's ``n`` accumulation chunks of (inputs, targets); the batch itself when ``n`` is 1 (no split ops)."""
    return [(inputs, targets)] if n == 1 else list(zip(inputs.chunk(n), targets.chunk(n)))
