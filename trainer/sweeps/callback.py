"""Hydra callback: at the end of every multirun, count succeeded / failed / skipped jobs.

Configured in ``conf/config.yaml`` (``hydra.callbacks.sweep_status``). The count is printed and
written to ``<sweep dir>/sweep_status.json`` with each job's status and reason; the full report
(table, plots, best configuration) comes from ``python -m trainer.report <sweep dir>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from trainer.sweeps.jobs import COUNTS_FILE, counts_line, read_sweep, write_counts

log = logging.getLogger("meshtrain.sweep")


class SweepStatus(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            jobs = read_sweep(sweep_dir)
        except FileNotFoundError as exc:  # e.g. every job was sent elsewhere and left nothing here
            log.warning("sweep status: %s", exc)
            return
        record = write_counts(sweep_dir, jobs)
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
