"""Rank 0's sinks (trainer/observe/sinks.py): ``logger=`` picks the trackers, one or several, beside the console and
the run folder's files; each sink gets the logged steps and the run's end through the one interface (sink.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.observe.sinks import build_sinks, finish_sinks
from trainer.task import resolved_container
from trainer.validate import validate


@pytest.mark.parametrize(
    "override, wandb_mode, tensorboard",
    [
        ("logger=wandb", "offline", False),
        ("logger=tensorboard", "disabled", True),
        ("logger=wandb_tensorboard", "offline", True),
        ("logger=[wandb,tensorboard]", "offline", True),
        ("logger=[tensorboard,wandb]", "offline", True),
        ("logger=none", "disabled", False),
    ],
)
def test_logger_picks_one_tracker_or_several(compose_cfg, override, wandb_mode, tensorboard):
    cfg = compose_cfg(override)
    assert (cfg.logger.wandb.mode, cfg.logger.tensorboard.enabled) == (wandb_mode, tensorboard)


def _sinks(compose_cfg, run_dir, *overrides):
    cfg = compose_cfg("parallel=single", *overrides)
    ctx = SimpleNamespace(cfg=cfg, layout=validate(cfg, environ={}).layout, run_dir=run_dir, log=logging.getLogger("t"))
    return build_sinks(ctx=ctx, cfg_dict=resolved_container(cfg), run_meta={"run_name": "sinks-test"})


def _record(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step, "lr": 1e-3, "step_time_s": 0.1, "tokens_per_s": 100.0 * step}


def test_no_tracker_leaves_the_console_and_the_files(compose_cfg, tmp_path):
    sinks = _sinks(compose_cfg, tmp_path, "logger=none")
    assert [type(s).__name__ for s in sinks] == ["ConsoleSink", "FilesSink"]
    for sink in sinks:
        sink.log_step(_record(1))
    finish_sinks(sinks, {"final_loss": 4.0}, exit_code=0, log=logging.getLogger("t"))
    assert json.loads((tmp_path / "summary.json").read_text()) == {"final_loss": 4.0}
    assert [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [4.0]
    assert (tmp_path / "resolved_config.yaml").is_file() and not (tmp_path / "wandb").exists()


def test_every_sink_gets_the_steps_and_the_end(compose_cfg, tmp_path, wandb_service_polled_often):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = _sinks(compose_cfg, tmp_path, "logger=[wandb,tensorboard]")
    assert [type(s).__name__ for s in sinks] == ["ConsoleSink", "FilesSink", "WandbSink", "TensorBoardSink"]
    for step in (1, 2, 3):
        for sink in sinks:
            sink.log_step(_record(step))
            sink.advance(step)
    summary = {"final_loss": 2.0, "tokens_per_s": 200.0}
    finish_sinks(sinks, summary, exit_code=0, log=logging.getLogger("t"))
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["final_loss"] == 2.0  # with W&B's own field, added before any sink got the summary
    assert Path(written["wandb_dir"]).parent == tmp_path / "wandb"
    assert len(list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 4.0), (2, 3.0), (3, 2.0)]
