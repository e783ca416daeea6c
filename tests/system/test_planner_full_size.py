"""Full-size plans over 1024 GPUs, searched and their first choice built under the fake process group: system tests
of the planner by nature (a search over tens of thousands of layouts, then a dry run of a 235B or a 128k-token
model), moved from the fast tier (tests/unit/test_planner_expert_parallel.py, tests/unit/test_context_parallel.py)
with the same assertions. The planner's terms are checked there on hand-computed and debug-size examples."""

from __future__ import annotations

from models.registry import typed_model
from parallel.plan.cli import plain, specs_from_cfg, workload_overrides
from parallel.plan.search import plan
from tests.helpers import assert_dry_run_matches_plan


def test_qwen3_235b_on_1024_h100s_ranks_expert_parallel_first(compose_cfg):
    # at its 512 x 4096 tokens no layout without context parallel fits 80 GB without recomputation (the routed rows'
    # activations: about 1.2 GB per sparse layer and sample): cp splits them, so the first choice recomputes nothing
    cfg = compose_cfg("model=qwen3_235b_a22b", "topology=cluster_1024xh100")
    model, hardware, workload = specs_from_cfg(cfg)
    assert workload.recompute == ("none",) and workload.recompute_fallback == ("none", "selective", "full")
    assert model.context_parallel
    p = plan(model=model, hardware=hardware, workload=workload)
    best = p.best.candidate
    assert best.recompute == "none" and "nothing fits without recomputation" not in p.reason
    assert best.cp > 1 and "no layout without context parallel fits → cp" in p.reason
    assert best.ep > 1 and model.n_experts % best.ep == 0 and (best.dp * best.cp) % best.ep == 0
    assert best.ep * best.tp <= hardware.devices_per_node  # the all-to-alls stay on NVLink
    assert p.ranked[0].ep_comm_s > 0
    without = next(e for e in p.ranked if e.candidate.ep == 1)
    assert without.step_time_s > p.ranked[0].step_time_s
    assert f"→ ep={best.ep} (inside a node)" in p.reason and "faster than the best layout without ep" in p.reason
    # and the first choice builds with the planned bytes (the done-when of issue 35)
    assert_dry_run_matches_plan(typed_model(plain(cfg.model)), best, model=model, hardware=hardware, workload=workload)


def test_the_planner_picks_cp_at_128k_and_says_why(compose_cfg):
    overrides = workload_overrides(["model=llama3_8b", "topology=cluster_1024xh100", "data.seq_len=131072"])
    assert overrides[-1] == "planner.seq_len=131072"
    # without recomputation (a third of the candidates): still nothing without cp fits
    cfg = compose_cfg(*overrides, "planner.recompute=none")
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    result = plan(model=model, hardware=hardware, workload=workload)
    assert workload.seq_len == 131072 and result.best.candidate.cp > 1
    assert all(e.candidate.cp > 1 for e in result.ranked)  # at 128k nothing without cp fits 80 GB
    assert "long sequence (131072 tokens): no layout without context parallel fits → cp" in result.reason
    # the first choice builds with the planned bytes (the done-when of issue 34)
    assert_dry_run_matches_plan(
        typed_model(plain(cfg.model)), result.best.candidate, model=model, hardware=hardware, workload=workload
    )
