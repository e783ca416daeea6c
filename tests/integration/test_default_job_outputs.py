"""The default job end to end, started by `make train` as the README says: every output file, read back, and the
W&B offline run's contents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, TrainRun
from trainer.observe.wandb_read import read_run

pytestmark = pytest.mark.slow


def make_train(*overrides: str, run_dir: Path) -> TrainRun:
    """``make train ARGS="..."`` from the repository root, as the README starts the default job: a cold interpreter
    through the Makefile (``-o``: the environment this test runs in counts as bootstrapped)."""
    venv = Path(sys.prefix)
    args = " ".join([*overrides, f"hydra.run.dir={run_dir}"])
    cmd = ["make", "--no-print-directory", "train", f"VENV={venv}", "-o", str(venv / ".installed"), f"ARGS={args}"]
    env = {**os.environ, "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return TrainRun(proc=proc, run_dir=run_dir)


def test_default_job_outputs(tmp_path):
    run = make_train("trainer.max_steps=40", run_dir=tmp_path / "run")
    d = run.run_dir
    # console: progress lines and where the outputs are
    assert "done: loss" in run.proc.stdout and f"outputs in {d}" in run.proc.stdout

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 10, 20, 30, 40]
    for m in metrics:
        assert {"step", "loss", "lr", "step_time_s", "tokens_per_s", "comm_fraction"} <= m.keys()
        assert m["tokens_per_s"] == pytest.approx(16 * 128 / m["step_time_s"], rel=1e-6)
        assert 0 < m["step_cpu_s"] < 10 * m["step_time_s"]  # the process's CPU time in the step, all threads
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"], "loss did not fall by 30%"

    summary = run.summary()
    assert summary["final_loss"] == pytest.approx(metrics[-1]["loss"])
    assert summary["first_loss"] == pytest.approx(metrics[0]["loss"])
    assert summary["tokens_per_s"] > 0 and len(summary["peak_memory_bytes_per_rank"]) == 2
    cpu = summary["median_step_cpu_s_per_rank"]
    assert len(cpu) == 2 and all(0 < c < 10 * summary["median_step_time_s"] for c in cpu)
    layout = summary["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"], layout["world_size"]) == (2, 1, 1, 2)
    assert [r["rank"] for r in layout["rank_map"]] == [0, 1]

    assert (d / "logs" / "rank0.log").read_text().count("step ") >= 5
    assert "rank 1/2" in (d / "logs" / "rank1.log").read_text()
    hydra_cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
    assert hydra_cfg["parallel"]["name"] == "ddp" and hydra_cfg["trainer"]["max_steps"] == 40

    # W&B offline run: history rows are the logged steps, config is the resolved Hydra config
    wb = read_run(d)
    rows = [r for r in wb.history if "train/loss" in r]
    assert [r["train/step"] for r in rows] == [r["_step"] for r in rows] == [1, 10, 20, 30, 40]
    assert [r["train/loss"] for r in rows] == pytest.approx([m["loss"] for m in metrics])
    assert wb.config["parallel"]["name"] == "ddp"
    assert wb.config["model"]["max_seq_len"] == 128  # interpolation resolved
    assert wb.config["trainer"]["max_steps"] == 40
    assert wb.job_type == "ddp" and "dp2" in wb.tags
    assert wb.summary["final_loss"] == pytest.approx(summary["final_loss"])
    assert json.loads((d / "summary.json").read_text())["wandb_dir"]
