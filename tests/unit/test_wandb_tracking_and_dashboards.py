"""Experiment tracking without workers: W&B metric sections, the run id kept in the run folder, the sweep's
W&B workspace spec (wandb-workspaces) and the report's interactive W&B charts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from trainer.observe.wandb_run import RunIdentity, wandb_key, wandb_metrics


def test_metric_sections():
    record = {
        "step": 3,
        "loss": 2.5,
        "lr": 1e-3,
        "step_time_s": 0.1,
        "tokens_per_s": 900.0,
        "bubble_fraction": 0.3,
        "stage1_busy_s": 0.05,
        "comm_fraction": 0.2,
        "peak_memory_bytes": 10,
        "note": "text",
    }
    assert wandb_metrics(record) == {
        "train/step": 3,
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "perf/step_time_s": 0.1,
        "perf/tokens_per_s": 900.0,
        "pipeline/bubble_fraction": 0.3,
        "pipeline/stage1_busy_s": 0.05,
        "comm/comm_fraction": 0.2,
        "memory/peak_memory_bytes": 10,
    }
    assert wandb_key("eval/loss") == "eval/loss"


def test_run_identity_is_kept(tmp_path):
    first = RunIdentity(tmp_path)
    assert not first.resumed and len(first.id) == 8
    first.started()
    first.logged(7)
    again = RunIdentity(tmp_path)
    assert again.resumed and again.id == first.id and again.last_step == 7 and again.segments == 1
    assert again.is_best(3.0) and not again.is_best(4.0) and again.is_best(2.0)
    assert RunIdentity(tmp_path).best_loss == 2.0


# ---- sweep dashboards: the W&B workspace spec and the report's interactive charts -----------------


def _fake_sweep(root):
    """4 completed pp jobs: m in {2, 4} x split in {[1], [3]}, with summaries and metrics.jsonl."""
    import yaml

    jobs = []
    for num, (m, split) in enumerate([(2, 1), (4, 1), (2, 3), (4, 3)]):
        folder = root / str(num)
        (folder / ".hydra").mkdir(parents=True)
        cfg = {
            "parallel": {"name": "pp"},
            "dp": {"size": 1},
            "tp": {"size": 1},
            "pp": {"size": 2, "micro_batches": m, "schedule": "1f1b", "split_points": [split]},
            "logger": {"wandb": {"mode": "offline", "project": "meshtrain", "group": "sweep-test"}},
        }
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
        overrides = [f"pp.micro_batches={m}", f"pp.split_points=[{split}]", "parallel=pp"]
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        tokens = 1000.0 * m + 10 * split
        summary = {
            "status": "completed",
            "tokens_per_s": tokens,
            "median_step_time_s": 0.05,
            "peak_memory_bytes_per_rank": [100 << 20, 80 << 20],
            "layout": {
                "strategy": "pp",
                "dp": 1,
                "tp": 1,
                "pp": 2,
                "rank_map": [{"rank": 0, "pp": 0}, {"rank": 1, "pp": 1}],
            },
            "pipeline": {"schedule": "1f1b", "micro_batches": m, "split_points": [split], "bubble_fraction": 0.5 / m},
        }
        (folder / "summary.json").write_text(json.dumps(summary))
        record = {"step": 1, "loss": 5.0, "tokens_per_s": tokens, "bubble_fraction": 0.5 / m, "bubble_theoretical": 0.2}
        (folder / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        segment = folder / "wandb" / f"offline-run-20260101_00000{num}-job{num}"
        segment.mkdir(parents=True)
        (segment / f"run-job{num}.wandb").write_bytes(b"")
        jobs.append((m, split, tokens))
    return jobs


@pytest.fixture(scope="module")
def reported_sweep(tmp_path_factory, wandb_service_polled_often):
    """The fake sweep reported twice with an offline W&B report run and the workspace: ``write_report``, then
    ``python -m trainer.report DIR --wandb offline --wandb-workspace`` (its main, in this process). Per report:
    the run folder it names, the sweep folder's own W&B runs after it and the run id kept in wandb_run.json."""
    from trainer.observe.wandb_read import segment_dirs
    from trainer.report.cli import main as report_main
    from trainer.report.cli import write_report

    root = tmp_path_factory.mktemp("sweep")
    _fake_sweep(root)
    reports = []
    for rerun in (False, True):
        if rerun:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert report_main([str(root), "--wandb", "offline", "--wandb-workspace"]) == 0
            named = [line.split(": ", 1)[1] for line in printed.getvalue().splitlines() if line.startswith("W&B sum")]
            wandb_dir = named[0]
        else:
            wandb_dir = write_report(root, wandb_mode="offline")["wandb_dir"]
        run_id = json.loads((root / "wandb_run.json").read_text())["id"]
        reports.append({"wandb_dir": Path(wandb_dir), "own": segment_dirs(root), "id": run_id})
    return root, reports


def test_sweep_workspace_spec(reported_sweep):
    tmp_path, reports = reported_sweep
    spec = json.loads((tmp_path / "wandb_workspace.json").read_text())
    assert spec["project"] == "meshtrain" and spec["displayName"].startswith("sweep-test")
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == ["Throughput", "Pipeline bubble", "Memory", "Loss", "Swept keys"]
    panels = {p["config"].get("chartTitle"): p for s in sections for p in s["panels"]}
    scatter = panels["tokens/s vs micro-batches (runs grouped by split)"]
    assert scatter["viewType"] == "Scatter Plot"
    assert scatter["config"]["xAxis"] == "config:pp.value.micro_batches"
    assert scatter["config"]["yAxis"] == "summary:tokens_per_s"
    bubble = panels["bubble and its parts per step"]["config"]
    assert bubble["xAxis"] == "train/step" and set(bubble["metrics"]) == {
        "pipeline/bubble_fraction",
        "pipeline/bubble_theoretical",
    }
    memory = panels["peak memory per pipeline rank (bytes)"]
    assert memory["viewType"] == "Bar Chart" and memory["config"]["metrics"] == [
        "summary_metrics.memory/peak_bytes_pp0",
        "summary_metrics.memory/peak_bytes_pp1",
    ]
    assert panels["training loss"]["config"]["metrics"] == ["train/loss"]
    coords = panels["swept keys -> tokens/s, peak memory"]
    assert coords["viewType"] == "Parallel Coordinates Plot"
    assert [c["accessor"] for c in coords["config"]["columns"]] == [
        "config:pp.value.micro_batches",
        "config:pp.value.split_points",
        "summary:tokens_per_s",
        "summary:peak_memory_bytes_max",
    ]
    # wandb leet <sweep>/wandb browses every job's run: relative links, not the sweep folder's own runs
    from trainer.observe.wandb_read import segment_dirs

    # (the run folders there: the jobs' links and the report's own run; W&B's debug logs are not runs)
    own = reports[-1]["own"]
    runs = sorted(p for p in (tmp_path / "wandb").iterdir() if "run-" in p.name and p.name != "latest-run")
    assert [p.name for p in runs] == [f"offline-run-20260101_00000{n}-job{n}" for n in range(4)] + [own[0].name]
    links = runs[:4]
    assert all(p.is_symlink() and (p / f"run-job{n}.wandb").exists() for n, p in enumerate(links))
    assert not runs[4].is_symlink() and segment_dirs(tmp_path) == own == [runs[4]]
    assert str(links[0].readlink()) == "../0/wandb/offline-run-20260101_000000-job0"
    runset = spec["spec"]["section"]["runSets"][0]
    assert runset["filters"]["filters"][0]["key"]["name"] == "group"
    assert runset["filters"]["filters"][0]["value"] == "sweep-test"
    assert runset["grouping"] == [{"section": "config", "name": "pp.value.split_points"}]


def test_a_rerun_of_the_report_replaces_its_wandb_run(reported_sweep):
    """Each ``trainer.report`` of one sweep: the same W&B run id (kept in the sweep's wandb_run.json; online the
    run is resumed) and one report run folder under <sweep>/wandb, not one more per rerun."""
    tmp_path, reports = reported_sweep
    for report in reports:
        assert [p.resolve() for p in report["own"]] == [report["wandb_dir"].resolve()]
        assert report["own"][0].name.endswith(f"-{report['id']}")
    assert reports[0]["id"] == reports[1]["id"]
    jobs_linked = sorted(p.name for p in (tmp_path / "wandb").glob("*run-*-job*") if p.is_symlink())
    assert jobs_linked == [f"offline-run-20260101_00000{n}-job{n}" for n in range(4)]


def test_report_charts_are_wandb_charts(tmp_path):
    from trainer.report.cli import interactive_charts
    from trainer.report.rows import build_rows
    from trainer.sweeps.jobs import read_sweep

    jobs = _fake_sweep(tmp_path)
    charts = interactive_charts(build_rows(read_sweep(tmp_path)))
    table = charts["charts/jobs"]
    assert [row[4] for row in table.data] == [t for _, _, t in jobs]
    line = charts["charts/tokens_per_s_vs_m"]
    rows = line.table.data  # (step, line key, value) per point
    assert sorted((r[1], r[0], r[2]) for r in rows) == sorted((f"split {s} 1f1b", m, t) for m, s, t in jobs)
    assert charts["charts/pareto"].table is table
    # the report run also logs the PNGs under sweep/<name>: the interactive charts must not take those keys
    assert not [k for k in charts if k.startswith("sweep/")]


def test_init_is_retried_while_the_run_id_is_in_use(monkeypatch):
    """A resumed or restarted rank 0 reuses the run id; W&B may still hold it for the process before: retried."""
    import pytest

    from trainer.observe import wandb_client
    from trainer.observe.wandb_client import WandbClient

    monkeypatch.setattr(wandb_client.time, "sleep", lambda s: None)
    answers = [RuntimeError("run ID abc is in use"), RuntimeError("run ID abc is in use"), "run"]

    def init():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert WandbClient._init_while_id_in_use(init, patience_s=60) == "run" and answers == []

    def broken():
        raise RuntimeError("permission denied")

    with pytest.raises(RuntimeError, match="permission denied"):
        WandbClient._init_while_id_in_use(broken, patience_s=60)
    with pytest.raises(RuntimeError, match="in use"):  # no patience left: the error stands
        WandbClient._init_while_id_in_use(lambda: (_ for _ in ()).throw(RuntimeError("id in use")), patience_s=0)


def test_a_client_starts_its_own_service_and_leaves_none_behind(tmp_path, monkeypatch, wandb_service_polled_often):
    """An inherited WANDB_SERVICE (the caller's Python wrote a report first) is not the run's service: one that
    outlives a killed rank 0 kept the run id in use for the elastic restart. After finish, no WANDB_SERVICE is left
    for processes started later from this one."""
    import logging
    import os
    import sys
    import threading

    from trainer.observe.wandb_client import WandbClient

    monkeypatch.setenv("WANDB_SERVICE", "2-99999-tcp-localhost-9")  # a service that is not there
    launch_before = "wandb.sdk.launch" in sys.modules
    client = WandbClient(mode="offline", project="p", run_dir=tmp_path, config={}, log=logging.getLogger("t"))
    client.log_metrics({"train/loss": 1.0}, step=1)
    assert client.ready() and client.error is None, client.error
    client.log_metrics({"train/loss": 0.5}, step=2)
    # what records nothing for an offline run is not started: W&B's telemetry export threads, W&B Launch's import
    assert not [t.name for t in threading.enumerate() if t.name.startswith("Otel")]
    assert launch_before or "wandb.sdk.launch" not in sys.modules
    client.finish()
    assert "WANDB_SERVICE" not in os.environ
    assert len(list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))) == 1


def test_staged_launch_inputs_are_still_applied(monkeypatch):
    """The client skips W&B Launch's import at init only while no launch input can have been staged (the module
    that stages them was never imported): once it is, W&B's own step runs as before."""
    import sys

    from wandb.sdk.wandb_run import Run

    from trainer.observe.wandb_client import _without_idle_work

    applied = []
    monkeypatch.setattr(Run, "_detect_and_apply_job_inputs", lambda run: applied.append(run))
    monkeypatch.delitem(sys.modules, "wandb.sdk.launch.inputs.internal", raising=False)
    _without_idle_work(None, mode="online")  # online: the process-wide settings are left as they are
    Run._detect_and_apply_job_inputs("unstaged")
    monkeypatch.setitem(sys.modules, "wandb.sdk.launch.inputs.internal", object())
    Run._detect_and_apply_job_inputs("staged")
    assert applied == ["staged"]


def test_a_w_and_b_that_stops_answering_does_not_hold_training(tmp_path, caplog, monkeypatch):
    """A W&B service that never answers (in the Slurm sweep test: killed by the job step's stop signal while it
    started) costs rank 0 at most ``answer_timeout_s`` per call, then W&B is off with a warning; a start that never
    ends, at most ``init_timeout`` + ``answer_timeout_s``, and a run that starts after that is not used."""
    import logging
    import threading
    import time
    from types import SimpleNamespace

    from trainer.observe.wandb_client import WandbClient

    log = logging.getLogger("t")
    never = threading.Event()
    client = WandbClient(mode="disabled", project="p", run_dir=tmp_path, config={}, log=log, answer_timeout_s=0.2)
    client.run = SimpleNamespace(id="r", log_artifact=lambda *a, **k: never.wait())  # a call W&B never answers
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="t"):
        client.log_checkpoint(tmp_path, step=4, loss=1.0, best=True)
    assert time.monotonic() - t0 < 5 and client.run is None and client.failed
    assert "while logging checkpoint 4 (TimeoutError: no answer within 0.2 s (logger.wandb.answer_timeout_s))" in (
        caplog.text
    )
    client.log_checkpoint(tmp_path, step=8, loss=0.5, best=True)  # off now: returns at once

    import wandb

    started = threading.Event()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: started.wait() and SimpleNamespace(id="late"))
    late = WandbClient(
        mode="online", project="p", run_dir=tmp_path, config={}, log=log, init_timeout=0.1, answer_timeout_s=0.1
    )
    late._start()
    init = late._thread
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="t"):
        assert not late.ready()
    assert time.monotonic() - t0 < 5 and late.failed
    assert "W&B did not start within 0.2 s (logger.wandb.init_timeout + logger.wandb.answer_timeout_s)" in caplog.text
    started.set()  # the start ends after all: its run is not taken up
    init.join(5)
    assert not init.is_alive() and late.run is None and not late.ready()
