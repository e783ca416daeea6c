"""Which pipeline schedules exist, what each needs, and the bubble each should leave in theory.

Schedules themselves come from ``torch.distributed.pipelining``; this module maps the names users type
(``pp.schedule=1f1b``) to torch's classes, states each schedule's requirements once (validation, the
stage builder, the planner's enumeration and the cost model's bubble and memory terms all read
``SCHEDULES``), and computes the theoretical bubble by replaying the
schedule's own action order (``schedule.pipeline_order``) with unit costs F=1, B=2 (I=1 + W=1).
Importing it does not import torch: validation stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: unit costs of one action on one stage (a backward costs about two forwards)
UNIT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


# ---- what the cost model assumes of each schedule (equal stage times; Megatron-LM notation) ------------
# p pipeline ranks, m micro-batches, v stages per rank; ``stage`` is the pipeline rank.


def _fill_drain_idle(pp: int, m: int, v: int) -> float:
    """GPipe (arXiv 1811.06965, section 2.2) and 1F1B: p - 1 micro-batch slots of fill and drain, an
    overhead of (p-1)/m over the ideal m (Megatron-LM arXiv 2104.04473 eq. 1)."""
    return pp - 1


def _interleaved_idle(pp: int, m: int, v: int) -> float:
    """Interleaving v virtual stages per rank divides the bubble by v (arXiv 2104.04473 eq. 2)."""
    return (pp - 1) / v


def _zero_bubble_idle(pp: int, m: int, v: int) -> float:
    """ZB-H1 (arXiv 2401.10241 section 2.1, T_F = T_B = T_W) cuts 1F1B's bubble to a third."""
    return (pp - 1) / 3


def _zbv_idle(pp: int, m: int, v: int) -> float:
    """ZB-V (arXiv 2401.10241 section 6) reaches zero once m >= 2p, and behaves like interleaving with
    v = 2 below that."""
    return 0.0 if m >= 2 * pp else (pp - 1) / 2


def _all_forwards_first(pp: int, m: int, v: int, stage: int) -> float:
    """GPipe (arXiv 1811.06965) and Looped BFS run all m forwards before the backwards: m."""
    return float(m)


def _one_f_one_b_held(pp: int, m: int, v: int, stage: int) -> float:
    """1F1B (PipeDream-Flush, Megatron-LM arXiv 2104.04473 section 2.2.1): stage i holds at most p - i.
    ZB-H1 (arXiv 2401.10241, section 2.1) keeps 1F1B's peak; ZB-V (section 6) too."""
    return float(pp - stage)


def _interleaved_held(pp: int, m: int, v: int, stage: int) -> float:
    """Interleaved 1F1B (arXiv 2104.04473 section 2.2.2; memory in arXiv 2205.05198 section 4.2.3): stage 0
    holds L(1 + (p-1)/(pv)) layers worth, i.e. p + (p-1)/v micro-batches of its L/p layers."""
    return (pp - stage) + (pp - 1) / v


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule's rules, read by validation, the stage builder, the planner and the cost model."""

    name: str
    torch_name: str
    placement: str
    """single (one stage per rank), loop (stage s on rank s % pp) or v (rank r holds r and 2pp-1-r)."""
    description: str
    # ---- what torch's class accepts (validation)
    at_least_stages: bool = False
    """Needs at least as many micro-batches as stages."""
    in_rounds: bool = False
    """Runs micro-batches in rounds of pp.size: m must be a multiple of max(1, m // pp) rounds."""
    # ---- what the planner enumerates
    planned_stages_per_rank: tuple[int, ...] = ()
    """Stages per rank the planner tries (v > 1 needs pp x v <= layers); empty: never planned."""
    planned_min_rounds: int = 0
    """The planner asks for m >= planned_min_rounds x pp."""
    planned_whole_rounds: bool = False
    """The planner asks for m to be a multiple of pp."""
    # ---- what the cost model assumes (None: it does not model this schedule)
    bubble_idle: Callable[[int, int, int], float] | None = None
    """Idle micro-batch slots of one step, (pp, m, v) -> slots; the bubble is idle / (m + idle)."""
    in_flight: Callable[[int, int, int, int], float] | None = None
    """Micro-batches whose activations a stage holds at its peak, (pp, m, v, stage) -> count (capped at m)."""
    p2p_round_trips: int = 1
    """Activation/gradient round trips per virtual-stage boundary and micro-batch the cost model counts."""
    splits_backward: bool = False
    """Backward runs as input (I) then weight (W) actions: torch differentiates the weights the stage module holds
    when I starts, so FSDP2 must keep them gathered from forward to backward (``parallel/assembly/compose.py``)."""

    @property
    def modeled(self) -> bool:
        """Whether the cost model (and so the planner) knows this schedule."""
        return self.bubble_idle is not None and self.in_flight is not None

    def stages_per_rank_problem(self, stages_per_rank: int) -> str | None:
        if self.placement == "single" and stages_per_rank != 1:
            return "runs one stage per rank; set pp.stages_per_rank=1 or use pp.schedule=interleaved_1f1b"
        if self.placement == "v" and stages_per_rank != 2:
            return "is a V schedule with exactly two stages per rank; set pp.stages_per_rank=2"
        return None

    def micro_batch_problem(self, *, micro_batches: int, pp: int, stages: int) -> str | None:
        m = micro_batches
        if self.at_least_stages and m < stages:
            shown = f"2 x pp.size = {stages}" if self.placement == "v" else str(stages)
            return f"needs at least as many micro-batches as stages ({shown})"
        if self.in_rounds:
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

    def planned(self, *, pp: int, m: int, n_layers: int) -> list[int]:
        """Stages per rank the planner tries for ``m`` micro-batches on ``pp`` ranks of ``n_layers`` blocks."""
        if m < self.planned_min_rounds * pp or (self.planned_whole_rounds and m % pp):
            return []
        return [v for v in self.planned_stages_per_rank if v == 1 or pp * v <= n_layers]


#: the order users see (messages, docs) and the planner enumerates
SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec(
            "gpipe",
            "GPipe",
            "single",
            "all forwards, then all backwards",
            planned_stages_per_rank=(1,),
            bubble_idle=_fill_drain_idle,
            in_flight=_all_forwards_first,
        ),
        ScheduleSpec(
            "1f1b",
            "1F1B",
            "single",
            "one forward, one backward in the steady state",
            at_least_stages=True,
            planned_stages_per_rank=(1,),
            planned_min_rounds=1,
            bubble_idle=_fill_drain_idle,
            in_flight=_one_f_one_b_held,
        ),
        ScheduleSpec(
            "interleaved_1f1b",
            "Interleaved1F1B",
            "loop",
            "1F1B over several stages per rank",
            in_rounds=True,
            planned_stages_per_rank=(2, 4),
            planned_min_rounds=1,
            planned_whole_rounds=True,
            bubble_idle=_interleaved_idle,
            in_flight=_interleaved_held,
        ),
        ScheduleSpec(
            "looped_bfs",
            "LoopedBFS",
            "loop",
            "breadth-first over the local stages",
            bubble_idle=_interleaved_idle,
            in_flight=_all_forwards_first,
        ),
        ScheduleSpec(
            "zero_bubble",
            "InterleavedZeroBubble",
            "loop",
            "splits backward into input (I) and weight (W)",
            splits_backward=True,
            in_rounds=True,
            planned_stages_per_rank=(1,),
            planned_min_rounds=1,
            bubble_idle=_zero_bubble_idle,
            in_flight=_one_f_one_b_held,
        ),
        ScheduleSpec(
            "zbv",
            "ZBVZeroBubble",
            "v",
            "zero-bubble on a V placement",
            splits_backward=True,
            planned_stages_per_rank=(2,),
            planned_min_rounds=2,
            bubble_idle=_zbv_idle,
            in_flight=_one_f_one_b_held,
            p2p_round_trips=2,
        ),
        ScheduleSpec(
            "dualpipev",
            "DualPipeV",
            "v",
            "DeepSeek's DualPipe on a V placement",
            splits_backward=True,
            at_least_stages=True,
        ),
    )
}

#: what the cost model assumes with pp.size=1 (gradient accumulation over micro-batches, no pipeline)
NO_PIPELINE = ScheduleSpec(
    "none",
    "",
    "single",
    "no pipeline",
    bubble_idle=lambda pp, m, v: 0.0,
    in_flight=lambda pp, m, v, stage: 1.0,
)


def schedule_spec(name: str) -> ScheduleSpec:
    """The rules of ``pp.schedule=name`` (``none``: no pipeline)."""
    if name == NO_PIPELINE.name:
        return NO_PIPELINE
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


def stage_ranks(*, schedule: str, pp: int, num_stages: int) -> list[int]:
    """Rank (position in the pp group) of every stage as ``pp.schedule=schedule`` places them (``stage_to_rank`` of
    its placement; one pipeline rank holds every stage)."""
    placement = schedule_spec(schedule).placement if pp > 1 else NO_PIPELINE.placement
    return stage_to_rank(placement=placement, pp=pp, num_stages=num_stages)


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
