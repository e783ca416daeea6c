"""logger=tensorboard: rank 0 writes event files under <run>/tensorboard/ that TensorBoard's own reader reads back
with the run's losses; logger=wandb_tensorboard keeps both trackers; logger=none writes neither."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow

STEPS = ("trainer.max_steps=4", "parallel=single")


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}


def _tensorboard_losses(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    assert "loss" in acc.Tags()["scalars"], acc.Tags()
    return {e.step: e.value for e in acc.Scalars("loss")}


def test_tensorboard_event_files_hold_the_runs_losses(tmp_path):
    run = run_train(*FAST, *STEPS, "logger=tensorboard", run_dir=tmp_path / "run")
    expected = _losses(run.run_dir)
    assert sorted(expected) == [1, 2, 3, 4]
    seen = _tensorboard_losses(run.run_dir / "tensorboard")
    assert sorted(seen) == sorted(expected)
    for step, loss in expected.items():
        assert seen[step] == pytest.approx(loss, rel=1e-6), step
    assert not (run.run_dir / "wandb").exists()  # logger=tensorboard alone: no W&B run


def test_wandb_and_tensorboard_together_and_none_writes_neither(tmp_path):
    both = run_train(*FAST, *STEPS, "logger=wandb_tensorboard", run_dir=tmp_path / "both")
    assert (both.run_dir / "wandb").is_dir()
    assert _tensorboard_losses(both.run_dir / "tensorboard").keys() == _losses(both.run_dir).keys()
    none = run_train(*FAST, *STEPS, "logger=none", run_dir=tmp_path / "none")
    assert not (none.run_dir / "tensorboard").exists() and not (none.run_dir / "wandb").exists()
    assert (none.run_dir / "summary.json").is_file() and _losses(none.run_dir)
