"""The dry run's measured bytes against the plan's, for the layouts whose build costs seconds under torch's fake
process group (8 ranks, every sampled rank's program built): expert parallel with and without tensor parallel and
recomputation, Muon's optimizer state, LoRA's adapters, DeepSeek-V3's MLA and experts. In process but heavy, so
outside the fast tier (moved from tests/unit/test_planner_expert_parallel.py, test_planner_muon.py,
test_planner_lora.py and test_planner_published_layout.py with the same assertions); the planner's terms are checked
there on hand-computed and debug-size examples."""

from __future__ import annotations

import dataclasses

import pytest

from models.registry import typed_model
from parallel.plan.cli import plain, specs_from_cfg, workload_overrides
from parallel.plan.cost_model import Candidate, estimate
from parallel.plan.dry_run import dry_run
from tests.planning import MUON, planned


@pytest.fixture(scope="module")
def moe_dry_runs():
    """qwen3_moe_debug as dp4 x pp2 (1F1B, FSDP2) on 8 ranks, with ep 2 (borrowed from dp: the experts' own FSDP2
    mesh is 2 ranks) and without, under the fake process group."""
    model_config, (model, hardware, workload) = planned(
        "model=qwen3_moe_debug", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8"
    )
    out = {}
    for ep in (1, 2):
        c = Candidate(dp=4, pp=2, ep=ep, micro_batches=4, schedule="1f1b", zero_stage=3)
        out[ep] = dry_run(model_config=model_config, candidate=c, model=model, hardware=hardware, workload=workload)
    return model, out


def test_dry_run_builds_expert_parallel_and_its_bytes_match_the_plan(moe_dry_runs):
    model, reports = moe_dry_runs
    flat, ep = reports[1], reports[2]
    assert [r.rank for r in ep.ranks] == [r.rank for r in flat.ranks] == [0, 3, 4, 6, 7]
    assert [r.coords["ep"] for r in ep.ranks] == [0, 1, 0, 0, 1]
    for with_ep, without in zip(ep.ranks, flat.ranks, strict=True):
        assert with_ep.error is None and without.error is None, (with_ep.error, without.error)
        # experts / ep sharded over the 2 ranks holding them: the plan's model state; the saved activations too
        assert with_ep.ratio("model_state") == pytest.approx(1.0, abs=0.05), with_ep
        assert with_ep.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.01), with_ep
        # the ep run dispatched by all-to-all: each MoE block also keeps the 64 x 2 routed rows' reordering and its
        # inverse (int64), as the plan says (stage 0 holds sparse layers 0 and 1, stage 1 layer 2 and the dense 3)
        sparse = sum(model.sparse[i] for i in ({0: (0, 1), 1: (2, 3)}[with_ep.coords["pp"]]))
        key = "activations_per_micro_batch"
        assert with_ep.measured[key] - without.measured[key] == sparse * 2 * 64 * 2 * 8
        assert with_ep.estimated[key] - without.estimated[key] == sparse * 2 * 64 * 2 * 8


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_dry_run_of_ep_with_tp_and_recomputation_matches_the_plan(recompute):
    """dp2 x tp2 (sequence parallel; the MoE blocks whole on each tp rank) x pp2 x ep2 of qwen3_moe_debug in bf16,
    checkpointed as the plan says: every sampled rank's model state and saved activations are the plan's."""
    model_config, (model, hardware, workload) = planned(
        "model=qwen3_moe_debug", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8",
        "trainer.precision=bf16-mixed",
    )  # fmt: skip
    c = Candidate(
        dp=2, tp=2, pp=2, ep=2, micro_batches=4, schedule="1f1b", zero_stage=3, sequence_parallel=True,
        recompute=recompute,
    )  # fmt: skip
    report = dry_run(model_config=model_config, candidate=c, model=model, hardware=hardware, workload=workload)
    assert [r.rank for r in report.ranks] == [0, 3, 4, 7]
    for r in report.ranks:
        assert r.error is None, r.error
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.05), r
        assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.03), r


@pytest.mark.parametrize(
    ("model_name", "candidate"),
    [
        ("llama_debug", Candidate(dp=2, tp=2, zero_stage=3)),
        ("llama_debug", Candidate(dp=2, pp=2, micro_batches=2, schedule="1f1b", zero_stage=3)),
        ("qwen3_moe_debug", Candidate(dp=2, ep=2, zero_stage=3)),
        ("qwen3_moe_debug", Candidate(tp=2)),
    ],
    ids=["dp2xtp2", "dp2xpp2", "dp2xep2", "tp2"],
)
def test_dry_run_optimizer_bytes_equal_the_plan(model_name, candidate):
    model_config, (model, hardware, workload) = planned(*MUON, f"model={model_name}")
    report = dry_run(
        model_config=model_config,
        candidate=candidate,
        model=model,
        hardware=hardware,
        workload=workload,
    )
    adamw = estimate(
        candidate, model=model, hardware=hardware, workload=dataclasses.replace(workload, optimizer="adamw")
    )
    for r in report.ranks:
        assert r.error is None, r.error
        assert r.measured["optimizer"] == pytest.approx(r.estimated["optimizer"], rel=1e-9), r
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.01), r
    # one buffer for the matrices: less than AdamW's two moments, more than one per parameter
    worst = max(report.ranks, key=lambda r: r.estimated["optimizer"])
    assert worst.measured["params"] < worst.measured["optimizer"] < adamw.memory.optimizer


def test_lora_dry_run_measures_the_planned_bytes(compose_cfg):
    """The dry run builds the adapters as the trainer does and gives only them gradients and AdamW states: every
    sampled rank of dp2 x tp2 (sequence parallel, adapters sharded as their base) x pp2 with FSDP2 measures the
    planner's parameter, gradient and optimizer bytes."""
    cfg = compose_cfg(
        *workload_overrides(
            ["model=gpt_small", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8"]
            + ["model.lora.rank=4", "model.lora.targets=[wq,wv,w2]"]
        )
    )
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    c = Candidate(dp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b", zero_stage=3, sequence_parallel=True)
    report = dry_run(
        model_config=typed_model(plain(cfg.model)), candidate=c, model=model, hardware=hardware, workload=workload
    )
    for r in report.ranks:
        assert r.error is None, r.error
        assert 0 < r.measured["grads"] < r.measured["params"] / 20
        for key in ("params", "grads", "optimizer"):
            assert r.ratio(key) == pytest.approx(1.0, rel=1e-9), (key, r)


def test_dry_run_of_deepseek_v3_matches_the_plan(compose_cfg):
    """deepseek_v3_debug as dp4 x pp2 x ep2 (1F1B, FSDP2, bf16-mixed) under the fake process group: every sampled
    rank's model state is the plan's (MLA's projections and latent norms, the routed and shared experts) and its
    saved activations within 10% (MLA's latent norms and padded values, the sigmoid router's fp32 copies, the
    groups' picks, the sequence-wise loss)."""
    cfg = compose_cfg(*workload_overrides(
        ["model=deepseek_v3_debug", "model.mtp_depth=1", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8",
         "trainer.precision=bf16-mixed"]
    ))  # fmt: skip
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    c = Candidate(dp=4, pp=2, ep=2, micro_batches=4, schedule="1f1b", zero_stage=3)
    report = dry_run(
        model_config=typed_model(plain(cfg.model)), candidate=c, model=model, hardware=hardware, workload=workload
    )
    assert len(report.ranks) >= 4
    for r in report.ranks:
        assert r.error is None, r.error
        print(r.rank, "model state", r.ratio("model_state"), "activations", r.ratio("activations_per_micro_batch"))
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.01), r
        assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.1), r
