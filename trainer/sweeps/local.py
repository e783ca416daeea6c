"""hydra-submitit-launcher's local launcher (``hydra/launcher=submitit_local``), at the pace the machine holds.

The plugin's launcher submits every job of a sweep at once: on 2 cores three 2-rank jobs then share the cores (six
ranks taking turns, every job's timings measuring the crowding) and the console stays silent until all of them end.
trainer/sweeps/callback.py puts this one in its place when a multirun starts (``hydra_plugins.meshtrain_launcher.
meshtrain_launcher.LocalLauncher``: Hydra takes launchers only from its ``hydra_plugins`` package; a YAML of the same
name would be matched to the plugin's closed schema). It runs at most ``+hydra.launcher.array_parallelism=N`` jobs at a
time; without it, as many as the cores hold: the cores divided by the ranks of the largest job (at least 1), so one at
a time where one job's ranks fill the cores (the default job's 2 ranks on 2 cores). Each job's start
and end are said on the console, and while one runs, the last line of its output at least every ``HEARTBEAT_S``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from omegaconf import OmegaConf

from trainer.observe.console import HEARTBEAT_S
from trainer.observe.durable import read_json, write_json
from trainer.observe.startup import StartClock

log = logging.getLogger("meshtrain.local")

#: how often a running job is looked at (seconds)
POLL_S = 0.5


class PacedLocalLauncher(plugin.LocalLauncher):
    def __init__(self, **params: Any) -> None:
        at_once = params.pop("array_parallelism", None)
        self.array_parallelism = int(at_once) if at_once is not None else None
        super().__init__(**params)

    def _job_ranks(self, overrides: Sequence[str]) -> int:
        """The processes one job starts on this machine: its ranks per node (``topology.nproc_per_node``, or the
        layout's world size over its nodes), or the submitit tasks."""
        from parallel.foundation import dims

        tasks = int(self.params.get("tasks_per_node") or 1) * int(self.params.get("cpus_per_task") or 1)
        try:
            assert self.hydra_context is not None and self.config is not None
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            nproc = cfg.topology.nproc_per_node
            world = dims.world_size({d.name: int(OmegaConf.select(cfg, d.key)) for d in dims.DIMENSIONS})
            ranks = int(nproc) if nproc is not None else -(-world // max(1, int(cfg.topology.nnodes)))
        except Exception:  # noqa: BLE001 - a job that does not compose is refused by its own validation
            ranks = 1
        return max(tasks, ranks)

    def at_once(self, job_overrides: Sequence[Sequence[str]]) -> tuple[int, str]:
        """How many jobs run at a time, and why."""
        if self.array_parallelism is not None:
            return max(1, self.array_parallelism), f"+hydra.launcher.array_parallelism={self.array_parallelism}"
        from trainer.checks.topology import cpu_cores

        ranks, cores = max(self._job_ranks(o) for o in job_overrides), cpu_cores()
        return max(1, cores // ranks), (
            f"{cores} CPU core(s), up to {ranks} rank(s) per job; +hydra.launcher.array_parallelism=N changes it"
        )

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and len(job_overrides) > 0
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            sweep_dir.chmod(int(str(self.config.hydra.sweep.mode), 8))
        params = dict(self.params)
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=params.pop("submitit_folder"))
        base = set(OmegaConf.structured(plugin.BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})

        jobs = [
            (list(o), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            for idx, o in enumerate(job_overrides, start=initial_job_idx)
        ]
        limit, why = self.at_once(job_overrides)
        clock = StartClock.for_job(multirun=False)
        clock.say(f"submitit_local: {len(jobs)} job(s) in {sweep_dir}, {limit} at a time ({why})")
        return self._run_paced(executor, jobs, limit=limit, clock=clock, sweep_dir=sweep_dir)

    def _run_paced(self, executor: Any, jobs: list[tuple], *, limit: int, clock: StartClock, sweep_dir: Path) -> list:
        """Submit the jobs in order, at most ``limit`` running; say each start and end, and a running job's last
        line at least every HEARTBEAT_S. Returns their results in the jobs' order."""
        pending, running, results = list(jobs), [], {}
        while pending or running:
            while pending and len(running) < limit:
                params = pending.pop(0)
                job = executor.submit(self, *params)
                clock.say(f"job #{params[2]} started (local job {job.job_id}): {' '.join(filter_overrides(params[0]))}")
                running.append([job, params, time.monotonic(), time.monotonic()])
            time.sleep(POLL_S)
            for entry in list(running):
                job, params, started, said = entry
                if job.done():
                    running.remove(entry)
                    results[params[2]] = self._result(job, params, sweep_dir=sweep_dir)
                    clock.say(
                        f"job #{params[2]} ended after {time.monotonic() - started:.0f} s: "
                        f"{job_outcome(sweep_dir / str(params[2]))}"
                    )
                elif time.monotonic() - said >= HEARTBEAT_S:
                    entry[3] = time.monotonic()
                    clock.say(f"job #{params[2]} running for {time.monotonic() - started:.0f} s: {last_line(job)}")
        return [results[p[2]] for p in jobs]

    def _result(self, job: Any, params: tuple, *, sweep_dir: Path) -> JobReturn:
        overrides, _, idx, _, _ = params
        try:
            return job.results()[0]
        except Exception as exc:  # noqa: BLE001 - the job died outside the task: count it, go on with the sweep
            run_dir = sweep_dir / str(idx)
            reason = f"local job {job.job_id} ended without a result ({type(exc).__name__}): " + " ".join(
                str(exc).strip().splitlines()[:3]
            )
            if not (run_dir / "summary.json").exists():
                run_dir.mkdir(parents=True, exist_ok=True)
                write_json(run_dir / "status.json", {"status": "failed", "reason": reason, "overrides": overrides})
            log.error("job %d: %s", idx, reason)
            ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
            ret.return_value = None
            return ret


def job_outcome(job_dir: Path) -> str:
    """A finished job in a few words: its status.json (skipped, failed ...), else its summary's loss."""
    status = read_json(job_dir / "status.json", default={})
    if isinstance(status, dict) and status.get("status"):
        return f"{status['status']}: {str(status.get('reason', ''))[:200]}"
    summary = read_json(job_dir / "summary.json", default={})
    if isinstance(summary, dict) and summary.get("final_loss") is not None:
        return f"{summary.get('status', 'completed')}, final loss {summary['final_loss']:.4f}, outputs in {job_dir}"
    return f"no summary in {job_dir} (its log: {job_dir / 'logs'})"


def last_line(job: Any) -> str:
    """The last non-empty line the job's first task printed (its console), or a note that it printed nothing yet."""
    try:
        text = job.stdout() or ""
    except OSError:
        text = ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else "nothing printed yet"
