"""Which layout to train with: enumerate, drop what does not fit, rank by predicted step time, say why.

The seed's decision guide (fits one device → DDP; else deep → pipeline, not deep → model parallel; many
devices → hybrid; beware slow links, stage imbalance and activation memory) becomes a search over every
valid (dp, tp, pp, micro-batches, schedule, virtual stages, sharding, recomputation) scored by
``parallel.plan.cost_model``; the tree survives as the one-line reason printed next to the winner. No torch.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parallel.assembly.registry import TRAINABLE_RECOMPUTE, TRAINABLE_ZERO_STAGES, plannable, strategy_for
from parallel.foundation import dims
from parallel.foundation.checkpointing_modes import AC_MODES
from parallel.pipeline.schedules import SCHEDULES
from parallel.plan.cost_model import (
    Candidate,
    Estimate,
    dimension_pitfalls,
    dimension_reasons,
    estimate,
    memory_budget,
    peak_memory,
    splits_model,
)
from parallel.plan.specs import GB, HardwareSpec, ModelShape, PlanError, Workload

DEEP_LAYERS = 50
"""The seed's "deep" threshold: from about 50 layers, pipeline stages beat splitting each layer."""
MANY_DEVICES = 32
"""The seed's "many devices" threshold for hybrid layouts."""
SLOW_LINK_GBPS = 10.0
"""Links at or below this (Gbit/s) are "Ethernet-class": data parallel across them is the seed's pitfall."""
IMBALANCE_WARN = 0.20
MAX_MICRO_BATCH_OPTIONS = 8


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    hardware: HardwareSpec
    workload: Workload
    ranked: tuple[Estimate, ...]
    """Candidates that fit the memory budget, fastest first."""
    rejected: int
    """Candidates dropped for exceeding the memory budget."""
    closest_misses: tuple[Estimate, ...]
    """When nothing fits: the candidates needing the least memory."""
    reason: str
    pitfalls: tuple[str, ...] = ()
    """The seed's traps for the first choice, with their numbers (``pitfalls``)."""

    @property
    def best(self) -> Estimate:
        if not self.ranked:
            need = min(e.memory.total for e in self.closest_misses) / GB if self.closest_misses else float("nan")
            recompute = "" if set(AC_MODES) <= set(self.workload.recompute) else "allow planner.recompute=auto, "
            raise PlanError(
                f"no layout of model={self.model.name} fits topology={self.hardware.name}: the smallest needs "
                f"{need:.1f} GB per device, the budget is {self.hardware.memory_bytes * self.workload.memory_fraction / GB:.1f} GB "
                "(topology.device_memory_gb x planner.memory_fraction); lower planner.global_batch_size, "
                f"{recompute}or use more devices (topology.nnodes)"
            )
        return self.ranked[0]


# ---- what can be built ------------------------------------------------------------------------


def strategy_of(c: Candidate) -> str:
    """The ``parallel=`` option that trains ``c`` (the registry's ``picked_for`` rules)."""
    return strategy_for(**c.sizes, zero_stage=c.zero_stage, micro_batches=c.micro_batches, schedule=c.schedule)


def describe(c: Candidate) -> str:
    parts = [strategy_of(c)] + [f"{d}={v}" for d, v in c.sizes.items() if v > 1]
    parts.append(f"m={c.micro_batches}")
    if c.pp > 1:
        parts.append(c.schedule + (f"/v{c.stages_per_rank}" if c.stages_per_rank > 1 else ""))
    if c.zero_stage and c.data_size > 1:
        parts.append(f"zero{c.zero_stage}")
    if c.sequence_parallel:
        parts.append("sp")
    if c.recompute != "none":
        parts.append(f"recompute={c.recompute}")
    if c.dispatch != "flat":
        parts.append(f"dispatch={c.dispatch}")
    return " ".join(parts)


def available_strategies(conf_dir: Path) -> dict[str, str]:
    """``parallel=`` options the planner may choose in this checkout: registered strategies with a
    conf/parallel/NAME.yaml whose class's module exists. Maps each name to its ``_target_``."""
    found = {}
    for spec in plannable():
        module = spec.target.rpartition(".")[0]
        if not (conf_dir / "parallel" / f"{spec.name}.yaml").exists():
            continue
        try:
            if importlib.util.find_spec(module) is not None:
                found[spec.name] = spec.target
        except ModuleNotFoundError:
            continue
    return found


#: the planner's recomputation choice -> trainer.activation_checkpointing (parallel/techniques/checkpointing.py): the
#: planner's "selective" (attention scores and softmax recomputed, arXiv 2205.05198) is what the trainer's
#: op-level selective policy does (matmul outputs kept, the element-wise and softmax ops recomputed)
TRAINER_AC = {mode: mode for mode in TRAINABLE_RECOMPUTE}


def trainable(c: Candidate, strategies: Iterable[str]) -> bool:
    """This trainer shards with FSDP2 (ZeRO-3) or not at all, and runs every recomputation choice."""
    return (
        strategy_of(c) in set(strategies)
        and c.recompute in TRAINABLE_RECOMPUTE
        and c.zero_stage in TRAINABLE_ZERO_STAGES
    )


# ---- enumeration ------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_batch_counts(per_replica: int) -> list[int]:
    """Micro-batch counts m (dividing the per-replica batch) with power-of-two micro-batch sizes, plus m = 1."""
    sizes = [b for b in _divisors(per_replica) if b & (b - 1) == 0 or b == per_replica]
    ms = sorted({per_replica // b for b in sizes})
    if len(ms) > MAX_MICRO_BATCH_OPTIONS:  # keep the extremes and a spread between them
        step = (len(ms) - 1) / (MAX_MICRO_BATCH_OPTIONS - 1)
        ms = sorted({ms[round(i * step)] for i in range(MAX_MICRO_BATCH_OPTIONS)})
    return ms


def schedules_for(*, pp: int, m: int, n_layers: int) -> Iterator[tuple[str, int]]:
    """(schedule, stages_per_rank) pairs that can run ``m`` micro-batches on ``pp`` ranks (``ScheduleSpec.planned``)."""
    if pp == 1:
        yield "none", 1
        return
    for spec in SCHEDULES.values():
        for v in spec.planned(pp=pp, m=m, n_layers=n_layers):
            yield spec.name, v


def enumerate_candidates(*, model: ModelShape, hardware: HardwareSpec, workload: Workload) -> Iterator[Candidate]:
    B = workload.global_batch_size
    for degrees in dims.factorizations(hardware.world_size):
        sizes = dict(zip(dims.names(), degrees, strict=True))
        dp, tp, pp = sizes["dp"], sizes["tp"], sizes["pp"]
        if B % dp or not model.tp_divides(tp) or tp > hardware.devices_per_node or pp > model.n_layers:
            continue
        if not splits_model(sizes, model=model, workload=workload):  # the further dimensions' rules (cost model)
            continue
        data = math.prod(sizes[n] for n in dims.data_names())
        seq = math.prod(sizes[d.name] for d in dims.DIMENSIONS if d.splits_sequence)  # each sample's chunks
        # a dimension borrowing its ranks shards with FSDP2 (over its own mesh and the lenders' rest): ZeRO-3 only
        borrowed = any(sizes[n] > 1 for n in dims.borrowing())
        for m in micro_batch_counts(B // dp):
            for schedule, v in schedules_for(pp=pp, m=m, n_layers=model.n_layers):
                for zero in (3,) if borrowed else (0, 3) if data > 1 else (0,):
                    for sp in (
                        (False, True) if tp > 1 and (seq == 1 or workload.seq_len % (seq * tp) == 0) else (False,)
                    ):
                        for recompute in workload.recompute:
                            yield Candidate(
                                sizes=sizes,
                                micro_batches=m,
                                schedule=schedule,
                                stages_per_rank=v,
                                zero_stage=zero,
                                sequence_parallel=sp,
                                recompute=recompute,
                            )


def plan(
    *, model: ModelShape, hardware: HardwareSpec, workload: Workload, allowed: Iterable[str] | None = None
) -> Plan:
    """Rank every candidate (only those ``trainable`` with ``allowed`` strategies, when given). When nothing fits and
    the workload has a recomputation fallback (``planner.recompute=auto``), rank again with it and say so."""
    allowed = tuple(allowed) if allowed is not None else None
    ranked, misses, rejected = rank(model=model, hardware=hardware, workload=workload, allowed=allowed)
    without: Estimate | None = None
    if not ranked and workload.recompute_fallback:
        without = misses[0] if misses else None
        workload = replace(workload, recompute=workload.recompute_fallback, recompute_fallback=())
        ranked, misses, rejected = rank(model=model, hardware=hardware, workload=workload, allowed=allowed)
    reason = (
        seed_reason(ranked, model=model, hardware=hardware, workload=workload, without_recompute=without)
        if ranked
        else "nothing fits"
    )
    return Plan(
        model=model,
        hardware=hardware,
        workload=workload,
        ranked=ranked,
        rejected=rejected,
        closest_misses=misses,
        reason=reason,
        pitfalls=tuple(pitfalls(ranked[0].candidate, ranked[0], model=model, hardware=hardware, workload=workload))
        if ranked
        else (),
    )


#: the candidates over the budget a plan shows, smallest first
CLOSEST_MISSES = 5


def rank(
    *, model: ModelShape, hardware: HardwareSpec, workload: Workload, allowed: tuple[str, ...] | None
) -> tuple[tuple[Estimate, ...], tuple[Estimate, ...], int]:
    """(the candidates that fit, fastest first; the ``CLOSEST_MISSES`` over the budget, smallest first; how many were
    over it). Memory decides first: a candidate over the budget is not timed (most of a large model's are), nor one
    the sequence-split rule drops (most of the rest)."""
    within, misses = [], []
    budget = memory_budget(hardware, workload)
    for cand in enumerate_candidates(model=model, hardware=hardware, workload=workload):
        if allowed is not None and not trainable(cand, allowed):
            continue
        total = peak_memory(cand, model=model, workload=workload)
        if total <= budget:
            within.append(cand)
        else:
            misses.append((total, cand))
    for d in dims.DIMENSIONS:
        if d.splits_sequence and any(c.size(d.name) == 1 for c in within):
            # a sequence split only where nothing without it fits (long sequences): the cost model has no term for
            # the kernel efficiency short per-rank chunks lose, so at ordinary lengths its all-to-alls look free
            within = [c for c in within if c.size(d.name) == 1]
    fits = [estimate(c, model=model, hardware=hardware, workload=workload) for c in within]
    fits.sort(key=lambda e: (round(e.step_time_s, 12), e.candidate.micro_batches, e.memory.total))
    misses.sort(key=lambda x: x[0])
    closest = tuple(
        estimate(cand, model=model, hardware=hardware, workload=workload) for _, cand in misses[:CLOSEST_MISSES]
    )
    return tuple(fits), closest, len(misses)


# ---- the seed's decision tree, as the reason -------------------------------------------------


def one_device_need(*, model: ModelShape, hardware: HardwareSpec, workload: Workload) -> Estimate:
    """The whole model on one device, micro-batch of one sample: the seed's "fits one device" test."""
    c = Candidate(micro_batches=workload.global_batch_size)
    return estimate(c, model=model, hardware=hardware, workload=workload)


def seed_reason(
    ranked: tuple[Estimate, ...],
    *,
    model: ModelShape,
    hardware: HardwareSpec,
    workload: Workload,
    without_recompute: Estimate | None = None,
) -> str:
    """The seed's tree with this plan's numbers; ``without_recompute``: the smallest layout without recomputation,
    when none fitted and the plan fell back to every mode (``planner.recompute=auto``)."""
    best = ranked[0]
    c = best.candidate
    single = one_device_need(model=model, hardware=hardware, workload=workload)
    budget = single.budget_bytes / GB
    # the seed's test is the whole model with 1-sample micro-batches, a layout the table need not list: named as such
    need = f"the whole model with 1-sample micro-batches: {single.memory.total / GB:.3g}"
    if single.fits:
        rule = f"fits one device ({need} of {budget:.3g} GB) → ddp"
    elif model.n_layers >= DEEP_LAYERS:
        rule = f"does not fit one device ({need} > {budget:.3g} GB), deep ({model.n_layers} ≥ {DEEP_LAYERS} layers) → pipeline"
    else:
        rule = f"does not fit one device ({need} > {budget:.3g} GB), not deep ({model.n_layers} < {DEEP_LAYERS} layers) → model parallel (tp)"
    parts = [rule]
    if hardware.world_size >= MANY_DEVICES and not single.fits:
        parts.append(f"many devices ({hardware.world_size} ≥ {MANY_DEVICES}) → hybrid")
    nic_gbps = hardware.inter.gbps * hardware.devices_per_nic
    if hardware.nnodes > 1 and nic_gbps <= SLOW_LINK_GBPS:
        shared = f" shared by {hardware.devices_per_nic} devices" if hardware.devices_per_nic > 1 else ""
        if hardware.crosses_nodes(span=c.dp, stride=c.stride("dp")):
            where = (
                f"dp still crosses nodes: at batch {workload.global_batch_size} x {workload.seq_len} the "
                "activations pp would send exceed the gradients dp sends"
            )
        else:
            where = (
                "pp across nodes" if hardware.crosses_nodes(span=c.pp, stride=c.stride("pp")) else "all inside one node"
            )
        parts.append(
            f"{nic_gbps:g} Gbit/s inter-node{shared}: data parallel limited, prefer pp across nodes (chosen: {where})"
        )
    for d in dims.DIMENSIONS:  # a sequence split is ranked only when nothing without it fits (``rank``)
        if d.splits_sequence and c.size(d.name) > 1:
            n = c.size(d.name)
            parts.append(
                f"long sequence ({workload.seq_len} tokens): no layout without {d.title} fits → {d.name} "
                f"(each rank holds {workload.seq_len // n} tokens of every sample, its activations / {n})"
            )
    if without_recompute is not None:
        parts.append(
            f"nothing fits without recomputation (the smallest, {describe(without_recompute.candidate)}, needs "
            f"{without_recompute.memory.total / GB:.3g} of {budget:.3g} GB) → recomputation (planner.recompute=auto: "
            f"{', '.join(workload.recompute)} planned)"
        )
    parts += dimension_reasons(best, ranked, model=model, hardware=hardware, workload=workload, describe=describe)
    chosen = strategy_of(c)
    other = next((e for e in ranked[1:] if strategy_of(e.candidate) != chosen), None)
    tail = f"chosen {describe(c)}: {best.memory.total / GB:.3g} GB per rank, {best.step_time_s:.3g} s/step"
    if other is not None:
        tail += f", {other.step_time_s / best.step_time_s:.2f}x faster than the best {strategy_of(other.candidate)} ({describe(other.candidate)})"
    return "; ".join(parts) + "; " + tail


# ---- the seed's pitfalls -------------------------------------------------------------------


def pitfalls(
    c: Candidate, est: Estimate, *, model: ModelShape, hardware: HardwareSpec, workload: Workload
) -> list[str]:
    """The seed's three traps for one layout, each with the numbers that trigger it (the cost model's terms):
    data parallel over slow inter-node links, unbalanced pipeline stages, and activation memory that grows
    with the micro-batches a schedule keeps in flight; and expert parallel's classic rule, keep ep inside a node
    (its all-to-alls over the inter-node links)."""
    out = []
    if hardware.crosses_nodes(span=c.dp, stride=c.stride("dp")) and est.dp_comm_s > 0.25 * est.step_time_s:
        spanned = min(hardware.nnodes, -(-c.dp * c.stride("dp") // hardware.devices_per_node))
        out.append(
            f"dp.size={c.dp} spans {spanned} nodes over {hardware.inter.gbps:g} Gbit/s links per device "
            f"(topology.inter_node_gbps): the gradient all-reduce takes {est.dp_comm_s:.3g} s of a predicted "
            f"{est.step_time_s:.3g} s step; put pipeline stages across nodes instead (parallel=hybrid "
            f"pp.size={hardware.nnodes}) or try parallel=auto"
        )
    if c.pp > 1 and est.stage_imbalance > IMBALANCE_WARN:
        times = ", ".join(f"{t * 1e3:.3g}" for t in est.stage_times_s)
        out.append(
            f"pipeline stages are imbalanced by {est.stage_imbalance:.0%} (predicted ms per micro-batch: {times}; "
            f"split points {list(c.split_points) if c.split_points else 'uniform'}): the slowest stage "
            "sets the pace; move pp.split_points or use pp.split=balanced"
        )
    if c.pp > 1 and c.schedule in ("gpipe", "looped_bfs") and c.micro_batches > c.pp:
        # GPipe keeps every micro-batch's activations until the backwards start; 1F1B at most p of them
        ofob = estimate(
            replace(c, schedule="1f1b", stages_per_rank=1), model=model, hardware=hardware, workload=workload
        )
        if est.memory.activations > 0.25 * est.budget_bytes and ofob.memory.activations < est.memory.activations:
            out.append(
                f"pp.schedule={c.schedule} keeps all {c.micro_batches} micro-batches' activations alive on the first "
                f"stage: {est.memory.activations / GB:.3g} GB of a {est.budget_bytes / GB:.3g} GB budget, growing "
                f"with pp.micro_batches; 1f1b holds at most {c.pp}: {ofob.memory.activations / GB:.3g} GB"
            )
    out += dimension_pitfalls(c, est, model=model, hardware=hardware, workload=workload)
    if est.memory.activations > est.budget_bytes or not est.fits:
        key = "pp.micro_batches" if c.pp > 1 else "data.micro_batch_size"
        out.append(
            f"predicted memory per rank {est.memory.total / GB:.3g} GB (activations {est.memory.activations / GB:.3g} GB "
            f"for {c.micro_batches} micro-batch(es)) exceeds the budget {est.budget_bytes / GB:.3g} GB "
            f"(topology.device_memory_gb x planner.memory_fraction); raise {key} granularity (smaller micro-batches), "
            "use a schedule holding fewer micro-batches (1f1b), or shard (dp.shard=true)"
        )
    return out


# ---- parallel=auto unresolved ---------------------------------------------------------------


def unresolved_auto(**_: Any) -> None:
    """``_target_`` of conf/parallel/auto.yaml: the launcher replaces it before anything is built."""
    raise PlanError("parallel=auto reached a worker unresolved: run it through train.py, which plans it first")
