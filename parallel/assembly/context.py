"""What a strategy builds its engine from, on one rank: ``WorkerContext``, the typed run (``RunSpec``) and this rank's
place in it (rank, device, mesh, run folder), with the model built and placed as every strategy builds it
(``build_model``, ``place``). The engines (``parallel/assembly/engine.py``) and strategies
(``parallel/assembly/strategy.py``) are beside it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.lora import add_adapters, init_lora
from parallel.foundation.layout import ParallelLayout
from parallel.foundation.memory import BuildPeak
from parallel.foundation.meshes import loss_mesh, sequence_mesh
from parallel.foundation.run import ComposeSettings, RunSpec
from parallel.foundation.state_bytes import local_bytes
from parallel.foundation.ties import retie, tied_parameters


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

            self.__dict__["_objective_loss"] = PreferenceLoss(self.run.objective, sequence_group=self.sequence_group())
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
        # adapters beside frozen weights (model.lora); drawn here, or by place() after a meta build
        adapted = add_adapters(model, self.run.model, seed=self.run.seed, draw=device != "meta")
        if adapted is not None:
            self.model_init["lora_modules"] = adapted
        self.model_init.update(init_device=device, full_fp32_bytes=self.full_fp32_bytes())
        self._record_build(model)
        return self.place(model) if materialize and device == "meta" else model

    def _record_build(self, module: nn.Module, *, placed: bool = False) -> None:
        """Largest parameter + buffer bytes materialised at once (the whole model when built on cpu; the sum
        of the parts placed so far when built on meta), and the peak memory growth so far."""
        held = local_bytes([*module.parameters(), *module.buffers()], materialised=True)
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

    def loss_mesh(self) -> Any:
        """The mesh the loss's target count is all-reduced and the gradients are averaged over (dp x cp); None
        for one process."""
        return loss_mesh(self.mesh, self.layout.sizes) if self.mesh is not None else None

    def sequence_group(self) -> Any:
        """The process group over which each sample's sequence is split (cp), whose ranks sum a row's per-token
        terms; None when no dimension splits it."""
        mesh = sequence_mesh(self.mesh, self.layout.sizes) if self.mesh is not None else None
        return mesh.get_group() if mesh is not None else None

    def per_replica_batch(self) -> int:
        return self.run.batch.per_replica(self.layout.dp)

    def accumulation_steps(self) -> int:
        """Forward passes per step on one replica, from ``data.micro_batch_size``."""
        return self.run.batch.accumulation_steps(self.layout.dp)
