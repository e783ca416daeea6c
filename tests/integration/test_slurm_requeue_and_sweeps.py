"""Sweeps on a real Slurm (the one-node cluster of benchmarks/slurm_cluster.py), through hydra/launcher=slurm.

Time limits are not waited for: the warning is sent early with ``scancel --signal=<submitit's signal>``,
which is what Slurm sends at ``--signal=USR2@signal_delay_s`` (and what submitit's own test helper sends).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import FAST, ROOT, run_train
from trainer.sweeps.jobs import read_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 30
# the same job on Slurm and locally: DDP on 2 ranks, GPT on the text corpus, fp32
JOB = ("parallel=ddp", f"trainer.max_steps={STEPS}", *FAST)
SLURM = ("hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.tasks_per_node=2")


def _losses(job_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def _start_sweep(cluster, sweep_dir: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    env = {**os.environ, **cluster.env, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir.parent / "console.txt", "w") as console:  # a file, not a pipe nobody drains meanwhile
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT, text=True)
    proc.console = sweep_dir.parent / "console.txt"
    return proc


def _signal_when_training(
    cluster, proc: subprocess.Popen, job_dir: Path, signal_name: str, *, task: str = "", after_steps: int = 3
) -> str:
    """Send ``signal_name`` to the job's tasks once it has logged ``after_steps`` steps; returns the job id.
    ``task``: the array index (``_0``) when the sweep has several jobs."""
    deadline = time.monotonic() + 300
    metrics = job_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended before training:\n{proc.console.read_text()[-4000:]}")
        if metrics.exists() and len(metrics.read_text().splitlines()) >= after_steps:
            running = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i").stdout.split()
            (job_id,) = [j for j in running if j.endswith(task)]
            cluster.run("scancel", f"--signal={signal_name}", job_id)
            return job_id
        time.sleep(0.2)
    raise AssertionError("the job did not start training within 300 s")


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    proc.wait(timeout=timeout)
    out = proc.console.read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def slurm_sweep(slurm_cluster, tmp_path_factory):
    """2 jobs (seeds 1, 2), each a Slurm job with 2 tasks as the 2 DDP ranks. Job 0 gets the time-limit
    warning (submitit's signal, as Slurm sends it at ``--signal=USR2@signal_delay_s``) after 3 steps."""
    from submitit.core.job_environment import JobEnvironment

    sweep_dir = tmp_path_factory.mktemp("slurm_sweep") / "sweep"
    proc = _start_sweep(slurm_cluster, sweep_dir, *JOB, *SLURM, "trainer.seed=1,2", "hydra.launcher.timeout_min=10")
    job_id = _signal_when_training(slurm_cluster, proc, sweep_dir / "0", JobEnvironment.USR_SIG, task="_0")
    return _finish(proc), sweep_dir, job_id


def test_two_job_sweep_with_two_tasks_per_job_matches_the_local_runs(slurm_sweep, tmp_path):
    out, sweep_dir, _ = slurm_sweep
    assert "2 jobs: 2 completed, 0 skipped, 0 failed" in out
    # submitit warned at every sacct poll on a cluster without accounting: now one summary line at most
    assert "Bypassing sacct error" not in out and out.count("accounting storage is disabled") <= 1
    local = run_train(*JOB, "trainer.seed=1,2", run_dir=tmp_path / "local", multirun=True)
    assert "2 jobs: 2 completed" in local.output
    for job in read_sweep(sweep_dir):
        assert job.summary["layout"]["world_size"] == 2
        rank_logs = sorted(p.name for p in (job.path / "logs").glob("rank*.log"))
        assert rank_logs == ["rank0.log", "rank1.log"], rank_logs  # two Slurm tasks, one rank each
        # bitwise: same ranks, same gloo; job 0 was stopped, requeued and resumed on the way
        losses = _losses(job.path)
        assert sorted(losses) == list(range(1, STEPS + 1))
        assert losses == _losses(tmp_path / "local" / str(job.num))


def test_time_limit_warning_checkpoints_requeues_and_resumes_to_the_uninterrupted_loss(slurm_sweep):
    from submitit.core.job_environment import JobEnvironment

    out, sweep_dir, job_id = slurm_sweep
    warning = "SIG" + JobEnvironment.USR_SIG  # the signal submitit asks Slurm for (--signal=USR2@...)
    job_dir = sweep_dir / "0"
    (requeue,) = json.loads((job_dir / "requeues.json").read_text())
    assert requeue["kind"] == "timeout" and requeue["signals"] == [warning]
    assert requeue["slurm_job_id"] == job_id and requeue["timeout_requeues_left"] == 2
    stopped = requeue["stopped_at_step"]
    assert 3 <= stopped < STEPS and requeue["checkpoint_step"] == stopped
    assert (job_dir / "checkpoints" / f"step_{stopped:07d}").is_dir()
    assert f"job 0 completed after 1 requeue(s): timeout at step {stopped}" in out
    rank0 = (job_dir / "logs" / "rank0.log").read_text()
    assert f"preempted ({warning}): checkpoint saved at step {stopped}" in rank0
    assert f"continuing at step {stopped + 1} of {STEPS}" in rank0
    assert "UncompletedJobError" not in out + rank0 and "Connection closed" not in rank0

    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["start_step"] == stopped
    uninterrupted = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert uninterrupted["start_step"] == 0 and not (sweep_dir / "1" / "requeues.json").exists()
    # the final loss against the uninterrupted local run: compared step by step in the test above
    assert summary["final_loss"] == _losses(job_dir)[STEPS]


def test_sigterm_saves_a_checkpoint_and_a_rank_mismatch_is_refused_before_training(slurm_cluster, tmp_path):
    """Job 0 gets SIGTERM (scancel, preemption) with no requeue allowed: checkpoint, status preempted.
    Job 1 asks for 4 ranks from a 2-task Slurm job: refused with the fix, no worker trains."""
    sweep_dir = tmp_path / "term"
    proc = _start_sweep(slurm_cluster, sweep_dir, *JOB, *SLURM, "hydra.launcher.max_num_preemption=0", "dp.size=2,4")
    _signal_when_training(slurm_cluster, proc, sweep_dir / "0", "TERM")
    out = _finish(proc)
    assert "2 jobs: 0 completed, 1 skipped, 0 failed, 1 preempted" in out
    counts = json.loads((sweep_dir / "sweep_status.json").read_text())["counts"]
    assert counts["preempted"] == 1 and counts["failed"] == 0

    stopped, refused = read_sweep(sweep_dir)
    assert stopped.status == "preempted" and "SIGTERM" in stopped.reason
    assert "not requeued" in stopped.reason and "hydra.launcher.max_num_preemption=0" in stopped.reason
    step = stopped.summary["last_step"]
    assert 3 <= step < STEPS and (stopped.path / "checkpoints" / f"step_{step:07d}").is_dir()
    assert stopped.summary["stop_signals"] == ["SIGTERM"]
    assert not (stopped.path / "requeues.json").exists()

    assert refused.status == "skipped"
    assert "slurm started 2 tasks" in refused.reason and "= 4 ranks" in refused.reason
    assert "hydra.launcher.nodes x hydra.launcher.tasks_per_node" in refused.reason
    assert not (refused.path / "logs").exists(), "a refused job must not start training"
