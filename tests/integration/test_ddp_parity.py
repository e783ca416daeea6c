"""Single vs DDP parity and the data-parallel measurements, through the real command line."""

from __future__ import annotations

import re

import pytest

from tests.helpers import FAST, assert_parity, run_train

pytestmark = pytest.mark.slow

#: 8 steps: the single loss falls to ~0.74 of its first (the "must move" check below asks < 0.8)
STEPS = ("trainer.max_steps=8",)


@pytest.fixture(scope="module")
def single_run(reference):
    return reference(*FAST, *STEPS)


def test_ddp_matches_single(single_run, tmp_path):
    ddp = run_train("parallel=ddp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert [m["step"] for m in ddp.metrics()] == list(range(1, 9))
    assert_parity(ddp, single_run)
    # the loss must actually move, or parity would prove nothing
    assert single_run.losses()[-1] < 0.8 * single_run.losses()[0]
    comm = [m["comm_fraction"] for m in ddp.metrics()]
    assert all(0 < c <= 1 for c in comm), comm
    assert all(m["comm_time_s"] <= m["step_time_s"] * 1.05 for m in ddp.metrics())
    summary = ddp.summary()
    assert summary["layout"]["dp"] == 2 and len(summary["peak_memory_bytes_per_rank"]) == 2
    assert all(p > 10 * 2**20 for p in summary["peak_memory_bytes_per_rank"])
    assert {r["rank"] for r in summary["layout"]["rank_map"]} == {0, 1}


def test_ddp_with_gradient_accumulation_matches_single(single_run, tmp_path):
    """Also without the comm-timing hook (DDP's own all-reduce): the same numbers, no DDP comm metrics."""
    ddp = run_train(
        "parallel=ddp", *FAST, *STEPS, "data.micro_batch_size=2", "dp.measure_comm=false", run_dir=tmp_path / "run"
    )
    assert_parity(ddp, single_run)
    assert not any("comm_time_s" in m or "comm_buckets" in m for m in ddp.metrics())


def test_legacy_dp_on_cpu_runs_as_single_with_warning(single_run, tmp_path):
    run = run_train("parallel=dp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert "parallel=dp runs as parallel=single here" in run.output and "Prefer parallel=ddp" in run.output
    assert_parity(run, single_run, rel=1e-6, params_atol=1e-6)


def test_cnn_under_ddp_matches_single_with_the_same_per_forward_batch(tmp_path):
    """BatchNorm normalises over each forward pass's batch: DDP's 2 x 8 samples equal one process
    accumulating 2 chunks of 8. Parameters match; the running statistics (DDP broadcasts rank 0's) do not."""
    cnn = ("model=cnn_bn", "data=images", *FAST, "data.global_batch_size=16", "trainer.max_steps=6")
    ref = run_train("parallel=single", *cnn, "data.micro_batch_size=8", run_dir=tmp_path / "single")
    run = run_train("parallel=ddp", *cnn, run_dir=tmp_path / "ddp")
    assert_parity(run, ref, skip=("running_", "num_batches_tracked"))
    assert ref.losses()[-1] < ref.losses()[0]


def test_batchnorm_small_batch_warning(tmp_path):
    run = run_train(
        "model=cnn_bn",
        "data=images",
        "data.global_batch_size=8",
        "trainer.max_steps=20",
        "logger=none",
        "trainer.log_every=5",
        run_dir=tmp_path / "run",
    )
    assert "3 BatchNorm layers" in run.output and "sees only 4 samples" in run.output
    losses = run.losses()
    assert losses[-1] < 0.7 * losses[0]
    # an image model's throughput is samples/s: the console, the done line, metrics.jsonl and summary.json say so
    assert " samples/s" in run.output and "tok/s" not in run.output
    assert re.search(r"done: loss [\d.]+ at step 1 -> [\d.]+ at step 20, [\d,]+ samples/s \(median\)", run.output)
    record = run.metrics()[-1]
    assert record["samples_per_s"] == pytest.approx(8 / record["step_time_s"], rel=1e-6)
    assert run.summary()["samples_per_s"] == run.summary()["tokens_per_s"]
    big = run_train(
        "model=cnn_bn",
        "data=images",
        "data.global_batch_size=32",
        "trainer.max_steps=2",
        "logger=none",
        run_dir=tmp_path / "big",
    )
    assert "BatchNorm" not in big.output
