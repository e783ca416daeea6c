"""The planner's door: typed objects in (the model's typed config, ``TopologyConfig``, ``PlannerConfig``, a
``RunSpec``), a ranking, a dry run or the run's warnings out. The trainer (``parallel=auto``, ``trainer.dry_run``,
the planner's warnings, the sweep report) and the command line (``parallel/plan/cli.py``, which reads the composed
config) call it; neither reads the other. No torch import (unless ``calibrate`` measures this machine, or a dry run
builds a layout)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parallel.config import PlannerConfig, TopologyConfig
from parallel.foundation.precision import planner_precision
from parallel.foundation.run import ComposeSettings, RunSpec
from parallel.plan.cost_model import MODELED_SCHEDULES, Candidate, estimate
from parallel.plan.search import TRAINER_AC, Plan, available_strategies, pitfalls, plan
from parallel.plan.specs import HardwareSpec, ModelShape, PlanError, Workload

#: the config groups the planner may choose among (a strategy needs its ``conf/parallel/NAME.yaml``)
CONF = Path(__file__).resolve().parents[2] / "conf"

#: what the planner reads of a run: the model's shape, the hardware and the workload
Inputs = tuple[ModelShape, HardwareSpec, Workload]


@dataclass(frozen=True)
class PlannerRequest:
    """What the planner reads of a run, typed (the trainer's ``trainer/typed/planner_request.py`` and the
    command line's ``specs_from_cfg`` make it): the model's typed config and its shape (``models.registry``
    ``planner_model``: None, with ``shape_problem``, for a model the planner cannot describe), the topology and planner
    sections, the batch, the sequence, the trainer's precision, the optim section's values (``optim=muon``'s keys;
    None: AdamW) and whether the run holds a frozen reference on its ranks."""

    model_config: Any
    model_shape: ModelShape | None
    topology: TopologyConfig
    planner: PlannerConfig
    global_batch_size: int
    seq_len: int
    trainer_precision: str | None
    optim: Mapping[str, Any] | None = None
    reference_copy: bool = False
    shape_problem: str | None = None


def planner_inputs(request: PlannerRequest, *, calibrate: bool | None = None) -> Inputs:
    """Model, hardware (measured when ``calibrate``, by default ``topology.calibrate``) and workload of a run. Raises
    ``PlanError`` for a model the planner cannot describe."""
    model_config, topology, model = request.model_config, request.topology, request.model_shape
    if model is None:
        raise PlanError(request.shape_problem or f"model={model_config.get('name', '?')}: no shape for the planner")
    hardware = HardwareSpec.from_topology(topology)

    def workload(hw: HardwareSpec) -> Workload:
        return Workload.of(
            request.planner,
            model=model_config,
            global_batch_size=request.global_batch_size,
            seq_len=request.seq_len,
            trainer_precision=request.trainer_precision,
            hardware=hw,
            optim=request.optim,
            reference_copy=request.reference_copy,
        )

    if calibrate if calibrate is not None else bool(topology.calibrate):
        from parallel.plan.calibrate import calibrate_hardware

        hardware = calibrate_hardware(
            hardware, model_config=model_config, workload=workload(hardware), threads=topology.threads_per_rank
        )
    return model, hardware, workload(hardware)


def choose_layout(request: PlannerRequest) -> tuple[Plan, dict[str, str]]:
    """``parallel=auto``: the ranking (the hardware measured when ``topology.calibrate``) among the strategies this
    checkout can train, and those strategies (name -> ``_target_``). Raises ``PlanError`` when no layout fits."""
    model, hardware, workload = planner_inputs(request)
    if hardware.world_size < 1:
        raise PlanError("topology describes no device")
    strategies = available_strategies(CONF)
    result = plan(model=model, hardware=hardware, workload=workload, allowed=strategies)
    _ = result.best  # raises PlanError naming the budget and the fix
    return result, strategies


def dry_run_for(run: RunSpec, request: PlannerRequest, *, ranks: list[int] | None) -> tuple[Any, list[str]]:
    """``trainer.dry_run=true``: the run's own layout built for ``ranks`` (None: a sample) under a fake process
    group, measured beside the planner's estimate (``parallel/plan/dry_run.py``), and the planner's warnings for that
    layout (``layout_warnings``). Raises ``PlanError`` for a model the planner cannot describe."""
    from parallel.plan.dry_run import dry_run, sample_ranks

    model, hardware, workload = planner_inputs(request, calibrate=False)
    report = dry_run(
        model_config=run.model,
        candidate=candidate_of(run),
        model=model,
        hardware=hardware,
        workload=workload,
        ranks=ranks if ranks is not None else sample_ranks(**run.layout.sizes),
    )
    return report, layout_warnings(run, request)


def predicted_step_time(run: RunSpec, request: PlannerRequest) -> float:
    """The cost model's step time for the layout this run uses (the sweep report's prediction column). Raises
    ``PlanError`` for a model the planner cannot describe."""
    model, hardware, workload = planner_inputs(request, calibrate=False)
    return estimate(candidate_of(run), model=model, hardware=hardware, workload=workload).step_time_s


def layout_warnings(run: RunSpec, request: PlannerRequest) -> list[str]:
    """The seed's pitfalls for the layout this run uses (``pitfalls``, in the precision it trains in; a schedule
    the cost model does not model, e.g. dualpipev, estimated as 1F1B); none for a model the planner cannot
    describe."""
    try:
        model, hardware, workload = planner_inputs(request, calibrate=False)
    except PlanError:
        return []
    workload = replace(workload, precision=planner_precision(run.precision))  # what this run trains in
    c = candidate_of(run)
    if c.pp > 1 and c.schedule not in MODELED_SCHEDULES:
        c = replace(c, schedule="1f1b")
    hardware = replace(hardware, nnodes=run.layout.nnodes)
    est = estimate(c, model=model, hardware=hardware, workload=workload)
    return pitfalls(c, est, model=model, hardware=hardware, workload=workload)


# ---- from the typed run ----------------------------------------------------------------------


def candidate_of(run: RunSpec) -> Candidate:
    """The layout a run asks for (its typed ``RunSpec``), in the cost model's terms."""
    layout = run.layout
    if layout.schedule is not None:
        m, schedule = layout.micro_batches, layout.schedule
    else:
        m, schedule = run.batch.accumulation_steps(layout.dp), "none"
    return Candidate(
        sizes=layout.sizes,
        micro_batches=max(1, m),
        schedule=schedule if layout.pp > 1 else "none",
        stages_per_rank=layout.stages_per_rank,
        zero_stage=3 if layout.dp_shard else 0,
        sequence_parallel=run.compose.sequence_parallel,
        split_points=layout.split_points,
        recompute=recompute_of(run.compose),
    )


def recompute_of(settings: ComposeSettings) -> str:
    """The planner's name for the run's trainer.activation_checkpointing (every k-th block counts as none)."""
    mode = settings.activation_checkpointing
    if mode == "selective" and settings.ac_every > 1:
        return "none"
    return mode if mode in TRAINER_AC else "none"
