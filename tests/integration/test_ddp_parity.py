"""Single vs DDP parity and the data-parallel measurements, through the real command line."""

from __future__ import annotations

import pytest

from tests.helpers import FAST, assert_losses_close, run_train

pytestmark = pytest.mark.slow

STEPS = ("trainer.max_steps=12",)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    return run_train("parallel=single", *FAST, *STEPS, run_dir=tmp_path_factory.mktemp("single") / "run")


def test_ddp_matches_single(single_run, tmp_path):
    ddp = run_train("parallel=ddp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert [m["step"] for m in ddp.metrics()] == list(range(1, 13))
    assert_losses_close(ddp.losses(), single_run.losses(), rel=1e-4)
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
    ddp = run_train("parallel=ddp", *FAST, *STEPS, "data.micro_batch_size=2", run_dir=tmp_path / "run")
    assert_losses_close(ddp.losses(), single_run.losses(), rel=1e-4)


def test_legacy_dp_on_cpu_runs_as_single_with_warning(single_run, tmp_path):
    run = run_train("parallel=dp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert "parallel=dp runs as parallel=single here" in run.output and "Prefer parallel=ddp" in run.output
    assert_losses_close(run.losses(), single_run.losses(), rel=1e-6)


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
    big = run_train(
        "model=cnn_bn",
        "data=images",
        "data.global_batch_size=32",
        "trainer.max_steps=2",
        "logger=none",
        run_dir=tmp_path / "big",
    )
    assert "BatchNorm" not in big.output
