"""parallel=hybrid: pp × dp × tp on one DeviceMesh reproduces parallel=single; the rank map is right."""

from __future__ import annotations

import json

import pytest

from parallel.foundation.dims import mesh_names
from tests.helpers import FAST, PARITY_STEPS, assert_losses_close, assert_parity, run_train
from trainer.validate import validate


def assert_same_run(run, ref) -> None:
    """Losses and the clipped-by gradient norm (norm over stages and shards) within 1e-4 relative, and
    the final parameters (read back from the last checkpoint) within 1e-4."""
    assert_parity(run, ref)


pytestmark = pytest.mark.slow

STEPS = PARITY_STEPS


@pytest.fixture(scope="module")
def single(reference):
    return reference(*FAST, *STEPS)


def test_dp2_pp2_matches_single(single, tmp_path):
    run = run_train(
        "parallel=hybrid",
        "tp.size=1",
        "pp.micro_batches=2",
        "pp.trace_step=0",
        *FAST,
        *STEPS,
        run_dir=tmp_path / "run",
    )
    assert_same_run(run, single)
    assert all("bubble_fraction" in m for m in run.metrics())
    # the FSDP2 dp dimension's collectives, as for parallel=fsdp
    assert all(0 < m["comm_fraction"] <= 1 and m["comm_collectives"] > 0 for m in run.metrics())


@pytest.mark.parametrize(("schedule", "micro_batches"), [("interleaved_1f1b", 4), ("zbv", 2)])
def test_dp2_pp2_two_stages_per_rank_matches_single(single, tmp_path, schedule, micro_batches):
    """Two FSDP2-wrapped stages per rank. Each stage's async all-gathers (torch's UNSHARD actions) are waited on
    through the dp comm timer (they were not: non-finite at step 1); zbv's split backward keeps the blocks
    gathered from forward to backward (it gave the blocks no weight gradient: gradient norm 8.63 against 11.90)."""
    run = run_train(
        "parallel=hybrid",
        "tp.size=1",
        f"pp.schedule={schedule}",
        "pp.stages_per_rank=2",
        f"pp.micro_batches={micro_batches}",
        "pp.trace_step=0",
        *FAST,
        *STEPS,
        run_dir=tmp_path / "run",
    )
    worst = assert_parity(run, single)
    assert run.summary()["pipeline"]["num_stages"] == 4 and all(m["comm_collectives"] > 0 for m in run.metrics())
    print(f"dp2 x pp2 {schedule} m={micro_batches}: losses {run.losses()[:3]}..., max |param - single's| {worst:.2e}")


TP2_PP2 = (
    "parallel=hybrid",
    "dp.size=1",
    "pp.micro_batches=2",
    "pp.trace_step=0",
    "tp.sequence_parallel=true",
    *FAST,
    "trainer.checkpoint_every=4",
)


@pytest.fixture(scope="module")
def tp2_pp2(tmp_path_factory):
    """tp2 x pp2 with sequence parallel, stopped at its step-4 checkpoint and restarted in its folder up to step 6:
    the restarted run's metrics.jsonl holds all 6 steps, its last checkpoint the step-6 parameters."""
    folder = tmp_path_factory.mktemp("tp2_pp2") / "run"
    first = run_train(*TP2_PP2, "trainer.max_steps=4", run_dir=folder)
    assert [m["step"] for m in first.metrics()] == [1, 2, 3, 4]
    return run_train(*TP2_PP2, *STEPS, run_dir=folder)


def test_tp2_pp2_sequence_parallel_matches_single(tp2_pp2, single):
    """Sequence parallel inside pipeline stages, over 6 steps of which the last 2 ran after a restart."""
    assert [m["step"] for m in tp2_pp2.metrics()] == list(range(1, 7))
    assert_same_run(tp2_pp2, single)
    assert all(m["tp_comm_time_s"] > 0 for m in tp2_pp2.metrics())


def test_tp2_pp2_checkpoint_resumes_in_place_and_under_single(tp2_pp2, single, tmp_path):
    """Each pipeline rank gets its own optimizer groups back (flattened optimizer state), and TP shards
    of stages save under the full model's names, so parallel=single continues them too."""
    assert "resumed from" in tp2_pp2.output
    assert_losses_close(tp2_pp2.losses()[4:], single.losses()[4:])
    ckpt = tp2_pp2.run_dir / "checkpoints" / "step_0000004"
    resumed = run_train("parallel=single", *FAST, *STEPS, f"trainer.resume={ckpt}", run_dir=tmp_path / "single")
    assert [m["step"] for m in resumed.metrics()] == list(range(5, 7))
    assert_losses_close(resumed.losses(), single.losses()[4:])


#: FSDP2 on top of TP (2-D shards, _StridedShard), sequence parallel, micro-batch accumulation; a checkpoint every 3 steps
DP2_TP2 = (
    "parallel=hybrid",
    "pp.size=1",
    "dp.shard=false",
    "tp.sequence_parallel=true",
    "data.micro_batch_size=2",
    *FAST,
    "trainer.checkpoint_every=3",
)


@pytest.fixture(scope="module")
def dp2_tp2(tmp_path_factory):
    return run_train(*DP2_TP2, *STEPS, run_dir=tmp_path_factory.mktemp("dp2_tp2") / "run")


def test_dp2_tp2_without_pipeline_fsdp_over_tp_with_accumulation(dp2_tp2, single):
    """FSDP2 on top of TP (2-D shards, _StridedShard), sequence parallel, micro-batch accumulation."""
    assert_same_run(dp2_tp2, single)
    assert "DDP over tensor-parallel (DTensor) modules fails" in dp2_tp2.output  # dp.shard=false overridden, said why
    assert dp2_tp2.summary()["layout"]["dp_shard"] is True and "bubble_fraction" not in dp2_tp2.metrics()[0]


def test_dp2_tp2_resumes_bit_exactly(dp2_tp2, tmp_path):
    """docs/parallelism.md: a dp2 x tp2 run stopped at a checkpoint and restarted in its folder continues
    exactly as the uninterrupted run: same losses, gradient norms and final parameters, bit for bit."""
    run_train(*DP2_TP2, "trainer.max_steps=3", run_dir=tmp_path / "resumed")
    resumed = run_train(*DP2_TP2, *STEPS, run_dir=tmp_path / "resumed")
    assert "resumed from" in resumed.output
    tail = [m for m in resumed.metrics() if m["step"] > 3]
    assert [m["step"] for m in tail] == list(range(4, 7))
    assert [(m["loss"], m["grad_norm"]) for m in tail] == [(m["loss"], m["grad_norm"]) for m in dp2_tp2.metrics()[3:]]
    assert assert_parity(resumed, dp2_tp2, rel=0.0, params_atol=0.0) == 0.0


def test_hybrid_dp_dimension_is_ddp_when_it_composes(single, tmp_path, compose_cfg):
    """hybrid's dp dimension is DDP with dp.shard=false when nothing else is split (parity below); with
    pp > 1 or tp > 1 DDP does not compose on torch 2.13 (reducer error inside a pipeline stage, mixed
    Tensor/DTensor over TP), so validation switches that dp dimension to FSDP2 and says why."""
    piped = validate(compose_cfg("parallel=hybrid", "dp.size=2", "pp.size=2", "dp.shard=false"), environ={})
    assert piped.layout.dp_shard is True
    assert any("dp.shard=false" in w and "pp.size=2" in w for w in piped.warnings), piped.warnings
    over_tp = validate(compose_cfg("parallel=hybrid", "dp.size=2", "tp.size=2", "dp.shard=false"), environ={})
    assert over_tp.layout.dp_shard is True and any("tp.size=2" in w for w in over_tp.warnings)

    run = run_train(
        "parallel=hybrid",
        "pp.size=1",
        "tp.size=1",
        "dp.shard=false",
        *FAST,
        *STEPS,
        run_dir=tmp_path / "run",
    )
    assert run.summary()["layout"]["dp_shard"] is False
    assert "dp dimension: DDP" in (run.run_dir / "logs" / "rank0.log").read_text()
    assert_same_run(run, single)


def test_headline_dp2_tp2_pp2_eight_workers(tmp_path):
    """``python train.py parallel=hybrid pp.micro_batches=8``, shortened: parity, rank map, artifacts."""
    short = ("trainer.max_steps=3", "trainer.log_every=1", "logger=none", "data.seq_len=32")
    ref = run_train("parallel=single", *short, run_dir=tmp_path / "single")
    run = run_train("parallel=hybrid", "pp.micro_batches=8", *short, run_dir=tmp_path / "run")
    assert_same_run(run, ref)
    summary = run.summary()
    layout = summary["layout"]
    assert (layout["pp"], layout["dp"], layout["tp"], layout["micro_batches"]) == (2, 2, 2, 8)
    assert layout["dp_shard"] and layout["nproc_per_node"] == 8
    assert "rank map" in run.output

    rows = summary["rank_map"]
    assert sorted(r["rank"] for r in rows) == list(range(8))  # every rank once
    for r in rows:
        # the layout's coordinates are where the real DeviceMesh put each rank
        assert r["mesh_coordinate"] == [r[name] for name in mesh_names()]  # (pp, dp, cp, tp): the mesh's order
        assert r["rank"] == (r["pp"] * 2 + r["dp"]) * 2 + r["tp"] and r["node"] == 0 and r["local_rank"] == r["rank"]
        assert r["stages"] == [r["pp"]]
    held = {r["pp"]: r["layers"] for r in rows}
    assert held[0] == ["tok_embeddings", "pos_embeddings", "layers.0", "layers.1"]
    assert held[1] == ["layers.2", "layers.3", "norm", "output"]
    assert all(r["layers"] == held[r["pp"]] for r in rows)  # dp/tp peers hold the same stage

    png = summary["artifacts"]["images"]["rank_map"]
    assert png.endswith("rank_map.png") and (run.run_dir / "rank_map.png").stat().st_size > 1000
    assert "pipeline_timeline" in summary["artifacts"]["images"]  # the pipeline's artifacts are kept too
    assert summary["pipeline"]["micro_batches"] == 8
    json.dumps(summary)  # serialisable as written
