"""parallel=tp and parallel=fsdp reproduce parallel=single (losses within 1e-4 relative, 6 steps).

6 steps at the default lr 3e-3, the single reference shared with tests/integration/test_hybrid_parity.py and
tests/integration/test_pipeline_parity_and_bubble.py. Step 12 of this model and data at that lr is a loss spike
(gradient norm 1.9 -> 26.7) where TP's split matmuls, whose sums differ from single's by ~1e-7 relative on every
earlier step, come out 3e-4 apart in the gradient norm; these 6 steps stay before it (12 steps at lr 1e-3 stayed
within 1e-6, measured), so the 1e-4 tolerance keeps its margin and still catches a wrong gradient."""

from __future__ import annotations

import pytest

from tests.helpers import FAST, PARITY_STEPS, assert_parity, run_train

STEPS = PARITY_STEPS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def single(reference):
    return reference(*FAST, *STEPS)


def test_tp2_matches_single_and_times_its_collectives(single, tmp_path):
    run = run_train("parallel=tp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert_parity(run, single)
    for m, ref in zip(run.metrics(), single.metrics()):
        assert m["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)  # norm over shards, clipped alike
        # 4 blocks x (2 all-reduces forward + 4 backward: wq, wk, wv, w1 inputs) + head (1 + 1)
        assert m["tp_collectives"] == 26
        assert 0 < m["tp_comm_time_s"] < m["step_time_s"]
    rows = run.summary()["rank_map"]
    assert [(r["rank"], r["tp"], r["holds"]) for r in rows] == [(0, 0, "emb L0-3 head"), (1, 1, "emb L0-3 head")]


def test_tp2_sequence_and_loss_parallel_match_single(single, tmp_path):
    run = run_train(
        "parallel=tp",
        "tp.sequence_parallel=true",
        "tp.loss_parallel=true",
        "tp.measure_comm=false",
        *FAST,
        *STEPS,
        run_dir=tmp_path / "run",
    )
    assert_parity(run, single)
    assert "tp_comm_time_s" not in run.metrics()[0]


def test_fsdp2_with_accumulation_matches_single(single, tmp_path):
    run = run_train(
        "parallel=fsdp", "data.micro_batch_size=2", "dp.measure_comm=false", *FAST, *STEPS, run_dir=tmp_path / "run"
    )
    assert_parity(run, single)
    assert run.summary()["layout"]["dp_shard"] is True
    assert "comm_time_s" not in run.metrics()[0] and "comm_collectives" not in run.metrics()[0]


def test_fsdp2_without_accumulation_matches_single(single, tmp_path):
    run = run_train("parallel=fsdp", *FAST, *STEPS, run_dir=tmp_path / "run")
    assert_parity(run, single)
    assert run.summary()["layout"]["dp_shard"] is True
    # FSDP2's all-gathers and reduce-scatters, measured every step: 4 blocks + root, each gathered for
    # forward and backward and reduce-scattered once (the root is not resharded after forward)
    for m in run.metrics():
        assert 0 < m["comm_time_s"] <= m["step_time_s"] and 0 < m["comm_fraction"] <= 1, m
        assert m["comm_collectives"] >= 10, m
