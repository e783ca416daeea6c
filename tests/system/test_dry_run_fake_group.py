"""The dry run: a layout's real program (stages, TP plan, FSDP2, schedule) built for sampled ranks under torch's
fake process group in this process, its measured memory beside the planner's estimate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parallel.plan.cli import compose, workload_overrides
from parallel.plan.cost_model import Candidate, rank_params
from parallel.plan.dry_run import dry_run, sample_ranks
from parallel.plan.specs import ModelShape
from tests.planning import planner_inputs


def test_sampled_ranks_are_each_stages_first_and_last_and_one_in_the_middle():
    ranks = sample_ranks(pp=8, dp=32, tp=4)
    assert ranks[:2] == [0, 127] and ranks[-2:] == [896, 1023]
    assert len(ranks) == 17 and ((4 * 32 + 16) * 4 + 2) in ranks
    assert sample_ranks(pp=1, dp=1, tp=1) == [0]


@pytest.fixture(scope="module")
def small_cluster():
    """dp2 x tp2 x pp2 (8 ranks) of gpt_small with sequence parallel, FSDP2 and 1F1B: every piece at once, and a
    frozen reference model on every rank (DPO's ``trainer.preference.reference=copy``)."""
    cfg = compose(["model=gpt_small", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8"])
    model_config, (model, hardware, workload) = planner_inputs(cfg)
    workload = replace(workload, reference_copy=True)
    c = Candidate(dp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b", zero_stage=3, sequence_parallel=True)
    return (
        model_config,
        model,
        hardware,
        workload,
        dry_run(model_config=model_config, candidate=c, model=model, hardware=hardware, workload=workload),
    )


def test_small_cluster_measured_bytes_match_the_estimate(small_cluster):
    *_, report = small_cluster
    assert [r.rank for r in report.ranks] == [0, 3, 4, 7]
    assert [r.stages for r in report.ranks] == [[0], [0], [1], [1]]
    for r in report.ranks:
        assert r.error is None, r.error
        # the targets: model state within 5%, activations within 25% of the planner's estimate; the
        # activation formula counts what the blocks save: within 1% (token ids and positions on stage 0 uncounted)
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.05), r
        assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.01), r
        # fp32 AdamW: moments are twice the (sharded) parameters, gradients as large as the parameters
        assert r.measured["optimizer"] == 2 * r.measured["params"] == 2 * r.measured["grads"]
        # the frozen reference: the trainer's clone of this rank's (tp-, pp- and FSDP2-sharded) weights, as planned
        assert r.measured["reference"] == r.measured["params"] and r.estimated["reference"] == r.estimated["params"]
        assert r.ratio("reference") == pytest.approx(1.0, abs=0.05), r
    first, last = report.ranks[0], report.ranks[-1]
    assert first.measured["params"] != last.measured["params"]  # embeddings on stage 0, head on stage 1


def test_a_layout_that_cannot_be_built_is_reported_with_rank_and_fix(small_cluster):
    model_config, model, hardware, workload, _ = small_cluster
    # ZB-V places two stages per rank in a V; with one stage per rank torch refuses the schedule
    bad = Candidate(dp=1, tp=1, pp=2, micro_batches=4, schedule="zbv", stages_per_rank=1)
    report = dry_run(model_config=model_config, candidate=bad, model=model, hardware=hardware, workload=workload)
    errors = [r.error for r in report.ranks]
    assert all(e is not None for e in errors), errors
    assert "rank 0 (pp=0, dp=0, cp=0, tp=0): schedule failed" in errors[0] and "fix: pp.schedule=zbv" in errors[0]


def test_meshtrain_tensor_parallel_replicates_embeddings_and_norms():
    m = ModelShape(name="m", n_layers=4, d_model=64, n_heads=4, vocab_size=1000, max_seq_len=32)
    layers = [0, 1]
    sharded = rank_params(m, layers, first=True, last=False, tp=4, meshtrain=False)
    ours = rank_params(m, layers, first=True, last=False, tp=4, meshtrain=True)
    assert sharded == pytest.approx((m.layer_params(0) * 2 + m.embedding_params) / 4)
    replicated = m.embedding_params + 2 * m.layer_norm_params(0)
    assert ours == pytest.approx((m.layer_params(0) * 2 - 2 * m.layer_norm_params(0)) / 4 + replicated)


@pytest.mark.parametrize(
    "name,recompute", [("gpt_small", "selective"), ("llama_debug", "full"), ("qwen3_debug", "selective")]
)
def test_recomputation_is_built_and_keeps_the_planned_bytes(compose_cfg, name, recompute):
    """The dry run checkpoints the blocks as the layout's recompute says and counts what checkpointing keeps (block
    inputs, the selective policy's matmul and attention outputs) with the trainer's meter: the plan's bytes within
    1%, under cp 2 x tp 2 with sequence parallel, bf16, on rank 0 (embeddings and head: the whole model)."""
    cfg = compose_cfg(
        *workload_overrides([f"model={name}", "data.seq_len=64", "data.global_batch_size=4", "planner.precision=mixed"])
    )
    model_config, (model, hardware, workload) = planner_inputs(cfg)
    c = Candidate(cp=2, tp=2, sequence_parallel=True, micro_batches=2, recompute=recompute)
    report = dry_run(
        model_config=model_config,
        candidate=c,
        model=model,
        hardware=hardware,
        workload=workload,
        ranks=[0],
    )
    (r,) = report.ranks
    assert r.error is None, r.error
    assert report.layout["recompute"] == recompute
    assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=0.01), r
