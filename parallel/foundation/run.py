"""The run after validation, typed: what ``parallel/`` reads of it, as frozen objects. No torch import.

The config stops at the trainer: ``trainer/typed/run_spec.py`` turns the composed Hydra config into a ``RunSpec`` once
(validation's strategy checks read it, and so does each worker), and nothing below it reads a config node. A new
option a technique needs is a field here, filled there.

- ``RunSpec``: the layout with its degrees (``ParallelLayout``), the model's own config (its family's frozen
  dataclass, ``ModelSpec.typed``), the batch, how the model is wrapped (``ComposeSettings``: precision, activation
  checkpointing, compile, tensor-parallel and DDP options), the pipeline's options, seed and budget;
- ``ComposeSettings`` / ``DDPSettings`` / ``Float8Settings``: what ``compose`` (``parallel/assembly/compose.py``) reads;
- ``BatchSpec``: the global batch, its sequence length and the accumulation chunk;
- ``PipelineOptions``: the split policy and the timeline's step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parallel.foundation.precision import FP8_RECIPES

if TYPE_CHECKING:
    from parallel.foundation.layout import ParallelLayout


@dataclass(frozen=True)
class DDPSettings:
    """``dp.*`` as DDP reads it."""

    bucket_cap_mb: float | None = None
    """None: torch's default buckets (25 MiB, the first 1 MiB)."""
    find_unused_parameters: bool = False
    sync_batchnorm: bool = False


@dataclass(frozen=True)
class Float8Settings:
    """``trainer.fp8.*`` as the conversion reads it (the trainer adds the family's head and router to ``skip``)."""

    recipe: str = "tensorwise"
    """One of ``FP8_RECIPES``."""
    fsdp_float8_all_gather: bool | None = None
    """All-gather FSDP2's weights in float8; None: on for tensorwise where FSDP2 wraps, off otherwise."""
    skip: tuple[str, ...] = ()
    """FQN patterns (``fnmatch``; a pipeline stage's prefix allowed) of Linears kept in high precision."""

    def __post_init__(self) -> None:
        if self.recipe not in FP8_RECIPES:
            raise ValueError(f"Float8Settings(recipe={self.recipe!r}): use one of {FP8_RECIPES}")
        if self.fsdp_float8_all_gather and self.recipe != "tensorwise":
            raise ValueError(
                f"Float8Settings(recipe={self.recipe!r}, fsdp_float8_all_gather=True): torchao all-gathers float8 "
                "weights with tensorwise scales only"
            )

    def all_gather_in_float8(self, *, fsdp: bool) -> bool:
        """Whether FSDP2 all-gathers the converted weights in float8 (needs FSDP2 to wrap them at all)."""
        if not fsdp:
            return False
        return self.recipe == "tensorwise" if self.fsdp_float8_all_gather is None else self.fsdp_float8_all_gather


@dataclass(frozen=True)
class ComposeSettings:
    """What the wrappers read of the run (the trainer builds it from ``trainer.*``, ``tp.*``, ``dp.*``; the dry run
    from its candidate)."""

    precision: str = "fp32"
    """``trainer.precision``: bf16-mixed (and fp8) give autocast, or FSDP2's MixedPrecisionPolicy where FSDP2
    wraps; fp8 converts the eligible Linears first."""
    fp8: Float8Settings = field(default_factory=Float8Settings)
    """``trainer.fp8.*``, read when ``precision`` is fp8."""
    activation_checkpointing: str = "none"
    ac_every: int = 1
    compile: bool = False
    sequence_parallel: bool = False
    loss_parallel: bool = False
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each further dimension's own settings beside its size, by dimension (``cp.attention`` as
    ``options["cp"]["attention"]``: how attention runs on the split sequence), read by its technique module."""
    ddp: DDPSettings = field(default_factory=DDPSettings)
    measure_dp_comm: bool = True
    """Time the dp dimension's collectives (``dp.measure_comm``)."""
    measure_tp_comm: bool = True
    """Time the tp group's collectives (``tp.measure_comm``)."""


@dataclass(frozen=True)
class BatchSpec:
    """``data.global_batch_size``, ``data.seq_len`` and ``data.micro_batch_size`` (None: no accumulation)."""

    global_batch_size: int
    seq_len: int
    micro_batch_size: int | None = None

    def per_replica(self, dp: int) -> int:
        """Samples one data-parallel replica takes of each global batch."""
        return self.global_batch_size // max(1, dp)

    def accumulation_steps(self, dp: int) -> int:
        """Forward passes per step on one replica (``data.micro_batch_size`` chunks; 1 without it)."""
        mbs = self.micro_batch_size
        return self.per_replica(dp) // int(mbs) if mbs else 1


@dataclass(frozen=True)
class PipelineOptions:
    """``pp.split`` (the policy when no split points are given) and ``pp.trace_step`` (0: no timeline)."""

    split: str = "uniform"
    trace_step: int = 5


@dataclass(frozen=True)
class RunSpec:
    """Everything ``parallel/`` reads of a run: built once from the config by the trainer."""

    layout: ParallelLayout
    model: Any
    """The model's own config: its family's frozen dataclass (``models.spec.ModelSpec.typed``), or a read-only
    mapping for a model without a schema."""
    batch: BatchSpec
    compose: ComposeSettings = field(default_factory=ComposeSettings)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    dp_shard: bool = False
    """``dp.shard`` as asked (the layout's ``dp_shard`` also holds where tp or pp force FSDP2)."""
    seed: int = 0
    max_steps: int = 1
    memory_budget_bytes: float = float("inf")
    """What one rank may hold (``parallel.foundation.memory.rank_budget_bytes``): ``model.init_device=auto`` reads it."""
    objective: Any = None
    """A training objective that replaces the family's loss (``models.preference.PreferenceObjective``: dpo,
    simpo); None: the family's own."""

    @property
    def precision(self) -> str:
        return self.compose.precision

    @property
    def init_device(self) -> str:
        """``model.init_device`` (auto, cpu, meta)."""
        return str(self.model.get("init_device") or "auto")

    @property
    def weights_from_checkpoint(self) -> bool:
        """``model.init_from`` is set: the weights are read after the build, not drawn."""
        return bool(self.model.get("init_from"))
