"""What a strategy is: a class built from the ``parallel`` config group that turns the model into an ``Engine``.

The training loop knows only ``Engine``: it hands it the rank's share of the global batch and gets
back that share's part of the step's loss (the mean over the global batch's target tokens), scaled so that
its average over the ranks that computed one is that loss (``None`` on ranks that compute no loss, such as
early pipeline stages; ``parallel/foundation/token_loss.py``). How the forward and backward passes run (one
module, accumulated micro-batches, a pipeline schedule) is the engine's business, and so are the extra
measurements it reports. A user plugs in a
strategy of their own by pointing ``parallel._target_`` at a ``Strategy`` subclass.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from models.lora import LoRA, apply_lora, init_lora
from models.losses import token_cross_entropy
from models.moe import moe_step_table, set_aux_loss_scale
from parallel.foundation.comm_timer import SampledCommMeter
from parallel.foundation.expert_load import ExpertLoad
from parallel.foundation.grad_clip import clip_grad_norm_
from parallel.foundation.intervals import StepCommMeter
from parallel.foundation.layout import ParallelLayout
from parallel.foundation.memory import BuildPeak, tensor_bytes
from parallel.foundation.meshes import loss_mesh
from parallel.foundation.run import ComposeSettings, RunSpec
from parallel.foundation.ties import retie, tied_parameters
from parallel.foundation.token_loss import TokenMean
from parallel.techniques.cp import local_chunk
from parallel.techniques.tp import tp_meter


@dataclass
class WorkerContext:
    """Everything a strategy needs to build its engine on one rank: the typed run (``RunSpec``) and this rank's
    place in it. The trainer hands a subclass of its own (``trainer/typed/run_spec.py``) that also carries the config for
    its loop; nothing here reads it."""

    run: RunSpec
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh, or None for one process
    run_dir: Path
    log: logging.Logger
    sample_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None
    """A few rows of the run's data (``pp.split=balanced`` times the blocks on them); None: no data at hand."""
    model_init: dict[str, Any] = field(default_factory=dict)
    """How this rank's model was made (init device, bytes); filled by ``build_model`` and the worker."""
    _build_peak: BuildPeak = field(init=False, repr=False)
    _placed_bytes: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self._build_peak = BuildPeak(self.device)

    @property
    def layout(self) -> ParallelLayout:
        return self.run.layout

    def loss_fn(self) -> Callable[..., torch.Tensor]:
        """The loss every engine of this rank calls: the run's objective (``RunSpec.objective``: a preference loss,
        one object per rank, whose step statistics the loop reads) or the model family's own."""
        if self.run.objective is None:
            return self.model_spec.loss_fn()
        if "_objective_loss" not in self.__dict__:
            from models.preference import PreferenceLoss

            self.__dict__["_objective_loss"] = PreferenceLoss(self.run.objective)
        return self.__dict__["_objective_loss"]

    @property
    def model_spec(self):
        """The model family's ``ModelSpec`` (``models/registry.py``): loss, TP plan, pipeline units, formulas."""
        from models.registry import spec_for

        return spec_for(self.run.model)

    def full_fp32_bytes(self) -> float | None:
        """The whole model's fp32 weights, from its spec's formula (None when the spec has none)."""
        spec = self.model_spec
        return 4.0 * spec.shape(self.run.model).params if spec.shape is not None else None

    def init_device(self) -> str:
        """``model.init_device`` resolved: ``meta`` or ``cpu`` (auto: meta when the full fp32 weights exceed
        the rank's budget, topology.device_memory_gb x planner.memory_fraction). Always meta with
        ``model.init_from``: each rank then reads only the weights it holds."""
        from models.spec import resolve_init_device

        if self.weights_from_checkpoint:
            return "meta"
        return resolve_init_device(
            self.run.init_device, full_fp32_bytes=self.full_fp32_bytes(), budget_bytes=self.run.memory_budget_bytes
        )

    @property
    def coords(self) -> dict[str, int]:
        return self.layout.coords(self.rank)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def build_model(self, *, materialize: bool = True) -> nn.Module:
        """The full model, initialised from ``trainer.seed`` so every rank and layout starts equal.

        With ``model.init_device`` resolving to meta the module is built on the meta device (no memory);
        ``materialize=True`` then gives it storage on this rank's device and initialises it whole. Strategies
        that shard or split pass ``materialize=False`` and call ``place`` on what this rank keeps, after
        sharding (torchtitan's order: meta -> parallelize / split -> to_empty -> init_weights).
        """
        from parallel.foundation.precision import cast_parameters

        device = self.init_device()
        self._build_peak.start()
        torch.manual_seed(self.run.seed)
        with torch.device(device):
            model = cast_parameters(self.model_spec.build(self.run.model), self.precision)
        lora = LoRA.of(self.run.model)
        if lora is not None:  # adapters beside frozen weights; drawn here, or by place() after a meta build
            self.model_init["lora_modules"] = len(apply_lora(model, lora))
            if device != "meta":
                init_lora(model, seed=self.run.seed)
        self.model_init.update(init_device=device, full_fp32_bytes=self.full_fp32_bytes())
        self._record_build(model)
        return self.place(model) if materialize and device == "meta" else model

    def _record_build(self, module: nn.Module, *, placed: bool = False) -> None:
        """Largest parameter + buffer bytes materialised at once (the whole model when built on cpu; the sum
        of the parts placed so far when built on meta), and the peak memory growth so far."""
        held = tensor_bytes([*module.parameters(), *module.buffers()])
        if placed:
            self._placed_bytes += held
            held = self._placed_bytes
        self.model_init["materialised_bytes_max"] = max(self.model_init.get("materialised_bytes_max", 0), held)
        self.model_init["build_peak_growth_bytes"] = self._build_peak.read()

    @property
    def weights_from_checkpoint(self) -> bool:
        """``model.init_from`` is set: the weights are read after the build (``Trainer.resume``), not drawn."""
        return self.run.weights_from_checkpoint

    def place(self, module: nn.Module) -> nn.Module:
        """Put ``module`` (whole, a stage or a shard) on this rank's device: moved, or, when built on the meta
        device, given storage there (``to_empty``, tied weights tied again) and initialised (``init_weights()``
        when the module has one, else each submodule's ``reset_parameters()``). With ``model.init_from`` only
        what no checkpoint holds is computed (``init_buffers()``): the weights are read next, never drawn."""
        tensors = [*module.parameters(), *module.buffers()]
        if not any(t.is_meta for t in tensors):
            module = module.to(self.device)
            self._build_peak.read()
            self.model_init["build_peak_growth_bytes"] = self._build_peak.growth
            return module
        ties = tied_parameters(module)
        module.to_empty(device=self.device)
        retie(module, ties)
        torch.manual_seed(self.run.seed)
        with torch.no_grad():
            init = getattr(module, "init_weights", None)
            if self.weights_from_checkpoint:  # a family with non-persistent buffers computes them here
                init = getattr(module, "init_buffers", None) or (lambda: None)
            if callable(init):
                init()
            else:
                for sub in module.modules():
                    reset = getattr(sub, "reset_parameters", None)
                    if callable(reset):
                        reset()
            init_lora(module, seed=self.run.seed)  # no checkpoint of the base holds the adapters
        self._record_build(module, placed=True)
        return module

    @property
    def precision(self) -> str:
        """``trainer.precision``: fp32, bf16-mixed, bf16 or fp8 (``parallel/foundation/precision.py``)."""
        return self.run.precision

    def compose_settings(self) -> ComposeSettings:
        """What ``compose``'s wrappers read of this run: precision, checkpointing, compile, tp and dp options."""
        return self.run.compose

    def tp_meter(self, settings: ComposeSettings) -> SampledCommMeter:
        """The tp group's collectives timed on the logged steps (``tp.measure_comm``)."""
        return tp_meter(
            tp_mesh=self.mesh["tp"] if self.layout.tp > 1 else None,
            measure=settings.measure_tp_comm,
            compiled=settings.compile,
            log=self.log,
        )

    def loss_mesh(self) -> Any:
        """The mesh the loss's target count is all-reduced and the gradients are averaged over (dp x cp); None
        for one process."""
        return loss_mesh(self.mesh, self.layout.sizes) if self.mesh is not None else None

    def per_replica_batch(self) -> int:
        return self.run.batch.per_replica(self.layout.dp)

    def accumulation_steps(self) -> int:
        """Forward passes per step on one replica, from ``data.micro_batch_size``."""
        return self.run.batch.accumulation_steps(self.layout.dp)


class Engine(ABC):
    """A model prepared by a strategy, driven one optimizer step at a time by the loop."""

    #: local modules (one per pipeline stage held by this rank; one otherwise)
    model_parts: list[nn.Module]
    #: the pipeline group whose stages together hold the model; None when this rank holds all of it
    pp_group: Any = None
    #: whether the next ``train_step`` is one the loop logs: set by the loop before each step, so an engine's
    #: sampled meters (DDP's reducer timer, the TP collective timer) run on exactly the logged steps, a resumed
    #: run's included
    measure_step: bool = True
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

    def local_batch(self, ctx: WorkerContext, inputs: torch.Tensor, targets: torch.Tensor):
        """This rank's share of the global batch: the dp-th contiguous slice of the samples, and of each sample's
        tokens (inputs and their targets alike) the cp-th contiguous chunk."""
        coords = ctx.coords
        dp, dp_rank = ctx.layout.dp, coords["dp"]
        n = inputs.shape[0] // dp
        sl = slice(dp_rank * n, (dp_rank + 1) * n)
        cp, cp_rank = ctx.layout.cp, coords["cp"]
        x, y = (local_chunk(t[sl], cp=cp, index=cp_rank) for t in (inputs, targets))
        return x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)

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


class ModuleEngine(Engine):
    """One (possibly wrapped) module per rank; gradient accumulation over ``accumulation`` chunks. The engine of
    every strategy without a pipeline: single, ddp, fsdp, tp, hybrid with pp.size=1 (``parallel/assembly/compose.py``).

    ``loss_fn`` is the model family's loss (``ctx.model_spec.loss_fn()``), summed over each chunk's target tokens
    and divided by the step's count of targets over ``loss_mesh`` (``TokenMean``); a loss that comes back as a
    DTensor (vocabulary-sharded logits) is returned as a plain tensor. ``no_sync`` suppresses gradient
    synchronisation on all but the last chunk (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``), so accumulation
    costs one reduction per step. ``loss_parallel`` runs forward and backward inside torch's
    ``loss_parallel()`` (the head is vocabulary-sharded). Measured: ``dp_timer``, the dp dimension's
    collectives (DDP buckets or FSDP2's), as ``comm_time_s`` / ``comm_fraction`` over the step; ``tp_meter``,
    the tp group's; ``cp_meter``, the cp all-to-alls. ``rank_map`` goes to the summary.
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
        tp_meter: SampledCommMeter | None = None,
        cp_meter: SampledCommMeter | None = None,
        rank_map: dict[str, Any] | None = None,
        ep_timer: StepCommMeter | None = None,
    ):
        self.module = module
        self.ep_timer = ep_timer
        self.ep_a2a_total = 0.0
        self.expert_load = ExpertLoad()
        self.model_parts = [module]
        self.accumulation = accumulation
        self.loss = TokenMean(loss_fn, loss_mesh=loss_mesh)
        self.no_sync = no_sync or nullcontext
        self.dp_timer = dp_timer
        self.loss_parallel = loss_parallel
        self.tp_meter = tp_meter or SampledCommMeter(None)
        self.cp_meter = cp_meter or SampledCommMeter(None, prefix="cp")
        self.rank_map = rank_map or {}
        self._step_start = time.perf_counter()
        set_aux_loss_scale(module, 1.0 / accumulation)  # a MoE's auxiliary loss scaled as the LM loss (loss / n)

    def _loss_context(self, stack: ExitStack) -> None:
        if self.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self._step_start = time.perf_counter()
        n = self.accumulation
        total = None
        self.loss.start(targets)
        with ExitStack() as stack:
            self._loss_context(stack)
            stack.enter_context(self.tp_meter.step(self.measure_step))
            stack.enter_context(self.cp_meter.step(self.measure_step))
            if self.dp_timer is not None:
                stack.enter_context(self.dp_timer.step(self.measure_step))
            for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n))):
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
            self.loss.start(targets)
            for x, y in zip(inputs.chunk(n), targets.chunk(n)):
                total += self.loss(self.module(x), y)
        return total

    def step_metrics(self) -> dict[str, Any]:
        out = {**self.tp_meter.metrics(), **self.cp_meter.metrics(), **self._moe_balance()}
        elapsed = max(time.perf_counter() - self._step_start, 1e-9)  # the loop's step: forward/backward, clip, update
        taken = self.dp_timer.take() if self.dp_timer is not None else None
        if taken is not None:
            busy, count = taken
            out.update(comm_time_s=busy, comm_fraction=min(1.0, busy / elapsed))
            out[self.dp_timer.count_key] = count
        taken = self.ep_timer.take() if self.ep_timer is not None else None
        if taken is not None:
            busy, count = taken
            out.update(ep_a2a_time_s=busy, ep_a2a_fraction=min(1.0, busy / elapsed))
            self.ep_a2a_total += busy
            out[self.ep_timer.count_key] = count
        return out

    def _moe_balance(self) -> dict[str, Any]:
        """The step's expert balance and tokens per expert over every data-parallel rank
        (``parallel/foundation/expert_load.py``), added up over the run for the summary."""
        taken = moe_step_table(self.module, reduce=self._sum_over_data_ranks)
        return {} if taken is None else self.expert_load.add(*taken)

    def _sum_over_data_ranks(self, t: torch.Tensor) -> None:
        """In place over the loss mesh (dp x cp), the ranks that see different tokens."""
        if self.loss.group is not None:
            dist.all_reduce(t, group=self.loss.group)

    def summary(self) -> dict[str, Any]:
        # every training step's routing, summed over the data-parallel ranks
        out = {**self.rank_map, **self.cp_meter.summary(), **self.expert_load.summary()}
        if self.ep_timer is not None:
            out["ep_a2a_time_s_total"] = self.ep_a2a_total
        return out

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        super().close()


class Strategy(ABC):
    """Built by Hydra's ``instantiate`` of the ``parallel`` node inside each worker (``parallel._target_``)."""

    def __init__(self, *, name: str, **options: Any):
        self.name = name
        self.options = options

    @abstractmethod
    def build(self, *, ctx: WorkerContext) -> Engine:
        """Build this rank's engine: split, shard and wrap the model as the strategy says."""
