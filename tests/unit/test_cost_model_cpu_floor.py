"""CPU ranks beyond the node's cores: the time-share floor counts the measured CPU share of the fixed costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parallel.config import TopologyConfig
from parallel.plan.calibrate import BUSY_BATCH, FIXED_COST_LAYOUTS, solve_fixed_costs
from parallel.plan.cli import specs_from_cfg, typed_section
from parallel.plan.cost_model import Candidate, estimate
from parallel.plan.specs import HardwareSpec, PlanError, Workload
from tests.planning import plan_cfg


@pytest.fixture(scope="module")
def small():
    cfg = plan_cfg("model=gpt_small", "data.seq_len=64", "data.global_batch_size=16")
    shape, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    hardware = replace(hardware, cores_per_node=2, devices_per_node=4, tp_collective_s=4e-3, fixed_cost_cpu_share={})
    return shape, hardware, workload


def test_the_floor_counts_the_cpu_share_of_tp_collectives_on_four_ranks_of_two_cores(small):
    shape, hardware, workload = small
    dp2tp2 = Candidate(dp=2, tp=2, zero_stage=3)
    waiting = estimate(dp2tp2, model=shape, hardware=hardware, workload=workload)
    working = estimate(
        dp2tp2,
        model=shape,
        hardware=replace(hardware, fixed_cost_cpu_share={"tp_collective_s": 1.0}),
        workload=workload,
    )
    calls = (working.rank_work_s - waiting.rank_work_s) / 4e-3
    assert calls == pytest.approx(round(calls)) and calls >= 4 * 4  # every block's collectives, forward and backward
    # four ranks' work over two cores now exceeds the dedicated-core step: the step is that floor
    assert working.step_time_s == pytest.approx(4 * working.rank_work_s / 2)
    assert working.step_time_s > waiting.step_time_s
    # two ranks on two cores: each has its own core, the share changes nothing
    tp2 = Candidate(tp=2)
    alone = [
        estimate(tp2, model=shape, hardware=replace(hardware, fixed_cost_cpu_share=s), workload=workload).step_time_s
        for s in ({}, {"tp_collective_s": 1.0})
    ]
    assert alone[0] == alone[1]


def test_the_share_is_solved_back_from_a_calibration_steps_cpu_time(small):
    """A TP calibration step whose process was on a CPU for its work plus 60% of the seconds the TP cost explains
    solves back to a share of 0.6 (and the cost itself as before)."""
    shape, hardware, _ = small
    base = replace(hardware, devices_per_node=2, cores_per_node=2, tp_collective_s=0.0)
    candidate, batches = FIXED_COST_LAYOUTS["tp_collective_s"]
    w = Workload(global_batch_size=batches * BUSY_BATCH, seq_len=64)
    at_zero = estimate(candidate, model=shape, hardware=base, workload=w)
    wall = estimate(candidate, model=shape, hardware=replace(base, tp_collective_s=4e-3), workload=w).step_time_s
    cpu = at_zero.rank_work_s + 0.6 * (wall - at_zero.step_time_s)
    compute = {"shape": shape, "proxy_overhead_s": base.microbatch_overhead_s, "seq_len": 64}
    solved = solve_fixed_costs(base, compute=compute, steps={"tp_collective_s": wall, "cpu_tp_collective_s": cpu})
    assert solved["tp_collective_s"] == pytest.approx(4e-3)
    assert solved["fixed_cost_cpu_share"] == {"tp_collective_s": pytest.approx(0.6)}


def test_topology_shares_are_read_and_bad_ones_refused():
    cfg = plan_cfg("topology=local_cpu", "topology.fixed_cost_cpu_share.tp_collective=0.7")
    assert (
        HardwareSpec.from_topology(typed_section(TopologyConfig, cfg.topology)).fixed_cost_cpu_share["tp_collective_s"]
        == 0.7
    )
    bad = plan_cfg("topology=local_cpu", "topology.fixed_cost_cpu_share.fsdp_collective=1.5")
    with pytest.raises(PlanError, match=r"fixed_cost_cpu_share\.fsdp_collective=1\.5: must be a share from 0 to 1"):
        HardwareSpec.from_topology(typed_section(TopologyConfig, bad.topology))
