"""Weights & Biases from rank 0: the real ``wandb`` library, offline unless told otherwise.

Imported only when a run uses it (W&B's import costs about a second). An online run that cannot reach
its server within ``logger.wandb.init_timeout`` falls back to offline with a warning instead of
retrying for minutes. ``finish`` is always called, with a non-zero exit code when the run failed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any


class WandbSink:
    def __init__(
        self,
        *,
        mode: str,
        project: str,
        run_dir: Path,
        config: dict[str, Any],
        log: logging.Logger,
        entity: str | None = None,
        group: str | None = None,
        job_type: str | None = None,
        tags: list[str] | None = None,
        name: str | None = None,
        init_timeout: float = 15.0,
    ):
        self.run = None
        self.log = log
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        kwargs = dict(
            project=project,
            entity=entity,
            group=group,
            job_type=job_type,
            tags=list(tags or []),
            name=name,
            config=config,
            dir=str(run_dir),
        )
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=init_timeout), **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the server
            if mode != "online":
                raise
            log.warning("W&B online init failed (%s); logging offline instead (sync later with `wandb sync`)", exc)
            self.run = wandb.init(mode="offline", **kwargs)

    @property
    def directory(self) -> str | None:
        return getattr(self.run, "dir", None) and str(Path(self.run.dir).parent)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        if self.run is None:
            return
        for key, value in summary.items():
            if isinstance(value, (int, float, str)):
                self.run.summary[key] = value

    def log_files(self, *, images: dict[str, Path] | None = None, files: list[Path] | None = None) -> None:
        if self.run is None:
            return
        import wandb

        for key, path in (images or {}).items():
            self.run.log({key: wandb.Image(str(path))})
        for path in files or []:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
