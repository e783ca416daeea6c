"""The one order in which a model is wrapped, for training and for the planner's dry run alike: ``compose``.

Read top to bottom: (float8 Linears) → tensor parallel → context parallel → expert parallel → activation
checkpointing → compile → (bf16 autocast unless FSDP2 casts) → FSDP2 or DDP, placed on the rank's device →
pipeline stages and their schedule. torchtitan's order (its float8 converter runs as the model is built). A
pipelined composition cuts this rank's stages from the model first and wraps each in that order before it
becomes a ``PipelineStage``. Each step is one module of
``parallel/techniques/`` (or ``parallel/pipeline/``); this module only orders them.

A named strategy (``parallel=single|ddp|fsdp|tp|pp|mp|hybrid``) is a preset: a ``Composition`` chosen from its name
and the layout's degrees; ``parallel/assembly/build.py`` turns it into the rank's engine. The dry run
(``parallel/plan/dry_run.py``) calls ``compose`` on the meta device under a fake process group.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from models.moe import moe_layers, uncounted
from models.mtp import mtp_modules, mtp_uncounted
from models.spec import PipelineUnits
from parallel.foundation import dims
from parallel.foundation.intervals import Meter, StepCommMeter
from parallel.foundation.meshes import fsdp_mesh, loss_mesh, sequence_mesh
from parallel.foundation.precision import MIXED_PRECISIONS, enable_autocast, fsdp_mp_policy
from parallel.foundation.run import ComposeSettings
from parallel.foundation.ties import tied_parameters
from parallel.pipeline.schedules import schedule_class, schedule_spec
from parallel.pipeline.stages import StageSpec, build_stage_module
from parallel.pipeline.tied import share_across_stages
from parallel.techniques.checkpointing import apply_activation_checkpointing
from parallel.techniques.compile import apply_compile
from parallel.techniques.ddp import wrap_ddp
from parallel.techniques.fp8 import convert_to_fp8, float8_tp_styles, precompute_scales
from parallel.techniques.fsdp import FSDPCommTimer, apply_fsdp, float8_bytes_all_gather, fsdp_no_sync
from parallel.techniques.moe_balance import bias_balancing, scope_balance
from parallel.techniques.tp import apply_tp, tp_meter

#: how the dp dimension wraps a module: not at all, DistributedDataParallel, or FSDP2 ``fully_shard``
DP_WRAPS = ("none", "ddp", "fsdp")


@dataclass(frozen=True)
class Composition:
    """Which wrappers a strategy applies (``compose`` fixes their order) and how its engine runs them."""

    tp: bool = False
    """Apply the model family's tensor-parallel plan over the tp sub-mesh."""
    dp: str = "none"
    """How the data dimensions (dp x cp) wrap the module: one of ``DP_WRAPS``."""
    dims: tuple[str, ...] = ()
    """The further dimensions applied after tensor parallel, in the table's order, each by its technique module
    (``MeshDim.technique``): cp splits each sample's sequence (attention by all-to-all), ep shards the MoE blocks'
    experts over its borrowed mesh and routes tokens by all-to-all (the experts on their own FSDP2 mesh)."""
    pipeline: bool = False
    """Split the model into stages driven by ``pp.schedule``; each stage is composed on its own."""
    rank_map: bool = False
    """Gather, log and draw which rank holds which layers (``summary.json``'s ``rank_map``, ``rank_map.png``)."""

    def __post_init__(self) -> None:
        if self.dp not in DP_WRAPS:
            raise ValueError(f"Composition(dp={self.dp!r}): use one of {DP_WRAPS}")
        for name in self.dims:
            row = dims.dim(name)
            if not row.technique:
                raise ValueError(f"Composition(dims={self.dims}): {name} has no technique module (MeshDim.technique)")
            if row.needs_fsdp and self.dp == "ddp":  # DDP would all-reduce what it shards differently on each rank
                raise ValueError(f"Composition({name}=True, dp={self.dp!r}): {row.title} shards with FSDP2 (dp='fsdp')")

    @classmethod
    def from_degrees(cls, layout: Any, *, rank_map: bool = True) -> Composition:
        """Every dimension the layout uses (``parallel=hybrid``): a new mesh dimension's wrapper is chosen
        here, from its degree, beside the others."""
        return cls(
            tp=layout.tp > 1,
            dp=cls.dp_wrap(layout),
            dims=cls.used_dims(layout),
            pipeline=layout.pp > 1,
            rank_map=rank_map,
        )

    @staticmethod
    def used_dims(sized: Any) -> tuple[str, ...]:
        """The further dimensions (those with a technique module) a layout or candidate uses: size > 1."""
        return tuple(d.name for d in dims.DIMENSIONS if d.technique and sized.size(d.name) > 1)

    def splits_sequence(self) -> bool:
        """Whether one of its dimensions splits each sample's sequence (``MeshDim.splits_sequence``: cp)."""
        return any(dims.dim(n).splits_sequence for n in self.dims)

    @staticmethod
    def dp_wrap(layout: Any) -> str:
        """What the layout's data dimensions (dp x cp: the ranks that see different tokens) ask for: nothing when
        both are 1, FSDP2 where the layout shards dp (``dp.shard``, or forced by tp/pp > 1:
        ``parallel/foundation/layout.py``), DDP otherwise; either over ``meshes.fsdp_mesh`` / ``loss_mesh``."""
        if layout.data_size == 1:
            return "none"
        return "fsdp" if layout.dp_shard else "ddp"


@dataclass(frozen=True)
class PipelinePlan:
    """The stages this rank runs and how their schedule drives them (the split is chosen before ``compose``)."""

    stages: Sequence[StageSpec]
    """This rank's stages, in index order."""
    num_stages: int
    schedule: str
    micro_batches: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """The loss the schedule computes after the last stage (the step's token mean: ``parallel/foundation/token_loss.py``)."""
    group: Any
    """The pp process group."""
    units: PipelineUnits | None = None
    instrument: Callable[[Any, StageSpec], None] | None = None
    """Called with each ``PipelineStage`` as it is made (the engine's action timers)."""


@dataclass
class ComposedPart:
    """A wrapped module (the whole model, or one pipeline stage) and what its engine drives it with."""

    module: nn.Module
    no_sync: Callable[[], AbstractContextManager] | None = None
    """Context factory that skips the dp gradient reduction (all but the last accumulated chunk)."""
    dp_timer: StepCommMeter | None = None
    """The dp dimension's measured collectives: DDP's bucket all-reduces (its reducer's timer, on logged steps)
    or FSDP2's all-gathers and reduce-scatters (every step; ``count_key`` names the metric)."""
    after_update: Callable[[], None] | None = None
    """Run after each optimizer step (fp8 with FSDP2's float8 all-gather: the weights' scales for the next one)."""


@dataclass
class Composed:
    """What ``compose`` made: one part (no pipeline) or one per local stage, with the stages and their schedule."""

    parts: list[ComposedPart]
    stages: list[Any] = field(default_factory=list)
    """``PipelineStage`` per part when pipelined."""
    schedule: Any = None
    meters: list[Meter] = field(default_factory=list)
    """The techniques' meters over every part (``Engine.meters``): the tp group's collectives, the cp and ep
    all-to-alls."""
    sample_shares: list[Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=list)
    """What this rank keeps of each sample (``Engine.sample_shares``): cp's sequence chunk."""

    @property
    def module(self) -> nn.Module:
        return self.parts[0].module

    @property
    def after_update(self) -> list[Callable[[], None]]:
        """The parts' hooks for after each optimizer step (``Engine.after_update``)."""
        return [p.after_update for p in self.parts if p.after_update is not None]


def compose(
    model: nn.Module,
    *,
    composition: Composition,
    settings: ComposeSettings,
    mesh: Any,
    sizes: Mapping[str, int],
    device: torch.device,
    parallelize: Callable[..., nn.Module] | None = None,
    place: Callable[[nn.Module], nn.Module] = lambda m: m,
    pipeline: PipelinePlan | None = None,
    on_step: Callable[[str], None] = lambda step: None,
) -> Composed:
    """Wrap ``model`` (possibly built on the meta device) in the fixed order over ``mesh``, the world mesh whose
    degrees are ``sizes`` (the layout's: FSDP's and the gradient-reduction meshes derive from them). ``parallelize``: the family's TP plan;
    ``place``: gives a module storage on this rank's device (after sharding, before DDP); ``pipeline``: this rank's
    stages, required when ``composition.pipeline``; ``on_step`` hears each step's name before it runs (the dry run
    names the failing one)."""
    ties = tied_parameters(model)  # before the stages are cut: a stage holds one end of a tie at most
    if composition.pipeline:
        if pipeline is None:
            raise ValueError("compose(composition.pipeline=True) needs a PipelinePlan")
        modules = [build_stage_module(model, spec=s, units=pipeline.units) for s in pipeline.stages]
    else:
        modules = [model]
    # FSDP2 blocks gather again for backward, except under a split backward (ScheduleSpec.splits_backward)
    reshard = not (composition.pipeline and schedule_spec(pipeline.schedule).splits_backward)
    # each further dimension's technique, over every part (its timers and meter shared by them)
    techniques = [
        importlib.import_module(dims.dim(n).technique).technique(mesh=mesh, sizes=sizes, settings=settings)
        for n in composition.dims
    ]
    parts = [
        _wrap(m, composition=composition, settings=settings, mesh=mesh, sizes=sizes, device=device, parallelize=parallelize,
              place=place, on_step=on_step, reshard_after_forward=reshard, techniques=techniques)
        for m in modules
    ]  # fmt: skip
    balance_group = loss_mesh(mesh, sizes).get_group() if composition.dp != "none" else None
    for part in parts:
        part.after_update = _chain(part.after_update, bias_balancing(part.module, group=balance_group))
    composed = Composed(parts, meters=_meters(composition, settings, mesh, sizes, techniques))
    composed.sample_shares += [share for t in techniques if (share := t.sample_share()) is not None]
    if not composition.pipeline:
        return composed
    if composition.dp == "none":  # a V schedule's first and last stage on this rank share one tied Parameter
        share_across_stages([p.module for p in parts], ties)
    on_step("schedule")
    composed.stages, composed.schedule = _pipeline_stages(parts, plan=pipeline, device=device)
    return composed


def _meters(
    composition: Composition,
    settings: ComposeSettings,
    mesh: Any,
    sizes: Mapping[str, int],
    techniques: list[Any],
) -> list[Meter]:
    """Each composed technique's meter: the tp group's collectives, then each further dimension's (cp's and ep's
    all-to-alls over every part)."""
    meters: list[Meter] = []
    if composition.tp:
        tp_mesh = mesh["tp"] if sizes.get("tp", 1) > 1 else None
        meters.append(tp_meter(tp_mesh=tp_mesh, measure=settings.measure_tp_comm, compiled=settings.compile))
    return meters + [meter for t in techniques if (meter := t.meter()) is not None]


def compose_on_rank(
    ctx: Any, model: nn.Module, *, composition: Composition, pipeline: PipelinePlan | None = None
) -> Composed:
    """``compose`` on this rank (``ctx``: its ``WorkerContext``): its run's settings, its mesh and degrees, its
    device, the family's TP plan and ``ctx.place`` for storage (a meta-built module is materialised holding what
    this rank keeps)."""
    return compose(
        model,
        composition=composition,
        settings=ctx.compose_settings(),
        mesh=ctx.mesh,
        sizes=ctx.layout.sizes,
        device=ctx.device,
        parallelize=ctx.model_spec.parallelize_fn() if composition.tp else None,
        place=ctx.place,
        pipeline=pipeline,
    )


def _chain(*hooks: Callable[[], None] | None) -> Callable[[], None] | None:
    """One after-step hook running ``hooks`` in order (None: there is none)."""
    present = [h for h in hooks if h is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def run() -> None:
        for hook in present:
            hook()

    return run


def _wrap(
    module: nn.Module,
    *,
    composition: Composition,
    settings: ComposeSettings,
    mesh: Any,
    sizes: Mapping[str, int],
    device: torch.device,
    parallelize: Callable[..., nn.Module] | None,
    place: Callable[[nn.Module], nn.Module],
    on_step: Callable[[str], None],
    reshard_after_forward: bool = True,
    techniques: Sequence[Any] = (),
) -> ComposedPart:
    """One module through float8 → TP → CP → EP → AC → compile → autocast → FSDP2/DDP, placed on the device."""
    fsdp = composition.dp == "fsdp"
    own = _split_model(
        module, composition=composition, settings=settings, mesh=mesh, sizes=sizes, device=device,
        parallelize=parallelize, on_step=on_step, techniques=techniques,
    )  # fmt: skip
    on_step("activation checkpointing and compile")
    apply_activation_checkpointing(
        module, mode=settings.activation_checkpointing, every=settings.ac_every, for_compile=settings.compile
    )
    if settings.compile:
        apply_compile(module)
    if settings.precision in MIXED_PRECISIONS and not fsdp:  # FSDP2 casts with its MixedPrecisionPolicy instead
        enable_autocast(module, device_type=device.type)
    if composition.dp == "none":
        return ComposedPart(place(module))
    if fsdp:
        return _shard(
            module, settings=settings, mesh=mesh, sizes=sizes, place=place, on_step=on_step, own=own,
            reshard_after_forward=reshard_after_forward,
        )  # fmt: skip
    on_step("DDP")
    ddp, meter = wrap_ddp(
        place(module),
        dp_mesh=loss_mesh(mesh, sizes),
        device=device,
        bucket_cap_mb=settings.ddp.bucket_cap_mb,
        find_unused_parameters=settings.ddp.find_unused_parameters,
        sync_batchnorm=settings.ddp.sync_batchnorm,
        measure_comm=settings.measure_dp_comm,
    )
    return ComposedPart(ddp, no_sync=ddp.no_sync, dp_timer=meter)


def _split_model(
    module: nn.Module,
    *,
    composition: Composition,
    settings: ComposeSettings,
    mesh: Any,
    sizes: Mapping[str, int],
    device: torch.device,
    parallelize: Callable[..., nn.Module] | None,
    on_step: Callable[[str], None],
    techniques: Sequence[Any],
) -> list[tuple[nn.Module, Any]]:
    """float8 Linears, then tensor parallel (the family's plan) and each further dimension's technique in the table's
    order (cp: attention by all-to-all; ep: the experts sharded, tokens routed by all-to-all); a MoE's balance
    statistics scoped to the ranks that see different tokens (``scope_balance``). Returns the units a technique
    shards on a mesh of their own (ep's experts), for FSDP2 to wrap first."""
    fp8 = settings.precision == "fp8"
    if fp8:
        on_step("float8")
        convert_to_fp8(
            module,
            settings=settings.fp8,
            emulate=device.type != "cuda",
            fsdp_float8_all_gather=fp8 and settings.fp8.all_gather_in_float8(fsdp=composition.dp == "fsdp"),
            tp=sizes.get("tp", 1) if composition.tp else 1,
        )
    if composition.tp:
        on_step("tensor parallel")
        if parallelize is None:
            raise ValueError("compose(composition.tp=True) needs the model family's parallelize function")
        apply_tp(
            module,
            parallelize=parallelize,
            tp_mesh=mesh["tp"],
            sequence_parallel=settings.sequence_parallel,
            loss_parallel=settings.loss_parallel,
            styles=float8_tp_styles(sequence_parallel=settings.sequence_parallel, device_type=device.type)
            if fp8 and settings.fp8.recipe == "tensorwise"
            else None,
        )
    own: list[tuple[nn.Module, Any]] = []
    for technique in techniques:
        on_step(technique.step)
        own += technique.apply(module)
    sequence = sequence_mesh(mesh, sizes) if composition.splits_sequence() else None
    scope_balance(
        module,
        data_group=loss_mesh(mesh, sizes).get_group() if composition.dp != "none" else None,
        sequence_group=sequence.get_group() if sequence is not None else None,
    )
    return own


def _shard(
    module: nn.Module,
    *,
    settings: ComposeSettings,
    mesh: Any,
    sizes: Mapping[str, int],
    place: Callable[[nn.Module], nn.Module],
    on_step: Callable[[str], None],
    own: list[tuple[nn.Module, Any]],
    reshard_after_forward: bool,
) -> ComposedPart:
    """FSDP2 over dp x cp (first the units a technique keeps on their own mesh: ep's experts), placed, its
    collectives timed.

    Resharded blocks hold their sharded parameters between forward and backward: torch's split backward takes the
    weights to differentiate from the stage module when its input backward (I) starts, and got those instead of the
    gathered ones in the graph (no block weight gradients: zbv under dp 2 had gradient norm 8.63 against single's
    11.90 at step 1)."""
    on_step("FSDP2 sharding")
    float8_gather = settings.precision == "fp8" and settings.fp8.all_gather_in_float8(fsdp=True)
    mp_policy = fsdp_mp_policy(settings.precision)
    for unit, unit_mesh in own:  # first, so the blocks' units leave them to their own mesh
        apply_fsdp(unit, dp_mesh=unit_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    apply_fsdp(module, dp_mesh=fsdp_mesh(mesh, sizes), reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    module = place(module)  # storage for this rank's shards only, then their init
    timer = FSDPCommTimer().attach(module) if settings.measure_dp_comm else None
    if float8_gather and timer is None:
        float8_bytes_all_gather(module)
    after = precompute_scales(module) if float8_gather else None
    return ComposedPart(module, no_sync=fsdp_no_sync(module), dp_timer=timer, after_update=after)


def _shape_inference_uncounted(stage: PipelineStage, module: nn.Module) -> None:
    """torch 2.13's ``PipelineStage`` infers its shapes at the first step with a real forward of the stage (the first
    micro-batch on the first stage, empty tensors on the others) and, on the last stage, the loss over that output: a
    MoE block would count its routing in the step's balance and in the bias balancing's counts (1.1e-4 off single's
    loss at step 2, dp2 x pp2), the MTP modules (run by the loss) their loss over uninitialised memory (NaN). Their
    counters are kept out of both."""
    if not (moe_layers(module) or mtp_modules([module])):
        return
    for name in ("_forward_metadata_inference", "_backward_metadata_inference"):
        infer = getattr(stage, name, None)
        if infer is not None:
            setattr(stage, name, _uncounted_call(infer, module))


def _uncounted_call(infer: Callable[..., Any], module: nn.Module) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with uncounted(module), mtp_uncounted(module):
            return infer(*args, **kwargs)

    return call


def _pipeline_stages(parts: list[ComposedPart], *, plan: PipelinePlan, device: torch.device) -> tuple[list, Any]:
    """Each composed stage a ``PipelineStage``, then torch's schedule class for ``plan.schedule`` over them
    (``scale_grads=False``: the loss says how gradients are scaled)."""
    stages = []
    for part, spec in zip(parts, plan.stages, strict=True):
        stage = PipelineStage(part.module, spec.index, plan.num_stages, device, group=plan.group)
        _shape_inference_uncounted(stage, part.module)
        if plan.instrument is not None:
            plan.instrument(stage, spec)
        stages.append(stage)
    single = schedule_spec(plan.schedule).placement == "single"
    cls = schedule_class(plan.schedule)
    schedule = cls(
        stages[0] if single else stages, n_microbatches=plan.micro_batches, loss_fn=plan.loss_fn, scale_grads=False
    )
    return stages, schedule
