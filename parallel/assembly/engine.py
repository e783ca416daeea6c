"""What the training loop drives: ``Engine``, a model prepared by a strategy.

The loop knows only ``Engine``: it hands it the rank's share of the global batch and gets back that share's part
of the step's loss (the mean over the global batch's target tokens), scaled so that its average over the ranks
that computed one is that loss (``None`` on ranks that compute no loss, such as early pipeline stages;
``parallel/foundation/token_loss.py``). How the forward and backward passes run is the engine's business: one
module with accumulated micro-batches (``parallel/assembly/module_engine.py``) or a pipeline schedule
(``parallel/assembly/pipeline_engine.py``); so are the extra measurements it reports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from parallel.assembly.context import WorkerContext
from parallel.foundation.grad_clip import clip_grad_norm_
from parallel.foundation.intervals import Meter


class Engine(ABC):
    """A model prepared by a strategy, driven one optimizer step at a time by the loop."""

    #: local modules (one per pipeline stage held by this rank; one otherwise)
    model_parts: list[nn.Module]
    #: the pipeline group whose stages together hold the model; None when this rank holds all of it
    pp_group: Any = None
    #: whether the next ``train_step`` is one the loop measures (a logged step, the first of its window of
    #: ``trainer.measure_every``): set by the loop before each step, so an engine's sampled meters (DDP's reducer
    #: timer, the TP collective timer) run on exactly those steps, a resumed run's included
    measure_step: bool = True
    #: the next batch's count of targets over the whole global batch (which the loss mesh's ranks share out), set by
    #: the loop before each ``train_step`` / ``eval_step``; the loss then needs no all-reduce to count them. None:
    #: counted and all-reduced (``parallel/foundation/token_loss.py``)
    batch_targets: int | None = None
    #: run after each optimizer step, in order (``ComposedPart.after_update``: fp8's float8 weight scales)
    after_update: Sequence[Callable[[], None]] = ()

    def after_optimizer_step(self) -> None:
        """What the composed modules need once the optimizer has changed their weights."""
        for hook in self.after_update:
            hook()

    #: parameters that hold a copy of another's gradient (a tied embedding's head on a pipeline rank of its own,
    #: ``parallel/pipeline/tied.py``): updated and clipped, counted once in the gradient norm
    uncounted: tuple[nn.Parameter, ...] = ()
    #: copy name -> the name its optimizer state is saved under (the same copies; ``trainer/checkpoint``)
    state_aliases: dict[str, str] = {}

    def parameters(self) -> Iterator[nn.Parameter]:
        """Each parameter once (two local stages may share a tied one)."""
        seen: set[int] = set()
        for part in self.model_parts:
            for p in part.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    #: what each dimension that splits a sample keeps of it, applied in order to the inputs and targets alike
    #: (``Composed.sample_shares``: context parallel's sequence chunk)
    sample_shares: Sequence[Callable[[torch.Tensor], torch.Tensor]] = ()
    #: the techniques' meters (``parallel/foundation/intervals.py`` ``Meter``: tp's collectives, cp's and ep's
    #: all-to-alls), entered around each step; their metrics go to each logged step, their summaries to the run's
    meters: Sequence[Meter] = ()

    def local_batch(self, ctx: WorkerContext, inputs: torch.Tensor, targets: torch.Tensor):
        """This rank's share of the global batch: the dp-th contiguous slice of the samples, then of each sample
        what ``sample_shares`` keep (inputs and their targets alike)."""
        dp, dp_rank = ctx.layout.dp, ctx.coords["dp"]
        n = inputs.shape[0] // dp
        sl = slice(dp_rank * n, (dp_rank + 1) * n)
        x, y = inputs[sl], targets[sl]
        extra = int(getattr(ctx.loss_fn(), "extra_columns", 0)) if self.sample_shares else 0
        if extra:  # a loss's per-row columns after the tokens (a preference reference), kept whole
            tail, y = y[..., y.shape[-1] - extra :], y[..., : y.shape[-1] - extra]
        for share in self.sample_shares:
            x, y = share(x), share(y)
        y = torch.cat([y, tail], dim=-1) if extra else y
        return x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)

    def metered(self, stack: ExitStack) -> None:
        """Enter every meter for the step about to run (each times it or not, by ``measure_step``)."""
        for meter in self.meters:
            stack.enter_context(meter.step(self.measure_step))

    def meter_metrics(self, elapsed_s: float) -> dict[str, Any]:
        """The meters' metrics for the step just run, ``elapsed_s`` long."""
        return {k: v for meter in self.meters for k, v in meter.metrics(elapsed_s).items()}

    def meter_summary(self) -> dict[str, Any]:
        return {k: v for meter in self.meters for k, v in meter.summary().items()}

    @abstractmethod
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward over this rank's batch; return its part of the global batch's token-mean loss
        (detached; ``TokenMean``) or None."""

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward only (no gradients) over this rank's batch; return its part of the batch's token-mean loss,
        as ``train_step``, or None (ranks that compute no loss). The loop calls it between training steps, with
        the modules in eval mode, on every rank at the same time (it holds collectives)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement eval_step; set trainer.eval_every=0")

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the global gradient norm (over every shard and, with ``pp_group``, every stage);
        returns the norm before clipping. One path for every engine: ``parallel/foundation/grad_clip.py``. The
        parameter list is taken at the first call (after any checkpoint or weights were loaded in place): walking
        the modules every step is host time a GPU waits for."""
        params = self.__dict__.get("_clip_params")
        if params is None:
            params = self.__dict__["_clip_params"] = list(self.parameters())
        return clip_grad_norm_(params, max_norm, pp_group=self.pp_group, uncounted=self.uncounted)

    def step_metrics(self) -> dict[str, Any]:
        """Measured extras for the step just taken (comm_fraction, bubble_fraction, a MoE's tokens per expert ...)."""
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
