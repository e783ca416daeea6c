"""LoRA under pipelines, tensor parallel and from a checkpoint (real workers; the chat and PEFT side is
test_chat_finetune.py): pp, hybrid dp 2 x pp 2 and tp 2 with sequence parallel train the adapters to single's losses
and gradient norms, and a run resumed at step 2 from
its checkpoint (adapters, their AdamW state, frozen weights) continues exactly as the uninterrupted one."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import FAST, assert_losses_close, case_multirun, run_train

pytestmark = pytest.mark.slow

LORA = ("model.lora.rank=4", "trainer.max_steps=4", "trainer.checkpoint_every=2", "pp.trace_step=0")
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "pp": {"defaults": [{"override /parallel": "pp"}], "pp": {"schedule": "1f1b", "micro_batches": 2}},
    "hybrid_dp2_pp2": {"defaults": [{"override /parallel": "hybrid"}], "tp": {"size": 1}, "pp": {"micro_batches": 2}},
    # sequence parallel: the norms torch's SequenceParallel replicates stay frozen
    "tp_sp": {"defaults": [{"override /parallel": "tp"}], "tp": {"sequence_parallel": True, "loss_parallel": True}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return case_multirun(LAYOUTS, *FAST, *LORA, base=tmp_path_factory.mktemp("runs"), group="lora", timeout=900)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["pp", "hybrid_dp2_pp2", "tp_sp"])
def test_pipelined_lora_matches_single(runs, case):
    ref, got = metrics(runs["single"]), metrics(runs[case])
    print(f"{case}: {[round(m['loss'], 6) for m in got]}, single {[round(m['loss'], 6) for m in ref]}")
    assert len(got) == 4 and ref[-1]["loss"] < ref[0]["loss"]
    assert_losses_close([m["loss"] for m in got], [m["loss"] for m in ref], rel=1e-5)
    assert_losses_close([m["grad_norm"] for m in got], [m["grad_norm"] for m in ref], rel=1e-4)


def test_a_lora_run_resumes_from_its_checkpoint(runs, tmp_path):
    """The single run's folder as it stood at step 2 (its step-4 checkpoint and later records removed), resumed."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(runs["single"], run_dir, ignore=shutil.ignore_patterns("step_0000004", "*.lock"))
    lines = (runs["single"] / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    run = run_train("parallel=single", *FAST, *LORA, "trainer.resume=auto", run_dir=run_dir)
    assert "resumed from" in run.output
    got, ref = metrics(run_dir), metrics(runs["single"])
    print(
        f"resumed at step 2: {[round(m['loss'], 6) for m in got[2:]]}, uninterrupted {[round(m['loss'], 6) for m in ref[2:]]}"
    )
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    assert_losses_close([m["loss"] for m in got[2:]], [m["loss"] for m in ref[2:]], rel=1e-6)
