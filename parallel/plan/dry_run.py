"""Build a layout's real program for a few ranks on one CPU, under torch's fake process group, and measure it.

The planner's numbers are formulas; a dry run checks them against the program the trainer would run. For a
sample of ranks (first and last rank of every pipeline stage, one in the middle of the mesh), in one process:

1. ``init_process_group("fake")`` with that rank and the full world size, then the (pp, dp, tp) DeviceMesh;
2. the model on the meta device (no memory), the rank's pipeline stages cut from it as the trainer cuts them
   (``parallel/pipeline``), the model's tensor-parallel plan, expert parallel (the experts sharded over ep), FSDP2
   ``fully_shard`` over dp for ZeRO-3 layouts (the experts over their own mesh);
3. parameter, gradient and AdamW state bytes read from the local shards (``DTensor.to_local``), the optimizer
   state created by a real ``AdamW.step`` on meta tensors;
4. the saved-activation bytes of one micro-batch: a tensor-parallel copy of each stage runs forward (and the
   loss on the last stage) under ``FakeTensorMode`` on fake CPU tensors, so attention takes the same kernel as
   a real run; every tensor autograd saves is counted once per storage, parameters excluded;
5. the schedule built over the rank's stages (``PipelineStage`` + torch's schedule class), so a schedule that
   refuses the stage count is reported with the rank and the fix.

No collective is sent (the fake group answers every call), nothing is allocated, no GPU is needed.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from parallel.assembly.compose import Composition, PipelinePlan, compose
from parallel.foundation import dims
from parallel.foundation.precision import PLANNER_PRECISIONS
from parallel.foundation.run import ComposeSettings
from parallel.foundation.state_bytes import held_state_bytes
from parallel.pipeline.stages import build_stage_module, model_stages
from parallel.plan.cost_model import Candidate, estimate
from parallel.plan.specs import HardwareSpec, ModelShape, Workload


@dataclass
class RankReport:
    rank: int
    coords: dict[str, int]
    stages: list[int]
    measured: dict[str, float] = field(default_factory=dict)
    """params, grads, optimizer, model_state (their sum), activations_per_micro_batch, reference (a frozen reference
    model's weights, ``Workload.reference_copy``): bytes on this rank."""
    estimated: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def ratio(self, key: str) -> float | None:
        est, got = self.estimated.get(key), self.measured.get(key)
        return got / est if est and got is not None else None


@dataclass
class DryRunReport:
    layout: dict[str, Any]
    world_size: int
    ranks: list[RankReport]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "world_size": self.world_size,
            "seconds": self.seconds,
            "ranks": [asdict(r) for r in self.ranks],
        }


def sample_ranks(**sizes: int) -> list[int]:
    """First and last rank of every pipeline stage, and one in the middle of the mesh, for degrees given by
    dimension name (``pp=8, dp=32, tp=4``; ranks as ``parallel/foundation/layout.py`` lays them out)."""
    c = Candidate(**sizes)
    others = [n for n in dims.mesh_names() if n != "pp"]
    ranks = {c.rank_of(**{n: c.size(n) // 2 for n in dims.mesh_names()})}
    for stage in range(c.pp):
        ranks.add(c.rank_of(pp=stage, **{n: 0 for n in others}))
        ranks.add(c.rank_of(pp=stage, **{n: c.size(n) - 1 for n in others}))
    return sorted(ranks)


def build_meta_model(model_config: Any, *, seq_len: int | None = None):
    """The configured model on the meta device, built by its family's builder (``ModelSpec.builder``) from
    ``ModelSpec.resized`` at its own sizes: a planner-only description (numbers, a ``_target_`` that refuses to
    build) is the model of its family it describes. With ``model.lora`` its adapters are added and the rest frozen."""
    import torch

    from models.lora import add_adapters
    from parallel.plan.calibrate import build_family, family_kwargs

    configured = int(model_config.get("max_seq_len") or 0)
    # a plan longer than the description's own sequence (llama3_8b at 128k): position tables that long
    longer = {"max_seq_len": seq_len} if seq_len and configured and seq_len > configured else {}
    family, kwargs = family_kwargs(model_config, longer)
    with torch.device("meta"):
        model = build_family(family, kwargs)
    add_adapters(model, model_config, seed=0, draw=False)  # as the trainer builds it (parallel/assembly/context.py)
    return model


def _fake_parameters(module, *, dtype) -> None:
    """Replace meta parameters and buffers by fake CPU ones (inside FakeTensorMode: nothing is allocated), DTensors
    kept."""
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor

    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is None:
                continue
            if isinstance(p, DTensor):
                local = torch.empty(p.to_local().shape, dtype=dtype, device="cpu")
                new = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False)
            else:
                new = torch.empty(p.shape, dtype=dtype, device="cpu")
            sub._parameters[name] = nn.Parameter(new, requires_grad=p.requires_grad)
        for name, b in list(sub._buffers.items()):  # a meta rotary table would meet cpu activations
            if b is not None and b.is_meta:
                sub._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cpu")


def _saved_activation_bytes(
    module, *, first: bool, last: bool, micro_batch: int, seq_len: int, d_model: int, vocab_size: int, dtype, loss
) -> int:
    """Bytes autograd saves for one micro-batch through ``module`` (fake tensors: nothing is allocated), and under
    activation checkpointing what its regions keep instead: their inputs and the selective policy's matmul outputs
    (``parallel/foundation/activations.py``: the trainer's meter counts the same)."""
    from types import SimpleNamespace

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    from parallel.foundation.activations import metering

    def local(t):
        return t._local_tensor if isinstance(t, DTensor) else t

    with FakeTensorMode(allow_non_fake_inputs=True):
        _fake_parameters(module, dtype=dtype)
        params = {local(p).untyped_storage()._cdata for p in module.parameters()}
        storages: dict[int, int] = {}

        def pack(t):
            st = local(t).untyped_storage()
            if st._cdata not in params:
                storages[st._cdata] = st.nbytes()
            return t

        def hold(t):  # a checkpointed region's input or a kept op output
            if isinstance(t, torch.Tensor):
                pack(t)

        if first:
            x = torch.randint(0, vocab_size, (micro_batch, seq_len))
        else:
            x = torch.randn(micro_batch, seq_len, d_model, dtype=dtype, requires_grad=True)
        with metering(SimpleNamespace(hold=hold)), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = module(x)
            if last:
                targets = torch.randint(0, vocab_size, (micro_batch, seq_len))
                loss(local(out), targets)
    return sum(storages.values())


def _clear_dtensor_caches() -> None:
    """DTensor caches sharding and redistribution decisions keyed by meshes that compare equal across process
    groups; a cached decision would carry the previous (destroyed) group into the next sampled rank."""
    import sys

    import torch
    from torch.distributed.tensor import DTensor

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ fast path's cache

    for name, module in list(sys.modules.items()):
        if not name.startswith(("torch.distributed.tensor", "torch.distributed._functional_collectives")):
            continue
        for fn in list(vars(module).values()):
            if not isinstance(fn, type) and callable(getattr(fn, "cache_clear", None)):
                fn.cache_clear()
        if hasattr(module, "clear_redistribute_planner_cache"):
            module.clear_redistribute_planner_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    for value in vars(propagator).values():
        cache = getattr(value, "cache", None)
        if callable(getattr(cache, "cache_clear", None)):
            cache.cache_clear()


class DryRunError(RuntimeError):
    """A layout that cannot be built: which step failed on which rank, torch's reason and the fix."""


def _fix_for(phase: str, c: Candidate, model: ModelShape) -> str:
    if phase == "tensor parallel":
        return f"use a tp.size dividing model.n_heads={model.n_heads} and model.d_model={model.d_model} (now {c.tp})"
    if phase == "schedule":
        return (
            f"pp.schedule={c.schedule} with {c.pp * c.stages_per_rank} stages and pp.micro_batches="
            f"{c.micro_batches}: choose a micro-batch count or pp.stages_per_rank the schedule accepts, or "
            "another schedule (python train.py ... prints the accepted counts)"
        )
    return f"this layout ({phase}) cannot be built with torch {__import__('torch').__version__}; choose another"


def _measure_rank(
    rank: int,
    *,
    world: int,
    c: Candidate,
    meta_model,
    specs,
    model: ModelShape,
    workload: Workload,
    settings: ComposeSettings,
    tp_plan,
    loss,
    units=None,
) -> dict[str, float]:
    """Build this rank's part of the layout under a fake process group of ``world`` ranks and measure it: the
    trainer's ``compose`` on the meta device (TP, FSDP2 for ZeRO-3, the pipeline stages and their schedule)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    phase = ["device mesh"]

    def on_step(step: str) -> None:
        phase[0] = step

    try:
        mesh = init_device_mesh("cpu", c.mesh_shape, mesh_dim_names=dims.mesh_names())
        local = [s for s in specs if s.pp_rank == c.coords(rank)["pp"]]
        build = dict(
            c=c, meta_model=meta_model, mesh=mesh, settings=settings, tp_plan=tp_plan, on_step=on_step, units=units
        )
        acts = sum(_stage_activation_bytes(spec, model=model, workload=workload, loss=loss, **build) for spec in local)
        measured = _state_bytes(_compose_rank(local, **build), workload=workload, model=model, on_step=on_step)
        measured["activations_per_micro_batch"] = float(acts)
        return measured
    except Exception as exc:  # noqa: BLE001 - every failure to build is reported with the rank and the fix
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DryRunError(f"{phase[0]} failed: {reason}; fix: {_fix_for(phase[0], c, model)}") from exc
    finally:
        dist.destroy_process_group()
        _clear_dtensor_caches()


def _zeros_like(p):
    """``torch.zeros_like(p)``; a DTensor's made from a zeroed local shard with its placements (no DTensor dispatch:
    the same tensor at a tenth of the cost on cold sharding caches)."""
    import torch
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return torch.zeros_like(p)
    local = torch.zeros_like(p.to_local())
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def _optimizer_with_state(parts, workload: Workload):
    """The run's optimizer over the rank's trainable parameters (LoRA: frozen weights get no gradient, no state)
    with its state created on meta tensors: AdamW's moments by a real step; ``optim=muon``'s momentum buffers for
    the blocks' matrices as its step creates them, and AdamW's moments for the rest.

    AdamW's step runs on each parameter's local shard (a DTensor's ``to_local``, as a parameter of its own): its
    moments are elementwise, each the shape of its parameter, so a shard's are the shard's moments the trainer's step
    creates on the DTensor, without a dozen DTensor dispatches per tensor on cold sharding caches (measured: the
    same bytes; the four Hugging Face dry runs of tests/system/test_hf_backend.py 1.1 -> 0.4 s CPU here)."""
    import torch
    from torch.distributed.tensor import DTensor

    named = [(n, p) for part in parts for n, p in part.module.named_parameters() if p.requires_grad]
    for _, p in named:
        p.grad = _zeros_like(p)
    if workload.optimizer == "muon":
        from parallel.optim.muon import Muon

        opt = Muon(named, muon_gather=workload.muon_gather, implementation="for-loop")
        opt.allocate_state()
        return opt
    shards = [torch.nn.Parameter(p.to_local() if isinstance(p, DTensor) else p.detach()) for _, p in named]
    for shard in shards:
        shard.grad = torch.zeros_like(shard)
    opt = torch.optim.AdamW(shards, lr=1e-4, foreach=False)
    opt.step()  # creates the moments, on meta tensors
    return opt


def _stage_activation_bytes(
    spec, *, c: Candidate, meta_model, mesh, settings: ComposeSettings, tp_plan, on_step, units, model, workload, loss
) -> int:
    """One stage's saved activations per micro-batch: a copy of the stage with tensor parallel and the further
    dimensions (cp, ep), run on fake tensors (FSDP2 leaves a micro-batch's activations alone; ep's experts are
    sharded over ep without it); each rank holds seq_len / cp tokens of every sample."""
    import torch

    on_step("activations")
    copy = compose(
        build_stage_module(meta_model, spec=spec, units=units),
        composition=Composition(tp=c.tp > 1, dims=Composition.used_dims(c)),
        settings=settings,
        mesh=mesh,
        sizes=c.sizes,
        device=torch.device("cpu"),
        parallelize=tp_plan,
        on_step=on_step,
    )
    on_step("activations")
    return _saved_activation_bytes(
        copy.module,
        first=spec.first,
        last=spec.last,
        micro_batch=workload.global_batch_size // (c.dp * c.micro_batches),
        seq_len=workload.seq_len // math.prod(c.size(d.name) for d in dims.DIMENSIONS if d.splits_sequence),
        d_model=model.d_model,
        vocab_size=model.vocab_size,
        dtype=torch.bfloat16 if settings.precision != "fp32" else torch.float32,
        loss=loss,
    )


def _compose_rank(local, *, c: Candidate, meta_model, mesh, settings: ComposeSettings, tp_plan, on_step, units):
    """The rank's whole layout as the trainer composes it: tp, cp, FSDP2 for ZeRO-3, ep, the pipeline stages."""
    import torch

    composition = Composition(
        tp=c.tp > 1,
        dp="fsdp" if c.zero_stage >= 3 and c.data_size > 1 else "none",
        dims=Composition.used_dims(c),
        pipeline=c.pp > 1,
    )
    return compose(
        # pipelined, compose cuts copies of the stages; else it wraps in place, so it gets a copy (the next sampled
        # rank starts from the same meta model)
        meta_model if c.pp > 1 else build_stage_module(meta_model, spec=local[0], units=units),
        composition=composition,
        settings=settings,
        mesh=mesh,
        sizes=c.sizes,
        device=torch.device("cpu"),
        parallelize=tp_plan,
        pipeline=PipelinePlan(
            stages=local,
            num_stages=c.pp * c.stages_per_rank,
            schedule=c.schedule,
            micro_batches=c.micro_batches,
            loss_fn=lambda out, tgt: out.sum(),
            group=mesh["pp"].get_group(),
            units=units,
        )
        if c.pp > 1
        else None,
        on_step=on_step,
    )


def _state_bytes(composed, *, workload: Workload, model: ModelShape, on_step) -> dict[str, float]:
    """Parameters, gradients and the run's optimizer state of the composed parts (on meta tensors), as the trainer
    holds them (``_optimizer_with_state``), and a frozen reference's copy of the weights as the trainer takes it
    (``frozen_copy``; none with LoRA: the base with the adapters off)."""
    on_step("optimizer")
    params = [p for part in composed.parts for p in part.module.parameters()]
    opt = _optimizer_with_state(composed.parts, workload)
    held = held_state_bytes(params, opt, reference_copy=workload.reference_copy and model.lora_rank == 0)
    return {k: float(v) for k, v in held.items()}


def dry_run(
    *,
    model_config: Any,
    candidate: Candidate,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    sequence_parallel: bool | None = None,
    ranks: list[int] | None = None,
) -> DryRunReport:
    """Build ``candidate`` for the sampled ``ranks`` under a fake process group; measured beside estimated bytes."""
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    c = candidate
    sp = c.sequence_parallel if sequence_parallel is None else sequence_parallel
    from parallel.plan.calibrate import family_kwargs

    family = family_kwargs(model_config, {})[0]
    meta_model = build_meta_model(model_config, seq_len=workload.seq_len)
    tp_plan = family.parallelize_fn() if c.tp > 1 else None
    num_stages = c.pp * c.stages_per_rank
    split_points, specs = model_stages(
        meta_model, family.pipeline, split_points=c.split_points, schedule=c.schedule, pp=c.pp, num_stages=num_stages
    )
    c = replace(c, split_points=split_points if c.pp > 1 else None, sequence_parallel=sp)
    est = estimate(c, model=model, hardware=hardware, workload=workload)
    world = c.world_size
    reports = []
    for rank in ranks if ranks is not None else sample_ranks(**c.sizes):
        coords = c.coords(rank)
        pp_i = coords["pp"]
        rep = RankReport(rank=rank, coords=coords, stages=[s.index for s in specs if s.pp_rank == pp_i])
        mem = est.rank_memory[pp_i]
        rep.estimated = {
            "params": mem.params,
            "grads": mem.grads,
            "optimizer": mem.optimizer,
            "model_state": mem.params + mem.grads + mem.optimizer,
            "reference": mem.reference,
            "activations_per_micro_batch": est.rank_activation_per_micro_batch[pp_i],
        }
        t1 = time.perf_counter()
        try:
            rep.measured = _measure_rank(
                rank,
                world=world,
                c=c,
                meta_model=meta_model,
                specs=specs,
                model=model,
                workload=workload,
                settings=ComposeSettings(
                    precision=PLANNER_PRECISIONS[workload.precision].trains_as,
                    sequence_parallel=sp,
                    activation_checkpointing=c.recompute,  # the planner's modes are the trainer's
                ),
                tp_plan=tp_plan,
                units=family.pipeline,
                loss=family.loss_fn(),
            )
        except DryRunError as exc:
            named = {k: v for k, v in coords.items() if not dims.dim(k).borrows or c.size(k) > 1}  # no ep=0 at ep=1
            rep.error = f"rank {rank} ({', '.join(f'{k}={v}' for k, v in named.items())}): {exc}"
        rep.seconds = time.perf_counter() - t1
        reports.append(rep)
    layout = {
        **c.sizes,
        "micro_batches": c.micro_batches,
        "schedule": c.schedule,
        "stages_per_rank": c.stages_per_rank,
        "zero_stage": c.zero_stage,
        "sequence_parallel": sp,
        "recompute": c.recompute,
        "split_points": list(split_points) if c.pp > 1 else None,
        "precision": workload.precision,
    }
    return DryRunReport(layout=layout, world_size=world, ranks=reports, seconds=time.perf_counter() - t0)
