"""Hydra callback: at the end of every multirun, count succeeded / failed / skipped jobs.

Configured in ``conf/config.yaml`` (``hydra.callbacks.sweep_status``). The count is printed and
written to ``<sweep dir>/sweep_status.json`` with each job's status and reason; a sweep in which no job
completed exits 2 (every job skipped) or 1; the full report
(table, plots, best configuration) comes from ``python -m trainer.report <sweep dir>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

from trainer.sweeps.jobs import COUNTS_FILE, counts_line, link_runs, read_sweep, write_counts

log = logging.getLogger("meshtrain.sweep")

PLUGIN_OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
#: trainer/sweeps/optuna.py's sweeper where Hydra finds plugins
ENDING_OPTUNA_SWEEPER = "hydra_plugins.meshtrain_launcher.meshtrain_launcher.OptunaSweeper"
PLUGIN_LOCAL_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
#: trainer/sweeps/local.py's launcher (jobs at the pace the cores hold, each start and end said)
PACED_LOCAL_LAUNCHER = "hydra_plugins.meshtrain_launcher.meshtrain_launcher.LocalLauncher"


class SweepStatus(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra instantiates the sweeper from this same config right after this call: hydra/sweeper=optuna
        # gets meshtrain's subclass, which ends a study without a completed trial here, not in a traceback.
        # (A yaml of the same name cannot stand in for the plugin's: Hydra matches it to the plugin's schema.)
        # every job composes its config again from hydra.overrides.hydra; a job in another process
        # (hydra/launcher=submitit_local, slurm) would resolve the folder's time stamp again, a second later:
        # the sweep's folder, resolved once here, becomes one of those overrides
        pinned = f"hydra.sweep.dir={config.hydra.sweep.dir}"
        with read_write(config.hydra.overrides):
            config.hydra.overrides.hydra = [
                *(o for o in config.hydra.overrides.hydra if not str(o).startswith("hydra.sweep.dir=")),
                pinned,
            ]
        sweeper = config.hydra.sweeper
        if sweeper.get("_target_") == PLUGIN_OPTUNA_SWEEPER:
            with read_write(sweeper):
                sweeper._target_ = ENDING_OPTUNA_SWEEPER
        # the same for hydra/launcher=submitit_local, instantiated right after this call too: meshtrain's runs the
        # jobs at the pace the cores hold (+hydra.launcher.array_parallelism=N: N at a time) instead of all at once
        launcher = config.hydra.get("launcher")
        if launcher is not None and launcher.get("_target_") == PLUGIN_LOCAL_LAUNCHER:
            with read_write(launcher):
                launcher._target_ = PACED_LOCAL_LAUNCHER

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            jobs = read_sweep(sweep_dir)
        except FileNotFoundError as exc:  # e.g. every job was sent elsewhere and left nothing here
            log.warning("sweep status: %s", exc)
            return
        record = write_counts(sweep_dir, jobs)
        link_runs(sweep_dir, jobs)  # `wandb leet <sweep dir>/wandb` lists every job's run from now on
        lines = [f"meshtrain sweep {sweep_dir}: {counts_line(record['counts'])}"]
        lines += [f"  job {j.num} {j.status}: {j.reason}" for j in jobs if not j.succeeded]
        lines += [
            f"  job {j.num} completed after {len(j.requeues)} requeue(s): "
            + ", ".join(f"{r.get('kind')} at step {r.get('stopped_at_step')}" for r in j.requeues)
            for j in jobs
            if j.succeeded and j.requeues
        ]
        lines.append(
            f"  statuses in {sweep_dir / COUNTS_FILE}; report: python -m trainer.report {sweep_dir} [--wandb-workspace]"
        )
        print("\n".join(lines), flush=True)
        code = no_completed_job_exit(record["counts"])
        if code:
            print(f"meshtrain sweep: no job completed; exit code {code}", flush=True)
            raise SystemExit(code)


def no_completed_job_exit(counts: dict[str, int]) -> int:
    """A sweep in which no job completed ends like the run it stands for: 2 when every job was refused before
    it started (bad input), 1 when any failed or was preempted; 0 while one job completed."""
    if counts.get("completed", 0) or not sum(counts.values()):
        return 0
    return 2 if counts.get("skipped", 0) == sum(counts.values()) else 1
