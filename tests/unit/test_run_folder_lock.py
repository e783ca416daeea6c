"""One owner per run folder (trainer/launch/ownership.py), in-process and with a helper process holding the
lock: a held folder is refused naming its holder; a holder killed outright leaves no stale lock; one process
may take its own folder again; only rank 0 / node 0 takes it. (The refusal of a whole second train.py job:
tests/integration/test_run_folder_ownership.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT
from trainer.launch.ownership import LOCK_FILE, FolderBusy, hold, owns_folders, read_holder, release


def holder_process(folder) -> subprocess.Popen:
    """Another process that takes ``folder`` and keeps it until killed."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from trainer.launch.ownership import hold
        hold({str(folder)!r}, fix="hydra.run.dir")
        print("held", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_folder_is_refused_naming_its_holder_and_freed_when_it_is_killed(tmp_path):
    folder = tmp_path / "run"
    other = holder_process(folder)
    try:
        with pytest.raises(FolderBusy) as err:
            hold(folder, fix="hydra.run.dir")
        message = str(err.value)
        assert f"pid {other.pid} on host {socket.gethostname()}, started " in message
        assert f"kill {other.pid}" in message and "hydra.run.dir=<another folder>" in message
        assert read_holder(folder)["pid"] == other.pid
    finally:
        other.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the lock with the process
        other.wait()
    hold(folder, fix="hydra.run.dir")
    try:
        assert read_holder(folder)["pid"] == os.getpid()  # the holder's record is rewritten, not stale
    finally:
        release(folder)
    assert (folder / LOCK_FILE).exists()  # the file stays; the lock does not


def test_hold_is_reentrant_and_the_last_release_frees_the_folder(tmp_path):
    folder = tmp_path / "run"
    hold(folder, fix="hydra.run.dir")
    hold(folder / ".", fix="hydra.run.dir")  # the callback, then the task: one process, one lock
    release(folder)
    code = f"from trainer.launch.ownership import hold; hold({str(folder)!r}, fix='x')"
    still = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert still.returncode != 0 and "FolderBusy" in still.stderr and f"pid {os.getpid()}" in still.stderr
    release(folder)
    free = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert free.returncode == 0, free.stderr


def test_only_global_rank_0_or_node_0_owns_the_folder():
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    assert not owns_folders(node_rank=0, environ=torchrun)
    assert owns_folders(node_rank=0, environ={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    srun = {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}
    assert not owns_folders(node_rank=0, environ=srun)
    assert owns_folders(node_rank=0, environ={**srun, "SLURM_PROCID": "0"})
    assert owns_folders(node_rank=0, environ={}) and not owns_folders(node_rank=1, environ={})
