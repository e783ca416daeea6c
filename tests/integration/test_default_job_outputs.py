"""The default job end to end: every output file, read back, and the W&B offline run's contents."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import run_train
from trainer.observe.wandb_records import find_run_file, read_offline_run

pytestmark = pytest.mark.slow


def test_default_job_outputs(tmp_path):
    run = run_train("trainer.max_steps=40", run_dir=tmp_path / "run")
    d = run.run_dir
    # console: progress lines and where the outputs are
    assert "done: loss" in run.proc.stdout and f"outputs in {d}" in run.proc.stdout

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 10, 20, 30, 40]
    for m in metrics:
        assert {"step", "loss", "lr", "step_time_s", "tokens_per_s", "comm_fraction"} <= m.keys()
        assert m["tokens_per_s"] == pytest.approx(16 * 128 / m["step_time_s"], rel=1e-6)
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"], "loss did not fall by 30%"

    summary = run.summary()
    assert summary["final_loss"] == pytest.approx(metrics[-1]["loss"])
    assert summary["first_loss"] == pytest.approx(metrics[0]["loss"])
    assert summary["tokens_per_s"] > 0 and len(summary["peak_memory_bytes_per_rank"]) == 2
    layout = summary["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"], layout["world_size"]) == (2, 1, 1, 2)
    assert [r["rank"] for r in layout["rank_map"]] == [0, 1]

    assert (d / "logs" / "rank0.log").read_text().count("step ") >= 5
    assert "rank 1/2" in (d / "logs" / "rank1.log").read_text()
    hydra_cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
    assert hydra_cfg["parallel"]["name"] == "ddp" and hydra_cfg["trainer"]["max_steps"] == 40

    # W&B offline run: history rows are the logged steps, config is the resolved Hydra config
    wb = read_offline_run(find_run_file(d))
    rows = [r for r in wb.history if "loss" in r]
    assert [r["_step"] for r in rows] == [1, 10, 20, 30, 40]
    assert [r["loss"] for r in rows] == pytest.approx([m["loss"] for m in metrics])
    assert wb.config["parallel"]["name"] == "ddp"
    assert wb.config["model"]["max_seq_len"] == 128  # interpolation resolved
    assert wb.config["trainer"]["max_steps"] == 40
    assert wb.job_type == "ddp" and "dp2" in wb.tags
    assert wb.summary["final_loss"] == pytest.approx(summary["final_loss"])
    assert json.loads((d / "summary.json").read_text())["wandb_dir"]
