"""Launch paths: torchrun, multirun, a worker failing mid-run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.faults import FailAt, inject
from tests.helpers import FAST, PARITY_STEPS, ROOT, assert_losses_close, exit_times, run_train
from trainer.observe.wandb_read import read_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """``torchrun --nproc_per_node=2 train.py``, 6 steps, run once for the module: its run folder (named by the
    time it started, as ``${mt_stamp:...}`` in hydra.run.dir gives each rank if they disagree)."""
    tmp_path = tmp_path_factory.mktemp("torchrun")
    out = tmp_path / "outputs"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    cmd = [
        torchrun,
        "--nproc_per_node=2",
        str(ROOT / "train.py"),
        *FAST,
        "trainer.max_steps=6",
        f"hydra.run.dir={out}/${{mt_stamp:%H-%M-%S}}",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "WANDB_SILENT": "true"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_torchrun_gives_one_output_folder(torchrun_job):
    folders = list(torchrun_job.iterdir())
    assert len(folders) == 1, f"one folder per rank: {folders}"
    d = folders[0]
    assert (d / "logs" / "rank0.log").exists() and (d / "logs" / "rank1.log").exists()
    for rank in (0, 1):  # workers torchrun started keep the host memory they free too (trainer/launch/host_memory.py)
        assert "host memory: freed blocks under 32 MiB are kept" in (d / "logs" / f"rank{rank}.log").read_text()
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6, "metrics written by more than one rank"


def test_torchrun_matches_builtin_launcher(tmp_path, torchrun_job):
    """The built-in launcher here spawns its workers (the start method CUDA runs use; CPU runs fork), with glibc's
    own malloc thresholds: the losses do not depend on where freed memory goes."""
    builtin = run_train(
        *FAST,
        "trainer.max_steps=6",
        "topology.start_method=spawn",
        "topology.reuse_host_memory=false",
        run_dir=tmp_path / "builtin",
    )
    log = (tmp_path / "builtin" / "logs" / "rank0.log").read_text()
    assert "started: spawn" in log and "host memory:" not in log
    import json

    (folder,) = torchrun_job.iterdir()
    losses = [json.loads(x)["loss"] for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert_losses_close(losses, builtin.losses(), rel=1e-6)


def test_multirun_two_jobs_isolated(tmp_path):
    sweep = tmp_path / "sweep"
    run = run_train(
        "trainer.seed=1,2",
        "data.seq_len=32",
        "data.global_batch_size=8",
        "trainer.max_steps=4",
        "trainer.log_every=1",
        run_dir=sweep,
        multirun=True,
    )
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1"]
    runs = [read_run(j) for j in jobs]
    assert runs[0].run_id != runs[1].run_id
    assert runs[0].group == runs[1].group and runs[0].group.startswith("sweep-")
    assert [r.config["trainer"]["seed"] for r in runs] == [1, 2]
    first = [(j / "metrics.jsonl").read_text().splitlines()[0] for j in jobs]
    assert first[0] != first[1], "different seeds gave identical first steps"
    assert run.proc.stdout.count("done: loss") == 2


def test_worker_failure_ends_job_with_its_error(tmp_path):
    run = run_train(
        *FAST,
        "trainer.max_steps=50",
        inject(FailAt, step=3, rank=1),
        run_dir=tmp_path / "run",
        expect_ok=False,
        timeout=120,
    )
    assert run.proc.returncode == 1
    assert "worker rank 1 failed" in run.proc.stderr
    assert "injected failure at step 3 on rank 1" in run.proc.stderr
    # timed from the run's own exit records: rank 0, blocked in a collective, leaves right after rank 1 fails
    left = exit_times(run.run_dir)
    assert set(left) == {0, 1} and left[0] - left[1] < 30, left
    assert "Traceback" in (run.run_dir / "logs" / "rank1.log").read_text()
    assert len(run.metrics()) == 2, "steps before the failure stay logged"


def test_two_nodes_on_localhost_join_one_rendezvous(tmp_path, reference):
    """topology=multi_node: two launcher processes ("nodes") with one worker each form one job, with the losses of
    the session's parallel=single reference of the parity modules (the same run length)."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"  # one folder for both: checkpoints need a shared filesystem
    common = [
        sys.executable,
        str(ROOT / "train.py"),
        "topology=multi_node",
        "topology.nnodes=2",
        "topology.nproc_per_node=1",
        f"topology.master_port={port}",
        *FAST,
        *PARITY_STEPS,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "WANDB_SILENT": "true"}
    nodes = [
        subprocess.Popen(
            [*common, f"topology.node_rank={k}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(r["rank"], r["node"]) for r in summary["layout"]["rank_map"]] == [(0, 0), (1, 1)]
    losses = [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert_losses_close(losses, reference(*FAST, *PARITY_STEPS).losses(), rel=1e-4)
    from trainer.checkpoint.files import read_marker

    steps = summary["last_step"]
    assert read_marker(run_dir / "checkpoints" / f"step_{steps:07d}")["world_size"] == 2
