"""The dry run against the real thing: the same layout trained on local workers holds exactly the bytes the
fake-process-group build measured, and the plan CLI's --dry-run reports a GPU plan it cannot run here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import FAST, ROOT, run_train

LAYOUT = ("parallel=hybrid", "dp.size=2", "tp.size=1", "pp.size=2", "pp.micro_batches=4", "pp.schedule=1f1b")


@pytest.mark.slow
def test_dry_run_bytes_equal_a_real_run_of_the_same_layout(tmp_path):
    real = run_train(
        *LAYOUT,
        *FAST,
        "trainer.max_steps=2",
        "pp.trace_step=0",
        "trainer.checkpoint_every=0",
        run_dir=tmp_path / "real",
    )
    dry = run_train(*LAYOUT, *FAST, "trainer.dry_run=true", run_dir=tmp_path / "dry")
    assert "dry run: dp2 tp1 pp2 m=4 1f1b" in dry.output and not (tmp_path / "dry" / "metrics.jsonl").exists()
    # where it went, and what the folder holds (issue 42)
    assert f"dry run written to {tmp_path / 'dry' / 'dry_run.json'}" in dry.proc.stdout
    assert f"outputs in {tmp_path / 'dry'}: .hydra/, dry_run.json" in dry.proc.stdout
    report = json.loads((tmp_path / "dry" / "dry_run.json").read_text())
    held = real.summary()["model_state_bytes_per_rank"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    for r in report["ranks"]:
        assert r["error"] is None
        # FSDP2 shards, pipeline stages and AdamW moments: the fake build holds what the workers held
        for key in ("params", "grads", "optimizer"):
            assert r["measured"][key] == held[r["rank"]][key], (r["rank"], key)
        assert r["measured"]["model_state"] == pytest.approx(r["estimated"]["model_state"], rel=0.05)
        assert r["measured"]["activations_per_micro_batch"] == pytest.approx(
            r["estimated"]["activations_per_micro_batch"], rel=0.25
        )


@pytest.mark.slow
def test_plan_cli_dry_run_of_a_gpu_plan(tmp_path):
    """gpt_7b on one 8-GPU node (FSDP2 over 8 ranks, mixed precision): planned and built on this CPU."""
    proc = subprocess.run(
        [sys.executable, "-m", "parallel.plan", "model=gpt_7b", "topology=gpu_node", "--dry-run", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    best, report = out["candidates"][0], out["dry_run"]
    assert (
        report["layout"]["dp"] == best["dp"] and report["world_size"] == 8 and report["layout"]["precision"] == "mixed"
    )
    for r in report["ranks"]:
        assert r["error"] is None
        assert r["measured"]["model_state"] == pytest.approx(r["estimated"]["model_state"], rel=0.05)
        assert r["measured"]["activations_per_micro_batch"] == pytest.approx(
            r["estimated"]["activations_per_micro_batch"], rel=0.25
        )
