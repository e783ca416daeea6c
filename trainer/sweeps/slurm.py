"""hydra-submitit-launcher's Slurm launcher, with what a training job needs on a real cluster.

``conf/hydra/launcher/slurm.yaml`` selects it (``_target_:
hydra_plugins.meshtrain_launcher.meshtrain_launcher.SlurmLauncher``: Hydra takes launchers only from its
``hydra_plugins`` package, so a one-line subclass lives there). Over the plugin's launcher it adds:

- **Checkpoint, then requeue.** A time-limit warning (submitit's signal, ``--signal=USR2@signal_delay_s``)
  or a SIGTERM (``scancel``, preemption) reaches meshtrain's handler in every training rank
  (trainer/launch/preemption.py), not submitit's; the ranks agree at the next step boundary, save a
  checkpoint and stop. Then task 0 requeues the job the way submitit does (``scontrol requeue`` of this
  very job, with the pickled call rewritten), unless the limit is reached: ``max_num_timeout`` for
  time limits (submitit's key), ``max_num_preemption`` for SIGTERM (meshtrain's). The requeued job runs
  the same call, so it lands in the same job folder, where ``trainer.resume=auto`` continues from the
  checkpoint and W&B logs from the same folder (and run id, where the folder keeps one). Each requeue is recorded in ``<job>/requeues.json``.
- **One sweep folder.** The sweep folder is resolved once, in the submitting process, and handed to
  the jobs: ``${mt_stamp:}`` evaluated inside a job (or a requeued one) would name another folder.
- **Quiet job states.** submitit polls ``sacct``; on a cluster without accounting every poll printed a
  warning. Here a failing ``sacct`` is reported once and ``squeue`` gives the states instead.
- **A job that dies outside the task** (killed, node lost) ends as a failed job of the sweep, with
  submitit's error in its ``status.json``, instead of ending the sweep.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from omegaconf import OmegaConf, open_dict

from trainer.launch.preemption import PreemptionFlag
from trainer.observe.durable import read_json, write_json

log = logging.getLogger("meshtrain.slurm")

REQUEUES_FILE = "requeues.json"
#: signals that mean "preempted or cancelled"; any other stop signal is a time-limit warning
PREEMPTION_SIGNALS = ("SIGTERM",)


def _read_json(path: Path, default: dict | list) -> Any:
    """One of the job's own files, ``default`` when missing or of another shape; a torn one gives its whole
    members (trainer/observe/durable.py)."""
    value = read_json(path, default=default)
    return value if isinstance(value, type(default)) else default


def stop_kind(signals: Sequence[str]) -> str:
    """``preemption`` (SIGTERM, or nothing known) or ``timeout`` (only the time-limit warning signal)."""
    return "timeout" if signals and not any(s in PREEMPTION_SIGNALS for s in signals) else "preemption"


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def requeue(job_id: str) -> None:
    """``scontrol requeue JOB`` of the job this process runs in, as submitit's ``JobEnvironment._requeue`` runs it, with
    SIGTERM ignored in scontrol (kept across its exec): Slurm signals every process of the job it requeues, scontrol
    included, and one killed before it exited (seen under load: 'died with <Signals.SIGTERM: 15>') read as a failed
    requeue of a job that Slurm had requeued."""
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60, preexec_fn=_ignore_sigterm)


class RequeueingSlurmLauncher(plugin.SlurmLauncher):
    def __init__(self, **params: Any) -> None:
        self.max_num_preemption = int(params.pop("max_num_preemption", 3))
        super().__init__(**params)
        self.sweep_dir: str | None = None

    # ---- inside the job (every Slurm task runs this) -------------------------------------------

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        env = submitit.JobEnvironment()
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = env.job_id
            sweep_config.hydra.job.num = job_num
            if self.sweep_dir is not None:
                sweep_config.hydra.sweep.dir = self.sweep_dir
        started = time.time()
        # from here on a stop signal is meshtrain's, even before the training's own flag is installed
        early = PreemptionFlag(grace_s=None).install()
        try:
            ret = run_job(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=sweep_config,
                job_dir_key=job_dir_key,
                job_subdir_key="hydra.sweep.subdir",
            )
        finally:
            early.uninstall()
        if env.global_rank == 0 and ret.hydra_cfg is not None:
            run_dir = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))
            args = (sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
            if self._requeue_if_stopped(run_dir, env, args, since=started):
                # as submitit's own requeue does: no result file, so the waiting launcher keeps waiting
                sys.exit(-1)
        return ret

    def _requeue_if_stopped(self, run_dir: Path, env: Any, args: tuple, *, since: float) -> bool:
        from submitit.core import utils as submitit_utils

        from trainer.checkpoint.files import checkpoints_root, complete_checkpoints

        status_file = run_dir / "status.json"
        # only this attempt's outcome counts: a requeued job that completes leaves the first one's file behind
        if not status_file.exists() or status_file.stat().st_mtime < since - 1:
            return False
        status = _read_json(status_file, {})
        if status.get("status") != "preempted":
            return False
        summary = _read_json(run_dir / "summary.json", {})
        signals = list(summary.get("stop_signals") or [])
        kind = stop_kind(signals)
        history = [r for r in _read_json(run_dir / REQUEUES_FILE, []) if isinstance(r, dict)]
        used = {k: sum(1 for r in history if r.get("kind") == k) for k in ("timeout", "preemption")}
        limits = {"timeout": int(self.params.get("max_num_timeout", 0)), "preemption": self.max_num_preemption}
        found = complete_checkpoints(checkpoints_root(run_dir))
        what = f"{kind} ({', '.join(signals) or 'signal unknown'}) at step {summary.get('last_step', '?')}"
        if not found:
            status["reason"] = f"{what}: not requeued, no checkpoint was written. {status.get('reason', '')}"
        elif used[kind] >= limits[kind]:
            status["reason"] = (
                f"{what}: not requeued, {used[kind]} {kind} requeue(s) already "
                f"(hydra.launcher.max_num_{kind}={limits[kind]}). {status.get('reason', '')}"
            )
        if not found or used[kind] >= limits[kind]:
            write_json(run_dir / "status.json", status)
            log.warning("job %s %s", env.job_id, status["reason"])
            return False
        used[kind] += 1
        record = {
            "kind": kind,
            "signals": signals,
            "stopped_at_step": summary.get("last_step"),
            "checkpoint_step": found[-1][0],
            "slurm_job_id": env.job_id,
            "requeued_unix": time.time(),
            f"{kind}_requeues_left": limits[kind] - used[kind],
        }
        write_json(run_dir / REQUEUES_FILE, [*history, record])
        status["reason"] = (
            f"{what}: checkpoint step {found[-1][0]} saved, requeued ({kind} {used[kind]} of {limits[kind]}); "
            "the requeued job resumes from it"
        )
        write_json(run_dir / "status.json", status)
        # submitit's own checkpoint/requeue, done at a step boundary instead of inside the signal handler
        timeouts_left = limits["timeout"] - used["timeout"]
        delayed = self.checkpoint(*args)
        delayed.set_timeout(int(self.params.get("timeout_min", 60)), timeouts_left)
        with submitit_utils.temporary_save_path(env.paths.submitted_pickle) as tmp:
            delayed.dump(tmp)
        try:
            requeue(env.job_id)
            log.info("requeued job %s (%d timeout requeue(s) left)", env.job_id, timeouts_left)
        except (subprocess.SubprocessError, OSError) as exc:  # e.g. Slurm requeued it already (PreemptMode=REQUEUE)
            status["reason"] = f"{what}: checkpoint step {found[-1][0]} saved; scontrol requeue failed: {exc}"
            write_json(run_dir / "status.json", status)
            write_json(run_dir / REQUEUES_FILE, history)  # the record written above did not happen
            log.warning("job %s: %s", env.job_id, status["reason"])
            return False
        log.warning("job %s: %s", env.job_id, status["reason"])
        return True

    # ---- in the submitting process ---------------------------------------------------------------

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and len(job_overrides) > 0
        # resolved here, once: the jobs (and requeued jobs) must not re-evaluate ${mt_stamp:}
        self.sweep_dir = str(self.config.hydra.sweep.dir)
        sweep_dir = Path(self.sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            sweep_dir.chmod(int(str(self.config.hydra.sweep.mode), 8))

        params = dict(self.params)
        init_params = {
            "folder": params.pop("submitit_folder"),
            f"{self._EXECUTOR}_max_num_timeout": params.pop("max_num_timeout", 0),
        }
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init_params)
        base = set(OmegaConf.structured(plugin.BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})

        log.info("Submitit '%s' sweep output dir : %s", self._EXECUTOR, sweep_dir)
        job_params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        watcher = quiet_watcher()
        with _job_watcher(watcher):
            jobs = executor.map_array(self, *zip(*job_params))
            returns = [self._result(job, p) for job, p in zip(jobs, job_params)]
        if watcher.sacct_failures:
            log.info(
                "job states came from squeue: sacct failed %d time(s) (%s)", watcher.sacct_failures, watcher.sacct_error
            )
        return returns

    def _result(self, job: Any, params: tuple) -> JobReturn:
        overrides, _, idx, _, _ = params
        try:
            return job.results()[0]
        except Exception as exc:  # noqa: BLE001 - the job died outside the task: count it, go on with the sweep
            run_dir = Path(self.sweep_dir or ".") / str(idx)
            first = str(exc).strip().splitlines()[:3]
            reason = f"Slurm job {job.job_id} ended without a result ({type(exc).__name__}): " + " ".join(first)
            if not (run_dir / "summary.json").exists():
                run_dir.mkdir(parents=True, exist_ok=True)
                write_json(run_dir / "status.json", {"status": "failed", "reason": reason, "overrides": overrides})
            log.error("job %d: %s", idx, reason)
            ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
            ret.return_value = None
            return ret


def quiet_watcher(delay_s: int = 60) -> Any:
    """submitit's job-state poller; when ``sacct`` fails (no accounting), one note and ``squeue`` instead.
    Built on first use: submitit is imported only when a Slurm sweep runs, not at Hydra's plugin scan."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class QuietWatcher(SlurmInfoWatcher):
        sacct_failures = 0
        sacct_error = ""
        update = _update
        _squeue = _squeue

    return QuietWatcher(delay_s=delay_s)


def _update(self: Any) -> None:
    command = self._make_command()
    if command is None:
        return
    self._num_calls += 1
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        if not self.sacct_failures:
            stderr = getattr(exc, "stderr", "") or ""
            self.sacct_error = stderr.strip().splitlines()[-1] if stderr.strip() else str(exc)
        self.sacct_failures += 1
        out = self._squeue(command)
    self._info_dict.update(self.read_info(out))
    self._last_status_check = time.time()
    for job_id in self._registered - self._finished:
        if self.is_done(job_id, mode="cache"):
            self._finished.add(job_id)


def _squeue(self: Any, sacct_command: list[str]) -> str:
    ids = [sacct_command[i + 1] for i, arg in enumerate(sacct_command) if arg == "-j"]
    cmd = ["squeue", "-h", "-r", "--states=all", "-o", "%i|%T", "-j", ",".join(ids)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""
    return "JobID|State\n" + out


@contextlib.contextmanager
def _job_watcher(watcher: Any) -> Iterator[None]:
    """submitit's Slurm jobs share one class-level watcher; use ours while this sweep waits."""
    from submitit.slurm.slurm import SlurmJob

    previous = SlurmJob.watcher
    SlurmJob.watcher = watcher
    try:
        yield
    finally:
        SlurmJob.watcher = previous
