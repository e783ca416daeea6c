"""Sweeps on a real Slurm (the one-node cluster of benchmarks/slurm_cluster.py), through hydra/launcher=slurm.

One sweep of 4 Slurm jobs with 2 tasks each (seeds 1, 2 x dp.size 2, 4) serves every test, next to the same
jobs run locally (the Slurm ones also log to W&B, offline): job 0 gets the time-limit warning and is
requeued, job 2 gets SIGTERM and may not be requeued (max_num_preemption=0), jobs 1 and 3 ask for 4 ranks
from 2 tasks. Time limits are not waited for: the warning is sent with ``scancel --signal=<submitit's signal>``,
which is what Slurm sends at ``--signal=USR2@signal_delay_s`` (and what submitit's own test helper sends). The
Slurm jobs hold before step 4 until a signal arrives (``WAIT``: tests/faults.py's ``WaitAt``), so the signal lands at a point
the job waits for, never raced against its last steps. The last test lets slurmctld send the warning itself
(``--signal=USR2@120``) to a job that holds before step 4 until it comes: once the job waits there, the test shortens
its time limit (``scontrol update TimeLimit=``, as an admin does) so that slurmctld's next periodic check (every 30 s)
finds the warning due, with a minute left before the limit; the real time-limit path is tested at a point the job
waits for too, without waiting out a whole-minute limit from the job's start.
Every cluster hands out its own block of job ids (benchmarks/slurm_cluster.py ``first_job_id``): a job's rendezvous
port comes from its id, and two clusters that both started at job 1 (a suite beside a rerun of this module) gave
their jobs the same port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults import WaitAt, inject
from tests.helpers import FAST, ROOT, run_train
from trainer.observe.wandb_read import read_run
from trainer.sweeps.jobs import read_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 10
# the same job on Slurm and locally: DDP on 2 ranks, GPT on the text corpus, fp32
JOB = ("parallel=ddp", f"trainer.max_steps={STEPS}", *FAST)
WANDB = tuple(o for o in JOB if not o.startswith("logger=")) + ("logger=wandb",)
SLURM = ("hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.tasks_per_node=2")
#: the signalled jobs hold here until their signal comes (jobs that get none go on after 600 s)
WAIT = inject(WaitAt, step=4)


def _losses(job_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows}


def _start(cluster, out_dir: Path, *overrides: str) -> subprocess.Popen:
    """``python train.py -m OVERRIDES`` in the background, console to ``<out_dir>.txt``."""
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *overrides, f"hydra.sweep.dir={out_dir}"]
    # the jobs import tests.faults (WAIT) wherever Slurm starts them: the checkout on their path
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **cluster.env, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    console = out_dir.with_suffix(".txt")
    with open(console, "w") as f:  # a file, not a pipe nobody drains meanwhile
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    proc.console = console
    return proc


def _when_training(cluster, proc: subprocess.Popen, job_dir: Path, task: str) -> str:
    """The Slurm job id of array task ``task`` (``""``: the cluster's only running job, a sweep of one job is no
    array) once it has logged 3 steps (it then holds before step 4 until a signal comes: ``WAIT``)."""
    deadline = time.monotonic() + 400
    metrics = job_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the sweep ended before job {job_dir.name} trained:\n{proc.console.read_text()[-4000:]}"
            )
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            running = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i").stdout.split()
            (job_id,) = [j for j in running if j.endswith(task)]
            return job_id
        time.sleep(0.2)
    raise AssertionError(f"job {job_dir.name} did not start training within 400 s")


def _signal_when_training(cluster, proc: subprocess.Popen, job_dir: Path, signal_name: str, task: str) -> str:
    """Send ``signal_name`` to array task ``task`` once it holds before step 4; returns its Slurm job id."""
    job_id = _when_training(cluster, proc, job_dir, task)
    # to the job's step, as Slurm's --signal=USR2@... does (Slurm 22.05 refuses to signal an array
    # task as a job while the array's other tasks pend: "Job can not be altered now")
    cluster.run("scancel", f"--signal={signal_name}", f"{job_id}.0")
    return job_id


def _seconds_run(cluster, job_id: str) -> int:
    """How long the job has run, from squeue's ``%M`` (``[days-][hours:]minutes:seconds``)."""
    used = cluster.run("squeue", "-h", "-j", job_id, "-o", "%M").stdout.strip()
    days, _, clock = used.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + 86400 * int(days or 0)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    proc.wait(timeout=timeout)
    out = proc.console.read_text()
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def sweeps(slurm_cluster, tmp_path_factory):
    from submitit.core.job_environment import JobEnvironment

    root = tmp_path_factory.mktemp("slurm_sweeps")
    slurm = _start(
        slurm_cluster,
        root / "slurm",
        *WANDB,
        *SLURM,
        WAIT,
        "trainer.seed=1,2",
        "dp.size=2,4",
        "hydra.launcher.timeout_min=10",
        "hydra.launcher.max_num_preemption=0",
    )
    try:
        ids = {0: _signal_when_training(slurm_cluster, slurm, root / "slurm" / "0", JobEnvironment.USR_SIG, "_0")}
        # the local reference runs meanwhile (forked from the warm runner): it fills the Slurm sweep's idle seconds
        # (job 0's requeue hold, job 2's start); job 2 holds before step 4 until its signal comes, however late
        run_train(*JOB, "trainer.seed=1,2", run_dir=root / "local", multirun=True)
        ids[2] = _signal_when_training(slurm_cluster, slurm, root / "slurm" / "2", "TERM", "_2")
        yield {"out": _finish(slurm), "dir": root / "slurm", "ids": ids, "local": root / "local"}
    finally:
        if slurm.poll() is None:  # a failed wait must not leave a sweep running
            os.killpg(slurm.pid, signal.SIGKILL)  # the sweep and the workers it started
            slurm.wait()


def test_slurm_jobs_with_two_tasks_each_train_the_local_runs_losses(sweeps):
    out = sweeps["out"]
    assert "4 jobs: 1 completed, 2 skipped, 0 failed, 1 preempted" in out
    counts = json.loads((sweeps["dir"] / "sweep_status.json").read_text())["counts"]
    assert counts == {"completed": 1, "skipped": 2, "failed": 0, "preempted": 1}
    # submitit warned at every sacct poll on a cluster without accounting: now one summary line at most
    assert "Bypassing sacct error" not in out and out.count("accounting storage is disabled") <= 1
    jobs = {j.num: j for j in read_sweep(sweeps["dir"])}
    for num, seed_job in ((0, 0), (2, 1)):  # local multirun: job 0 = seed 1, job 1 = seed 2
        job = jobs[num]
        assert job.summary["layout"]["world_size"] == 2
        rank_logs = sorted(p.name for p in (job.path / "logs").glob("rank*.log"))
        assert rank_logs == ["rank0.log", "rank1.log"], rank_logs  # two Slurm tasks, one rank each
        local = _losses(sweeps["local"] / str(seed_job))
        assert sorted(local) == list(range(1, STEPS + 1))
        losses = _losses(job.path)
        # bitwise: same ranks, same gloo; job 0 was stopped, requeued and resumed on the way, job 2 stopped
        assert losses == {step: local[step] for step in losses}
    assert sorted(_losses(jobs[0].path)) == list(range(1, STEPS + 1))


def test_time_limit_warning_checkpoints_requeues_and_resumes_to_the_uninterrupted_loss(sweeps):
    from submitit.core.job_environment import JobEnvironment

    out, job_dir = sweeps["out"], sweeps["dir"] / "0"
    warning = "SIG" + JobEnvironment.USR_SIG  # the signal submitit asks Slurm for (--signal=USR2@...)
    rank0_log = job_dir / "logs" / "rank0.log"
    rank0 = rank0_log.read_text() if rank0_log.exists() else "(no rank0.log)"
    # what a failure shows: the ends of the sweep's console and of the requeued job's rank-0 log
    seen = f"\n--- sweep console (end) ---\n{out[-3000:]}\n--- job 0 rank0.log (end) ---\n{rank0[-3000:]}"
    assert (job_dir / "requeues.json").is_file(), seen
    (requeue,) = json.loads((job_dir / "requeues.json").read_text())
    assert requeue["kind"] == "timeout" and requeue["signals"] == [warning], (requeue, seen)
    assert requeue["slurm_job_id"] == sweeps["ids"][0] and requeue["timeout_requeues_left"] == 2, (requeue, seen)
    stopped = requeue["stopped_at_step"]
    # the step the job held before (WAIT)
    assert stopped == 4 and requeue["checkpoint_step"] == stopped, (requeue, seen)
    assert (job_dir / "checkpoints" / f"step_{stopped:07d}").is_dir(), seen
    assert f"job 0 completed after 1 requeue(s): timeout at step {stopped}" in out, seen
    assert f"preempted ({warning}): checkpoint saved at step {stopped}" in rank0, seen
    assert f"continuing at step {stopped + 1} of {STEPS}" in rank0, seen
    assert "UncompletedJobError" not in out + rank0 and "Connection closed" not in rank0, seen

    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["start_step"] == stopped, (summary, seen)
    uninterrupted = _losses(sweeps["local"] / "0")
    assert summary["final_loss"] == uninterrupted[STEPS], seen  # bitwise (fp32 resume is exact)

    # the requeued job continued the same W&B run: two offline segments (before and after the requeue) with
    # one run id, whose history has every step once with the loss metrics.jsonl has
    wb = read_run(job_dir)
    ident = json.loads((job_dir / "wandb_run.json").read_text())
    assert len(wb.segments) == 2 and wb.run_ids == [ident["id"]] * 2, (wb.run_ids, seen)
    assert wb.steps() == list(range(1, STEPS + 1))
    losses = _losses(job_dir)
    assert {r["train/step"]: r["train/loss"] for r in wb.history} == pytest.approx(losses, rel=1e-6)


def test_sigterm_saves_a_checkpoint_and_ends_preempted_when_no_requeue_is_left(sweeps):
    job = {j.num: j for j in read_sweep(sweeps["dir"])}[2]
    assert job.status == "preempted" and "SIGTERM" in job.reason
    assert "not requeued" in job.reason and "hydra.launcher.max_num_preemption=0" in job.reason
    step = job.summary["last_step"]
    assert step == 4 and (job.path / "checkpoints" / f"step_{step:07d}").is_dir()
    assert job.summary["stop_signals"] == ["SIGTERM"]
    assert not (job.path / "requeues.json").exists()
    assert f"job 2 preempted: preemption (SIGTERM) at step {step}" in sweeps["out"]


def test_a_job_whose_task_count_does_not_match_the_layout_is_refused_before_training(sweeps):
    jobs = {j.num: j for j in read_sweep(sweeps["dir"])}
    for num in (1, 3):
        job = jobs[num]
        assert job.status == "skipped" and job.config["dp"]["size"] == 4
        assert "slurm started 2 tasks" in job.reason and "= 4 ranks" in job.reason
        assert "hydra.launcher.nodes x hydra.launcher.tasks_per_node" in job.reason
        assert not (job.path / "logs").exists(), "a refused job must not start training"


def test_slurmctlds_own_time_limit_warning_stops_the_job_where_it_waits(slurm_cluster, tmp_path):
    """The real path: a one-task job (``--signal=USR2@120``, a 10-minute limit) holds before step 4; the test then
    shortens its limit to the whole minutes that leave it 90 to 150 s, so slurmctld's next periodic check (30 s
    apart; it warns when the limit is within the signal's lead plus 30 s) sends the warning itself, a minute or
    more before the limit. The job checkpoints there and ends preempted (max_num_timeout=0: no requeue)."""
    from submitit.core.job_environment import JobEnvironment

    lead_s = 120
    one_task = tuple(o for o in SLURM if not o.startswith("hydra.launcher.tasks_per_node="))
    limit = (
        *one_task,
        "hydra.launcher.tasks_per_node=1",
        "hydra.launcher.timeout_min=10",
        f"hydra.launcher.signal_delay_s={lead_s}",
    )
    proc = _start(
        slurm_cluster,
        tmp_path / "limit",
        "parallel=single",
        f"trainer.max_steps={STEPS}",
        *FAST,
        *limit,
        WAIT,
        "hydra.launcher.max_num_timeout=0",
    )
    try:
        job_id = _when_training(slurm_cluster, proc, tmp_path / "limit" / "0", "")
        # the limit 90 to 150 s past now: the warning is due at once (limit <= run + lead + 30 s) and the next
        # check (at most 30 s away) leaves the job at least 60 s to save its checkpoint and end
        minutes = -(-(_seconds_run(slurm_cluster, job_id) + 90) // 60)
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}")
        proc.wait(timeout=600)  # no job completed: the sweep's exit code is not 0 (a preempted job is not done)
        out = proc.console.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (job,) = read_sweep(tmp_path / "limit")
    seen = f"\n--- sweep console (end) ---\n{out[-3000:]}"
    assert "1 jobs: 0 completed, 0 skipped, 0 failed, 1 preempted" in out, seen
    assert job.status == "preempted", (job.status, job.reason, seen)
    assert job.summary["stop_signals"] == ["SIG" + JobEnvironment.USR_SIG] and job.summary["last_step"] == 4, seen
    assert (job.path / "checkpoints" / "step_0000004").is_dir(), seen
    assert "not requeued" in job.reason and "hydra.launcher.max_num_timeout=0" in job.reason, (job.reason, seen)
