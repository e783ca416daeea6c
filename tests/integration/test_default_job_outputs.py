"""The default job end to end, started by `make train` as the README says (the session's ``default_job``, which
tests/integration/test_readme_commands.py exports too): every output file, read back, and the W&B offline run's
contents."""

from __future__ import annotations

import json

import pytest
import yaml

from trainer.observe.wandb_read import read_run

pytestmark = pytest.mark.slow


def test_default_job_outputs(default_job):
    run = default_job  # `make train` as printed: 200 steps (tests/conftest.py; the README test exports it)
    d = run.run_dir
    # console: progress lines and where the outputs are
    assert "done: loss" in run.proc.stdout and f"outputs in {d}" in run.proc.stdout
    # before step 1 it says what it does, on the clock of the command's start (issue 42)
    before = run.proc.stdout[: run.proc.stdout.index("step     1 |")]
    for stage in ("checking the run", "preparing the data", "starting 2 worker(s)", "building the model"):
        assert f" s] {stage}" in before, before[-3000:]

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, *range(10, 201, 10)]
    for m in metrics:
        assert {"step", "loss", "lr", "step_time_s", "tokens_per_s", "comm_fraction"} <= m.keys()
        assert m["tokens_per_s"] == pytest.approx(16 * 128 / m["step_time_s"], rel=1e-6)
        assert 0 < m["step_cpu_s"] < 10 * m["step_time_s"]  # the process's CPU time in the step, all threads
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"], "loss did not fall by 30%"

    summary = run.summary()
    assert summary["time_to_first_step_s"] > summary["fit_to_first_step_s"] > 0  # from the command's start
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
    assert hydra_cfg["parallel"]["name"] == "ddp" and hydra_cfg["trainer"]["max_steps"] == 200

    # W&B offline run: history rows are the logged steps, config is the resolved Hydra config
    wb = read_run(d)
    rows = [r for r in wb.history if "train/loss" in r]
    assert [r["train/step"] for r in rows] == [r["_step"] for r in rows] == [1, *range(10, 201, 10)]
    assert [r["train/loss"] for r in rows] == pytest.approx([m["loss"] for m in metrics])
    assert wb.config["parallel"]["name"] == "ddp"
    assert wb.config["model"]["max_seq_len"] == 128  # interpolation resolved
    assert wb.config["trainer"]["max_steps"] == 200
    assert wb.job_type == "ddp" and "dp2" in wb.tags
    assert wb.summary["final_loss"] == pytest.approx(summary["final_loss"])
    assert json.loads((d / "summary.json").read_text())["wandb_dir"]
