"""Which pipeline schedules exist, what each needs, and the bubble each should leave in theory.

Schedules themselves come from ``torch.distributed.pipelining``; this module maps the names users type
(``pp.schedule=1f1b``) to torch's classes, states each schedule's requirements once (validation, the
stage builder and the docs all read ``SCHEDULES``), and computes the theoretical bubble by replaying the
schedule's own action order (``schedule.pipeline_order``) with unit costs F=1, B=2 (I=1 + W=1).
Importing it does not import torch: validation stays fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: unit costs of one action on one stage (a backward costs about two forwards)
UNIT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    torch_name: str
    placement: str
    """single (one stage per rank), loop (stage s on rank s % pp) or v (rank r holds r and 2pp-1-r)."""
    description: str

    def stages_per_rank_problem(self, stages_per_rank: int) -> str | None:
        if self.placement == "single" and stages_per_rank != 1:
            return "runs one stage per rank; set pp.stages_per_rank=1 or use pp.schedule=interleaved_1f1b"
        if self.placement == "v" and stages_per_rank != 2:
            return "is a V schedule with exactly two stages per rank; set pp.stages_per_rank=2"
        return None

    def micro_batch_problem(self, *, micro_batches: int, pp: int, stages: int) -> str | None:
        m = micro_batches
        if self.name == "1f1b" and m < stages:
            return f"needs at least as many micro-batches as stages ({stages})"
        if self.name == "dualpipev" and m < stages:
            return f"needs at least as many micro-batches as stages (2 x pp.size = {stages})"
        if self.placement == "loop" and self.name != "looped_bfs":
            rounds = max(1, m // pp)
            if m % rounds:
                return f"runs micro-batches in rounds of pp.size={pp}; {m} is not a multiple of {rounds} rounds"
        return None

    def suggest_micro_batches(self, *, pp: int, stages: int, per_replica: int) -> list[int]:
        """Micro-batch counts this schedule accepts that divide the per-replica batch."""
        ok = [
            m
            for m in range(1, per_replica + 1)
            if per_replica % m == 0 and self.micro_batch_problem(micro_batches=m, pp=pp, stages=stages) is None
        ]
        return ok[:4]


SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec("gpipe", "GPipe", "single", "all forwards, then all backwards"),
        ScheduleSpec("1f1b", "1F1B", "single", "one forward, one backward in the steady state"),
        ScheduleSpec("interleaved_1f1b", "Interleaved1F1B", "loop", "1F1B over several stages per rank"),
        ScheduleSpec("looped_bfs", "LoopedBFS", "loop", "breadth-first over the local stages"),
        ScheduleSpec("zero_bubble", "InterleavedZeroBubble", "loop", "splits backward into input (I) and weight (W)"),
        ScheduleSpec("zbv", "ZBVZeroBubble", "v", "zero-bubble on a V placement"),
        ScheduleSpec("dualpipev", "DualPipeV", "v", "DeepSeek's DualPipe on a V placement"),
    )
}


def schedule_spec(name: str) -> ScheduleSpec:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"pp.schedule={name}: unknown schedule; use one of {', '.join(SCHEDULES)}") from None


def stage_to_rank(*, placement: str, pp: int, num_stages: int) -> list[int]:
    """Rank (position in the pp group) of every stage, as torch's schedules place them."""
    if placement in ("single", "loop"):
        return [s % pp for s in range(num_stages)]
    ranks = []
    for s in range(num_stages):
        lap, pos = divmod(s, pp)
        ranks.append(pos if lap % 2 == 0 else pp - 1 - pos)
    return ranks


def schedule_class(name: str) -> Any:
    """torch's schedule class for one of ``SCHEDULES`` (imports torch)."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    return get_schedule_class(schedule_spec(name).torch_name)


def available_schedules() -> list[str]:
    """Names whose class the installed torch provides."""
    out = []
    for name in SCHEDULES:
        try:
            schedule_class(name)
        except (ImportError, ValueError):
            continue
        out.append(name)
    return out


# ---- theoretical bubble -----------------------------------------------------------------------


def _compute_actions(actions: Iterable[Any]) -> list[tuple[str, int, int]]:
    """(kind, stage, micro-batch) of the compute actions in a rank's order (OVERLAP_F_B expanded)."""
    out = []
    for a in actions:
        if a is None:
            continue
        if isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], str):
            out.append(a)
            continue
        subs = getattr(a, "sub_actions", None)
        if subs:
            out.extend(_compute_actions(subs))
            continue
        kind = a.computation_type.value
        if kind in UNIT_COSTS:
            out.append((kind, a.stage_index, a.microbatch_index))
    return out


StageCosts = dict[int, dict[str, float]]
"""Seconds of one action per stage and kind: ``{stage: {"F": .., "B": .., "W": ..}}`` (I costs what B does)."""


def _cost_of(costs: dict[str, float] | StageCosts | None):
    """``(kind, stage) -> cost`` from unit costs per kind, or measured costs per stage and kind."""
    if costs is None:
        return lambda kind, stage: UNIT_COSTS[kind]
    if all(isinstance(k, str) for k in costs):
        return lambda kind, stage: costs[kind]  # type: ignore[index]
    return lambda kind, stage: costs[stage].get("B" if kind == "I" else kind, 0.0)  # type: ignore[union-attr]


def simulate(
    pipeline_order: dict[int, list[Any]],
    *,
    num_stages: int,
    costs: dict[str, float] | StageCosts | None = None,
) -> dict[str, Any]:
    """Replay every rank's compute actions in order, each starting when its inputs are ready.

    Dependencies: F(s, i) after F(s-1, i); B/I(s, i) after F(s, i) and B/I(s+1, i); W(s, i) after I(s, i).
    Communication is free. Returns the makespan, each rank's busy time and the bubble fraction
    (idle share of ranks x makespan).
    """
    cost = _cost_of(costs)
    queues = {r: _compute_actions(acts) for r, acts in pipeline_order.items()}
    done: dict[tuple[str, int, int], float] = {}
    clock = {r: 0.0 for r in queues}
    busy = {r: 0.0 for r in queues}
    pos = {r: 0 for r in queues}

    def ready(kind: str, s: int, i: int) -> float | None:
        deps = []
        if kind == "F":
            if s > 0:
                deps.append(("F", s - 1, i))
        elif kind in ("B", "I"):
            deps.append(("F", s, i))
            if s < num_stages - 1:
                deps.append(("B", s + 1, i) if ("B", s + 1, i) in done else ("I", s + 1, i))
        elif kind == "W":
            deps.append(("I", s, i))
        times = []
        for d in deps:
            if d not in done:
                return None
            times.append(done[d])
        return max(times, default=0.0)

    remaining = sum(len(q) for q in queues.values())
    while remaining:
        progressed = False
        for r, q in queues.items():
            while pos[r] < len(q):
                kind, s, i = q[pos[r]]
                t = ready(kind, s, i)
                if t is None:
                    break
                start = max(clock[r], t)
                clock[r] = start + cost(kind, s)
                busy[r] += cost(kind, s)
                done[(kind, s, i)] = clock[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule replay is stuck: the action order has a dependency cycle")
    makespan = max(clock.values()) if clock else 0.0
    total = makespan * len(queues)
    return {
        "makespan": makespan,
        "busy": busy,
        "bubble_fraction": 1.0 - sum(busy.values()) / total if total > 0 else 0.0,
    }


def single_stage_order(name: str, *, pp: int, micro_batches: int) -> dict[int, list[tuple[str, int, int]]]:
    """Action order per rank of GPipe and 1F1B as torch 2.13 executes them.

    Their ``pipeline_order`` attribute is for display only and does not match (1F1B's skips F0 on the
    last stage), so the order is written out here from ``_step_microbatches``.
    """
    m = micro_batches
    order: dict[int, list[tuple[str, int, int]]] = {}
    for r in range(pp):
        if name == "gpipe":
            order[r] = [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)]
            continue
        warmup = min(m, pp - r)
        acts = [("F", r, i) for i in range(warmup)]
        fwd, bwd = warmup, 0
        while True:
            acts.append(("B", r, bwd))
            bwd += 1
            if fwd == m:
                break
            acts.append(("F", r, fwd))
            fwd += 1
        acts += [("B", r, i) for i in range(bwd, m)]
        order[r] = acts
    return order


def action_order(name: str, *, pp: int, micro_batches: int, schedule: Any = None) -> dict[int, list[Any]]:
    """Every rank's action order: written out for single-stage schedules, the built schedule's otherwise."""
    if schedule_spec(name).placement == "single":
        return single_stage_order(name, pp=pp, micro_batches=micro_batches)
    return schedule.pipeline_order


def theoretical_bubble(name: str, *, pp: int, micro_batches: int, num_stages: int, schedule: Any = None) -> float:
    """Bubble fraction of a schedule with unit costs (equal stages, B = 2F), replaying its action order."""
    order = action_order(name, pp=pp, micro_batches=micro_batches, schedule=schedule)
    return float(simulate(order, num_stages=num_stages)["bubble_fraction"])


def bubble_parts(
    order: dict[int, list[Any]], *, num_stages: int, measured: float, stage_costs: StageCosts
) -> dict[str, float]:
    """Split a measured bubble into what the schedule, the stages' imbalance and per-action overhead cost.

    - schedule: the replay of the action order with equal stages (F = 1, B = 2), the textbook bubble;
    - imbalance: the same replay with each stage's measured F/B/W seconds, minus the schedule part (what
      unequal stages, and a B/F ratio other than 2, add or remove);
    - overhead: the rest of the measured bubble: time in send/recv, waiting on peers and the schedule's own
      bookkeeping between actions, which a replay with free communication cannot see.
    """
    schedule = float(simulate(order, num_stages=num_stages)["bubble_fraction"])
    replay = float(simulate(order, num_stages=num_stages, costs=stage_costs)["bubble_fraction"])
    return {"schedule": schedule, "imbalance": replay - schedule, "overhead": measured - replay}
