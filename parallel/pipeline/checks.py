"""What a pipelined run (parallel=pp, mp, hybrid with pp.size > 1) needs of its config, checked before any worker
starts: the shape a strategy fixes (parallel=mp), the schedule's micro-batches and stages per rank, and
the split points against the model's blocks. Each check takes ``(run, strategy)`` (the typed run,
``parallel/foundation/run.py``, and the strategy's ``StrategySpec``, None for a user's own) and returns the problems as
"key=value: what is wrong; the fix"; the strategies list them in ``StrategySpec.checks``
(``parallel/assembly/registry.py``). No torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from models.registry import UnknownModel, spec_for
from parallel.pipeline.schedules import SCHEDULES

if TYPE_CHECKING:
    from parallel.foundation.run import RunSpec


def fixed_pipeline_problems(run: RunSpec, strategy: Any) -> list[str]:
    """A strategy whose pipeline shape is fixed (parallel=mp: ``registry.MODEL_PARALLEL``) refuses a config
    that changes it."""
    layout = run.layout
    if layout.schedule is None or strategy is None or strategy.fixed_pipeline is None:
        return []
    return strategy.fixed_pipeline.problems(
        name=layout.strategy,
        micro_batches=layout.micro_batches,
        schedule=layout.schedule,
        stages_per_rank=layout.stages_per_rank,
    )


def schedule_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """Stages per rank and micro-batches the schedule can run (``ScheduleSpec``); the name is typed by the schema."""
    layout = run.layout
    spec = SCHEDULES.get(str(layout.schedule)) if layout.schedule is not None else None
    if spec is None:
        return []
    m, pp, v = layout.micro_batches, layout.pp, layout.stages_per_rank
    problem = spec.stages_per_rank_problem(v)
    if problem:
        return [f"pp.stages_per_rank={v} with pp.schedule={spec.name}: {spec.name} {problem}"]
    problem = spec.micro_batch_problem(micro_batches=m, pp=pp, stages=pp * v)
    if not problem:
        return []
    per_replica = run.batch.per_replica(layout.dp)
    ok = spec.suggest_micro_batches(pp=pp, stages=pp * v, per_replica=per_replica)
    fix = (
        f"use pp.micro_batches={' or '.join(map(str, ok))}"
        if ok
        else f"raise data.global_batch_size so it holds at least {pp * v} micro-batches per replica"
    )
    return [
        f"pp.micro_batches={m} with pp.schedule={spec.name}: {spec.name} {problem}; {fix}"
        + ("" if spec.name != "1f1b" else ", or pp.schedule=gpipe")
    ]


def split_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """The model splits into stages (its ``ModelSpec.pipeline``), has a block per stage, and the split points
    name blocks in increasing order."""
    layout, model = run.layout, run.model
    try:
        spec = spec_for(model)
    except UnknownModel:
        return []  # validation's model check says so
    name, pp, v = layout.strategy, layout.pp, layout.stages_per_rank
    if spec.pipeline is None:
        return [
            f"parallel={name} with model={model.get('name')}: the model family '{spec.family}' cannot be split "
            "into pipeline stages (ModelSpec.pipeline is None); use parallel=ddp or fsdp"
        ]
    n = spec.n_blocks(model)
    if n is None:
        return []
    num_stages = pp * v
    depth = f"model.n_layers={n}" if "n_layers" in model else f"{n} blocks in the model (its ModelSpec.blocks)"
    if num_stages > n:
        return [
            f"pp.size={pp} x pp.stages_per_rank={v} = {num_stages} stages but {depth}: every stage "
            f"needs at least one block; use at most {n} stages or a deeper model"
        ]
    points = layout.split_points
    if points is None:
        return []
    key = strategy.split_points_key if strategy is not None else "pp.split_points"
    shown, out = list(points), []
    if len(points) != num_stages - 1:
        out.append(
            f"{key}={shown}: {len(points)} split point(s) make {len(points) + 1} stages but the layout has "
            f"{num_stages} (pp.size={pp} x pp.stages_per_rank={v}); give {num_stages - 1} block indices"
        )
    bad = [p for p in points if not 0 < p < n]
    if bad:
        out.append(
            f"{key}={shown}: {bad} out of range; split points are block indices where a new stage "
            f"starts, between 1 and {n - 1} for {depth}"
        )
    elif any(b <= a for a, b in zip(points, points[1:])):
        out.append(
            f"{key}={shown}: split points must be strictly increasing (a repeated point leaves an "
            "empty stage); e.g. " + str(list(range(1, num_stages)) if num_stages <= n else [])
        )
    return out


def pipeline_problems(run: RunSpec, strategy: Any) -> list[str]:
    """Everything a pipelined layout needs (nothing when the run does not pipeline)."""
    if run.layout.schedule is None:
        return []
    out = schedule_problems(run, strategy)
    trace_step = run.pipeline.trace_step
    if trace_step < 0:
        out.append(f"pp.trace_step={trace_step}: must be >= 0 (0 writes no timeline)")
    return out + split_problems(run, strategy)
