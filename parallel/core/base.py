"""What a strategy is: a class built from ``cfg.parallel`` that turns the model into an ``Engine``.

The training loop knows only ``Engine``: it hands it the rank's share of the global batch and gets
back the mean loss over that share (``None`` on ranks that compute no loss, such as early pipeline
stages). How the forward and backward passes run (one module, accumulated micro-batches, a pipeline
schedule) is the engine's business, and so are the extra measurements it reports. A user plugs in a
strategy of their own by pointing ``parallel._target_`` at a ``Strategy`` subclass.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from parallel.core.layout import ParallelLayout


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token (or sample) cross-entropy, for sequence and classification outputs alike."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


@dataclass
class WorkerContext:
    """Everything a strategy needs to build its engine on one rank."""

    cfg: DictConfig
    layout: ParallelLayout
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, or None for one process
    run_dir: Path
    log: logging.Logger

    @property
    def coords(self) -> dict[str, int]:
        return self.layout.coords(self.rank)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def build_model(self) -> nn.Module:
        """The full model, initialised from ``trainer.seed`` so every rank and layout starts equal."""
        torch.manual_seed(self.cfg.trainer.seed)
        with torch.device("cpu"):
            model = instantiate(self.cfg.model)
        return model

    def per_replica_batch(self) -> int:
        return int(self.cfg.data.global_batch_size) // self.layout.dp

    def accumulation_steps(self) -> int:
        """Forward passes per step on one replica, from ``data.micro_batch_size``."""
        mbs = self.cfg.data.get("micro_batch_size")
        return self.per_replica_batch() // int(mbs) if mbs else 1


class Engine(ABC):
    """A model prepared by a strategy, driven one optimizer step at a time by the loop."""

    #: local modules (one per pipeline stage held by this rank; one otherwise)
    model_parts: list[nn.Module]

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.model_parts:
            yield from part.parameters()

    def local_batch(self, ctx: WorkerContext, inputs: torch.Tensor, targets: torch.Tensor):
        """This rank's share of the global batch: the dp-th contiguous slice."""
        dp, dp_rank = ctx.layout.dp, ctx.coords["dp"]
        n = inputs.shape[0] // dp
        sl = slice(dp_rank * n, (dp_rank + 1) * n)
        return inputs[sl].to(ctx.device, non_blocking=True), targets[sl].to(ctx.device, non_blocking=True)

    @abstractmethod
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward over this rank's batch; return its mean loss (detached) or None."""

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward only (no gradients) over this rank's batch; return its mean loss or None (ranks that
        compute no loss). The loop calls it between training steps, with the modules in eval mode, on
        every rank at the same time (it may hold collectives)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement eval_step; set trainer.eval_every=0")

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the global gradient norm; returns the norm before clipping."""
        params = [p for p in self.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
        full = getattr(norm, "full_tensor", None)
        return full() if full is not None else norm

    def step_metrics(self) -> dict[str, float]:
        """Measured extras for the step just taken (comm_fraction, bubble_fraction ...)."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Extras for summary.json (per-stage tables, theoretical vs measured bubble ...)."""
        return {}

    def train(self, mode: bool = True) -> None:
        for part in self.model_parts:
            part.train(mode)

    def close(self) -> None:
        """Drop references to wrapped modules (teardown order matters for DDP; see worker.py)."""
        self.model_parts = []


class ModuleEngine(Engine):
    """One (possibly wrapped) module per rank; gradient accumulation over ``accumulation`` chunks.

    ``no_sync`` suppresses gradient synchronisation on all but the last chunk (DDP's ``no_sync``,
    FSDP2's ``set_requires_gradient_sync``), so accumulation costs one all-reduce per step.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        accumulation: int = 1,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy,
        no_sync: Callable[[], AbstractContextManager] | None = None,
    ):
        self.module = module
        self.model_parts = [module]
        self.accumulation = accumulation
        self.loss_fn = loss_fn
        self.no_sync = no_sync or nullcontext

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = self.accumulation
        total = torch.zeros((), device=inputs.device)
        for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n))):
            ctx = self.no_sync() if i < n - 1 else nullcontext()
            with ctx:
                loss = self.loss_fn(self.module(x), y) / n
                loss.backward()
            total += loss.detach()
        return total

    @torch.no_grad()
    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = self.accumulation  # the training chunks: no more activation memory than a training step
        total = torch.zeros((), device=inputs.device)
        for x, y in zip(inputs.chunk(n), targets.chunk(n)):
            total += self.loss_fn(self.module(x), y) / n
        return total

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        super().close()


class Strategy(ABC):
    """Built by ``hydra.utils.instantiate(cfg.parallel)`` inside each worker."""

    def __init__(self, *, name: str, **options: Any):
        self.name = name
        self.options = options

    @abstractmethod
    def build(self, *, ctx: WorkerContext) -> Engine:
        """Build this rank's engine: split, shard and wrap the model as the strategy says."""
