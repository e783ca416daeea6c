"""The planner's door: typed objects in (the model's typed config, ``TopologyConfig``, ``PlannerConfig``, a
``RunSpec``), a ranking, a dry run or the run's warnings out. The trainer (``parallel=auto``, ``trainer.dry_run``,
the planner's warnings, the sweep report) and the command line (``parallel/plan/cli.py``, which reads the composed
config) call it; neither reads the other. No torch import (unless ``calibrate`` measures this machine, or a dry run
builds a layout)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models.registry import model_shape
from parallel.config import PlannerConfig, TopologyConfig
from parallel.foundation.run import RunSpec
from parallel.plan.search import Plan, available_strategies, candidate_of, plan, run_warnings
from parallel.plan.specs import HardwareSpec, ModelShape, PlanError, Workload

#: the config groups the planner may choose among (a strategy needs its ``conf/parallel/NAME.yaml``)
CONF = Path(__file__).resolve().parents[2] / "conf"

#: what the planner reads of a run: the model's shape, the hardware and the workload
Inputs = tuple[ModelShape, HardwareSpec, Workload]


def planner_inputs(
    model_config: Any,
    *,
    topology: TopologyConfig,
    planner: PlannerConfig,
    global_batch_size: int,
    seq_len: int,
    trainer_precision: str | None,
    optim: Mapping[str, Any] | None = None,
    calibrate: bool | None = None,
    reference_copy: bool = False,
) -> Inputs:
    """Model, hardware (measured when ``calibrate``, by default ``topology.calibrate``) and workload of a run;
    ``optim``: the run's optim section's values (``optim=muon``'s keys; None: AdamW)."""
    model = model_shape(model_config)
    hardware = HardwareSpec.from_topology(topology)

    def workload(hw: HardwareSpec) -> Workload:
        return Workload.of(
            planner,
            model=model_config,
            global_batch_size=global_batch_size,
            seq_len=seq_len,
            trainer_precision=trainer_precision,
            hardware=hw,
            optim=optim,
            reference_copy=reference_copy,
        )

    if calibrate if calibrate is not None else bool(topology.calibrate):
        from parallel.plan.calibrate import calibrate_hardware

        hardware = calibrate_hardware(
            hardware, model_config=model_config, workload=workload(hardware), threads=topology.threads_per_rank
        )
    return model, hardware, workload(hardware)


def choose_layout(inputs: Inputs) -> tuple[Plan, dict[str, str]]:
    """``parallel=auto``: the ranking among the strategies this checkout can train, and those strategies (name ->
    ``_target_``). Raises ``PlanError`` when no layout fits."""
    model, hardware, workload = inputs
    if hardware.world_size < 1:
        raise PlanError("topology describes no device")
    strategies = available_strategies(CONF)
    result = plan(model=model, hardware=hardware, workload=workload, allowed=strategies)
    _ = result.best  # raises PlanError naming the budget and the fix
    return result, strategies


def dry_run_for(run: RunSpec, inputs: Inputs, *, ranks: list[int] | None):
    """``trainer.dry_run=true``: the run's own layout built for ``ranks`` (None: a sample) under a fake process
    group, measured beside the planner's estimate (``parallel/plan/dry_run.py``)."""
    from parallel.plan.dry_run import dry_run, sample_ranks

    model, hardware, workload = inputs
    return dry_run(
        model_config=run.model,
        candidate=candidate_of(run),
        model=model,
        hardware=hardware,
        workload=workload,
        ranks=ranks if ranks is not None else sample_ranks(**run.layout.sizes),
    )


def predicted_step_time(run: RunSpec, inputs: Inputs) -> float:
    """The cost model's step time for the layout this run uses (the sweep report's prediction column)."""
    from parallel.plan.cost_model import estimate

    model, hardware, workload = inputs
    return estimate(candidate_of(run), model=model, hardware=hardware, workload=workload).step_time_s


def layout_warnings(run: RunSpec, inputs: Inputs) -> list[str]:
    """The seed's pitfalls for the layout this run uses."""
    model, hardware, workload = inputs
    return run_warnings(run, model=model, hardware=hardware, workload=workload)
