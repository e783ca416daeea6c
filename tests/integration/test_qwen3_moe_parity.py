"""Qwen3-MoE (``models/qwen3_moe``, ``models/moe.py``) under the layouts that need no expert parallel reproduces
parallel=single: ddp, fsdp (experts sharded by FSDP2 along the expert dimension), and 1f1b with 2 micro-batches
(the auxiliary loss's gradient scaled per micro-batch as the LM loss is). Losses and gradient norms within 1e-4
relative over 4 steps. The load-balancing loss (on, 0.001) is a function of the tokens of one forward (one
micro-batch on one rank, as in Megatron-core and transformers), so every case runs forwards of 4 samples: single
accumulates 2 micro-batches of 4, ddp and fsdp run 4 per rank, 1f1b 2 micro-batches of 4; each job logs the balance (``moe_aux_loss``, ``moe_max_imbalance``) where it has the
MoE blocks in one module. tp is refused before any worker starts (the experts have no tensor-parallel plan)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAST, assert_losses_close, case_multirun, run_train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CASES: dict[str, dict] = {
    "single": {"defaults": [{"override /parallel": "single"}], "data": {"micro_batch_size": 4}},
    "ddp": {"defaults": [{"override /parallel": "ddp"}]},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "1f1b": {"defaults": [{"override /parallel": "pp"}], "pp": {"schedule": "1f1b", "micro_batches": 2}},
}
MODEL = ("model=qwen3_moe_debug", "model.d_model=64", "model.head_dim=32", "model.d_ff=192", "model.moe_d_ff=64")
STEPS = ("trainer.max_steps=4", "trainer.checkpoint_every=0", "pp.trace_step=0")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = case_multirun(CASES, *MODEL, *FAST, *STEPS, base=tmp_path_factory.mktemp("qwen3_moe"), group="parity_case")
    out = {}
    for case, job in jobs.items():
        metrics = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out[case] = (json.loads((job / "summary.json").read_text()), metrics)
    return out


def test_single_trains_and_reports_the_balance(runs):
    summary, metrics = runs["single"]
    assert summary["final_loss"] < summary["first_loss"] and len(metrics) == 4
    assert all(m["moe_aux_loss"] > 0 and m["moe_max_imbalance"] >= 1.0 for m in metrics)
    assert all(m["moe_dropped_tokens"] == 0 for m in metrics)


@pytest.mark.parametrize("case", [c for c in CASES if c != "single"])
def test_matches_single(case, runs):
    ref = runs["single"][1]
    metrics = runs[case][1]
    losses = [m["loss"] for m in metrics]
    print(case, "max relative loss difference", max(abs(a - r["loss"]) / r["loss"] for a, r in zip(losses, ref)))
    assert_losses_close(losses, [m["loss"] for m in ref], rel=1e-4)
    assert_losses_close([m["grad_norm"] for m in metrics], [m["grad_norm"] for m in ref], rel=1e-4)


def test_tensor_parallel_is_refused_before_spawn(tmp_path):
    run = run_train("model=qwen3_moe_debug", "parallel=tp", run_dir=tmp_path, expect_ok=False)
    assert run.proc.returncode == 2
    assert "no tensor-parallel plan" in run.output
