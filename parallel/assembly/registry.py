"""Every built-in ``parallel=NAME``, once: its class, the mesh dimensions it uses, how it pipelines.

The config schema (the default ``parallel._target_`` comes from here through the ``mt_strategy``
resolver, keyed by ``parallel.name``), validation, the layout, the planner and ``parallel=auto`` all read
``STRATEGIES``; none of them repeats a strategy's name, class or dimensions. Adding a strategy is one
module under ``parallel/strategies/``, one ``conf/parallel/NAME.yaml`` (which sets ``parallel.name`` and
the default sizes) and one ``StrategySpec`` below. A user's own ``Strategy`` subclass needs no entry: it
sets ``parallel._target_`` and a ``parallel.name`` not listed here, and validation leaves its dimensions
to it. No torch import: validation and the planner read this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallel.assembly.strategy_checks import (
    dimension_problems,
    tensor_parallel_problems,
)
from parallel.foundation import dims
from parallel.foundation.checkpointing_modes import AC_MODES
from parallel.pipeline.checks import fixed_pipeline_problems, pipeline_problems

#: the mesh dimension names in written order, as the table (``parallel/foundation/dims.py``) stood at import
DIMS = dims.names()

#: what the trainer can build of the planner's options: FSDP2 (ZeRO-3) or no sharding, and every recomputation
TRAINABLE_ZERO_STAGES = (0, 3)
TRAINABLE_RECOMPUTE = AC_MODES


@dataclass(frozen=True)
class LayoutShape:
    """What the planner decides that picks a strategy: the dimensions > 1 and how they are used."""

    used: tuple[str, ...]
    """Mesh dimensions of size > 1, in ``dims.names()`` order."""
    zero_stage: int = 0
    micro_batches: int | None = None
    """None when not decided (a layout described by its sizes alone)."""
    schedule: str | None = None


@dataclass(frozen=True)
class FixedPipeline:
    """A pipeline whose shape is part of the strategy, not of the config: ``parallel=mp`` is pipeline parallel
    with one micro-batch and GPipe (no overlap: the stages run strictly in turn), one stage per rank, the blocks
    split evenly with no weight for the embedding or head, and its explicit split points under its own key."""

    micro_batches: int = 1
    schedule: str = "gpipe"
    stages_per_rank: int = 1
    split_points_key: str = "mp.split_points"

    def picks(self, shape: LayoutShape) -> bool:
        """The planner's layouts that are this pipeline: pp alone, with its micro-batches and schedule."""
        return shape.used == ("pp",) and shape.micro_batches == self.micro_batches and shape.schedule == self.schedule

    def problems(self, *, name: str, micro_batches: int, schedule: str | None, stages_per_rank: int) -> list[str]:
        """What a config changes that this pipeline fixes, as "key=value: what is wrong; the fix"."""
        out = []
        if micro_batches != self.micro_batches:
            out.append(
                f"pp.micro_batches={micro_batches} with parallel={name}: model parallel runs one micro-batch through "
                f"the stages in turn; use parallel=pp to pipeline micro-batches, or set "
                f"pp.micro_batches={self.micro_batches}"
            )
        if schedule != self.schedule or stages_per_rank != self.stages_per_rank:
            out.append(
                f"pp.schedule={schedule} pp.stages_per_rank={stages_per_rank} with parallel={name}: model parallel "
                f"runs stages in order ({self.schedule}, one stage per rank); use parallel=pp for other schedules"
            )
        return out


#: parallel=mp's pipeline, said once
MODEL_PARALLEL = FixedPipeline()


@dataclass(frozen=True)
class StrategySpec:
    name: str
    target: str
    """Dotted path of the ``Strategy`` class Hydra instantiates from the ``parallel`` node."""
    dims: tuple[str, ...]
    """Mesh dimensions that may be > 1 (the others must be 1)."""
    summary: str
    pipeline: str = "never"
    """always (the pipeline engine even with pp.size=1), with_pp (only when pp.size > 1) or never."""
    fixed_pipeline: FixedPipeline | None = None
    """The pipeline's shape when the strategy fixes it (``parallel=mp``); None: ``pp.*`` decides."""
    shards_dp: bool = False
    """The dp dimension is always FSDP2 (``dp.shard`` is implied)."""
    single_process: bool = False
    """One process drives every local device (``torch.nn.DataParallel``)."""
    resolved_before_launch: bool = False
    """A placeholder the planner replaces before validation (``parallel=auto``)."""
    foreign_dim_hint: str | None = None
    """What to say when a dimension outside ``dims`` is > 1 (default: parallel=hybrid with the run's degrees, where that
    validates, or the dimension at 1: trainer/validate.py ``combine_dimensions``)."""
    picked_for: Callable[[LayoutShape], bool] | None = None
    """The layouts the planner (and the "layouts that fit" hint) trains with this strategy; None: never
    picked. ``STRATEGIES`` is searched in order, the first match wins."""
    # ---- what validation asks of the strategy ----
    checks: tuple[Callable[[Any, StrategySpec | None], list[str]], ...] = ()
    """``fn(run, strategy) -> problems`` (``run``: the typed ``RunSpec``): the strategy's own rules, run by ``trainer/validate.py`` before any worker
    starts (torch-free functions beside the strategy's facts: ``parallel/pipeline/checks.py``,
    ``parallel/assembly/strategy_checks.py``)."""

    @property
    def split_points_key(self) -> str:
        return self.fixed_pipeline.split_points_key if self.fixed_pipeline is not None else "pp.split_points"

    def pipelined(self, pp: int) -> bool:
        """Whether a run with ``pp.size=pp`` drives the pipeline engine (schedule, micro-batches)."""
        return pp > 1 or self.pipeline == "always"


def _only(*dims: str, **when: object) -> Callable[[LayoutShape], bool]:
    """Picked when exactly ``dims`` are > 1 and every ``when`` field of the shape has that value."""

    def picks(shape: LayoutShape) -> bool:
        return shape.used == dims and all(getattr(shape, k) == v for k, v in when.items())

    return picks


def _combined(shape: LayoutShape) -> bool:
    """Several dimensions > 1, or one that no single-dimension strategy lists (a dimension added to
    ``parallel/foundation/dims.py`` is hybrid's until a strategy of its own is registered)."""
    if len(shape.used) != 1:
        return len(shape.used) > 1
    return not any(s.dims == shape.used for s in STRATEGIES.values())


STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec(
            "single",
            "parallel.strategies.single.SingleStrategy",
            (),
            "one process, no communication: the numerical reference",
            picked_for=_only(),
        ),
        StrategySpec(
            "dp",
            "parallel.strategies.dp.DataParallelStrategy",
            (),
            "legacy single-process torch.nn.DataParallel over the local CUDA devices",
            single_process=True,
            foreign_dim_hint="parallel=dp is one process driving all local GPUs; use parallel=ddp for dp.size > 1",
        ),
        StrategySpec(
            "ddp",
            "parallel.strategies.ddp.DDPStrategy",
            ("dp",),
            "DistributedDataParallel: one replica per process, gradients all-reduced in buckets",
            picked_for=_only("dp", zero_stage=0),
        ),
        StrategySpec(
            "fsdp",
            "parallel.strategies.fsdp.FSDPStrategy",
            ("dp",),
            "FSDP2 fully_shard: parameters, gradients and optimizer state sharded over dp",
            shards_dp=True,
            picked_for=_only("dp", zero_stage=3),
        ),
        StrategySpec(
            "mp",
            "parallel.strategies.pp.PipelineStrategy",
            ("pp",),
            "layer-split model parallel: stages run strictly in turn, one micro-batch",
            pipeline="always",
            fixed_pipeline=MODEL_PARALLEL,
            picked_for=MODEL_PARALLEL.picks,
            checks=(fixed_pipeline_problems, pipeline_problems),
        ),
        StrategySpec(
            "tp",
            "parallel.strategies.tp.TPStrategy",
            ("tp",),
            "tensor parallel (DTensor): projections split column-/row-wise over tp ranks",
            picked_for=_only("tp"),
            checks=(tensor_parallel_problems,),
        ),
        StrategySpec(
            "pp",
            "parallel.strategies.pp.PipelineStrategy",
            ("pp",),
            "pipeline parallel: micro-batches flow through the stages under pp.schedule",
            pipeline="always",
            picked_for=_only("pp"),
            checks=(pipeline_problems,),
        ),
        StrategySpec(
            "hybrid",
            "parallel.strategies.hybrid.HybridStrategy",
            DIMS,
            "pp x dp x cp x tp on one DeviceMesh, ep borrowed from dp (x cp)",
            pipeline="with_pp",
            picked_for=_combined,
            checks=(pipeline_problems, tensor_parallel_problems, dimension_problems),
        ),
        StrategySpec(
            "auto",
            "parallel.plan.search.unresolved_auto",
            DIMS,
            "the planner's first choice, chosen before validation",
            resolved_before_launch=True,
        ),
    )
}


def strategy_spec(name: str) -> StrategySpec | None:
    """The built-in strategy called ``name``; None for a user's own."""
    return STRATEGIES.get(str(name))


def strategy_target(name: str) -> str:
    """``parallel._target_`` of a built-in strategy (the ``mt_strategy`` resolver).

    An unknown name resolves to an empty target: validation then says which names exist (a user's own
    strategy sets ``parallel._target_`` itself).
    """
    spec = STRATEGIES.get(str(name))
    return spec.target if spec is not None else ""


def strategy_for(
    *, zero_stage: int = 0, micro_batches: int | None = None, schedule: str | None = None, **sizes: int
) -> str:
    """The ``parallel=`` option that trains this layout, given its degrees by dimension name (``dp=4`` alone
    means ddp, and so on; a dimension not given is 1)."""
    used = tuple(d for d, size in dims.full_sizes(sizes).items() if size > 1)
    shape = LayoutShape(used=used, zero_stage=zero_stage, micro_batches=micro_batches, schedule=schedule)
    for spec in STRATEGIES.values():
        if spec.picked_for is not None and spec.picked_for(shape):
            return spec.name
    raise ValueError(f"no strategy trains {shape}")  # pragma: no cover - hybrid takes every multi-dim layout


def describe_factorization(*sizes: int) -> str:
    """The command-line words for a layout given its degrees in ``dims.names()`` order: ``parallel=ddp
    dp.size=4`` (the registry names the strategy)."""
    by_name = dict(zip(dims.names(), sizes, strict=True))
    words = [f"{dims.dim(k).key}={v}" for k, v in by_name.items() if v > 1]
    return " ".join([f"parallel={strategy_for(**by_name)}", *words])


def checks_for(name: str) -> tuple[Callable[[Any, StrategySpec | None], list[str]], ...]:
    """The checks validation runs for ``parallel.name``: the strategy's own; for a user's own strategy every
    built-in one (each says nothing where its dimension is unused)."""
    spec = STRATEGIES.get(str(name))
    if spec is not None:
        return spec.checks
    return tuple(dict.fromkeys(c for s in STRATEGIES.values() for c in s.checks))


def plannable() -> list[StrategySpec]:
    """Strategies the planner may choose."""
    return [s for s in STRATEGIES.values() if s.picked_for is not None]
