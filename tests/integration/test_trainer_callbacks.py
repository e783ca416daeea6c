"""trainer.callbacks: a user's own callback, named by _target_, sees every step with its metrics, each evaluation
and each checkpoint, on every rank."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_user_callback_sees_every_step_validation_and_checkpoint(tmp_path):
    record = tmp_path / "events.jsonl"
    spec = f"[{{_target_:tests.recording_callback.Recorder,path:'{record}'}}]"
    run = run_train(
        *FAST,
        "parallel=ddp",
        "trainer.max_steps=4",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=2",
        f"trainer.callbacks={spec}",
        run_dir=tmp_path / "run",
    )
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows}
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    assert sorted(val) == [2, 4]
    for rank in (0, 1):
        events = _events(tmp_path / f"events.rank{rank}.jsonl")
        hooks = [e["hook"] for e in events]
        assert hooks[0] == "on_train_start" and events[0]["start_step"] == 0
        assert hooks[-1] == "on_train_end" and events[-1] == {
            "hook": "on_train_end",
            "last_step": 4,
            "status": "completed",
        }
        steps = [e for e in events if e["hook"] == "on_step_end"]
        assert [e["step"] for e in steps] == [1, 2, 3, 4]
        for e in steps:  # the loss averaged over ranks, as metrics.jsonl has it
            assert e["loss"] == pytest.approx(losses[e["step"]], rel=1e-6)
        vals = [e for e in events if e["hook"] == "on_validation"]
        assert {e["step"]: pytest.approx(e["val_loss"], rel=1e-6) for e in vals} == val
        ckpts = [e for e in events if e["hook"] == "on_checkpoint"]
        assert [e["step"] for e in ckpts] == [2, 4]
        assert [e["path"] for e in ckpts] == [str(run.run_dir / "checkpoints" / f"step_{n:07d}") for n in (2, 4)]
