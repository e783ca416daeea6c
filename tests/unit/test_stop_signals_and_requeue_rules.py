"""The pieces of Slurm requeue that need no cluster: which signals stop training, how a stop is classified,
how a flag set before training hands over, and how job states are read when sacct fails."""

from __future__ import annotations

import os
import signal

from trainer.launch.preemption import PreemptionFlag, stop_signals, warning_signals
from trainer.sweeps.slurm import quiet_watcher, stop_kind


def test_warning_signal_is_read_from_submitit_inside_a_submitit_job():
    from submitit.core.job_environment import JobEnvironment

    assert warning_signals({}) == (signal.SIGUSR1,)
    inside = warning_signals({"SUBMITIT_EXECUTOR": "slurm"})
    assert inside == (signal.SIGUSR1, getattr(signal, "SIG" + JobEnvironment.USR_SIG))
    # submitit's own override: the sbatch line and meshtrain's handler follow it
    assert warning_signals({"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "URG"})[-1] == signal.SIGURG
    assert stop_signals({})[0] == signal.SIGTERM


def test_sigterm_is_preemption_and_the_warning_alone_is_a_time_limit():
    assert stop_kind(["SIGUSR2"]) == "timeout"
    assert stop_kind(["SIGUSR2", "SIGTERM"]) == "preemption"
    assert stop_kind([]) == "preemption"  # nothing known: the stricter count does not apply


def test_a_signal_caught_before_training_is_handed_to_the_training_flag():
    early = PreemptionFlag(grace_s=None).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert early.requested and early._watchdog is None  # no watchdog before the loop exists
        flag = PreemptionFlag(grace_s=5.0).install()
        try:
            assert flag.requested and flag.received == ["SIGUSR1"]
        finally:
            flag.uninstall()
    finally:
        early.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_job_states_come_from_squeue_when_sacct_fails(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nprintf '41_0|COMPLETED\\n41_1|RUNNING\\n'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    watcher = quiet_watcher()
    watcher.register_job("41_0")
    watcher.register_job("41_1")
    assert watcher.get_state("41_0", mode="force") == "COMPLETED"
    assert watcher.get_state("41_1", mode="force") == "RUNNING"
    assert watcher.is_done("41_0", mode="cache") and not watcher.is_done("41_1", mode="cache")
    assert watcher.sacct_failures >= 1 and watcher.sacct_error == "Slurm accounting storage is disabled"


def test_a_slurm_task_count_that_does_not_match_the_layout_names_the_launcher_keys(compose_cfg):
    import pytest

    from trainer.validate import ConfigError, validate

    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1"}
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg("parallel=ddp", "dp.size=4"), environ=env)
    message = str(err.value)
    assert "slurm started 2 tasks (1 node(s) x 2) but dp.size=4 x tp.size=1 x pp.size=1 = 4 ranks" in message
    assert "hydra.launcher.nodes x hydra.launcher.tasks_per_node (SLURM_NTASKS) to 4" in message
    assert "parallel=ddp dp.size=2" in message and "topology.nproc_per_node" not in message
