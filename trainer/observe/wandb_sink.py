"""W&B as a sink of a training run (logger=wandb): one W&B run per run folder, continued by resumes, elastic restarts
and preemption; tagged with the layout; metrics by section, checkpoints as reference artifacts, the summary, the
resolved config and the run's figures at the end. The calls go through ``WandbClient`` (``wandb_client.py``), which
never lets W&B stop training."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from parallel.foundation import dims
from parallel.foundation.layout import ParallelLayout
from trainer.observe.files_sink import config_files
from trainer.observe.sink import Sink
from trainer.observe.wandb_client import WandbClient
from trainer.observe.wandb_run import RunIdentity


class WandbSink(Sink):
    def __init__(
        self,
        *,
        settings: Any,
        layout: ParallelLayout,
        run_dir: Path,
        cfg_dict: dict,
        run_meta: dict[str, Any],
        log: logging.Logger,
    ):
        """``settings``: the ``logger.wandb`` node; ``run_meta``: the task's (run name, sweep, provenance)."""
        w = settings
        self.layout, self.run_dir = layout, run_dir
        degrees = {n: f"{n}{layout.size(n)}" for n in dims.named(layout.sizes)}  # dp2 tp1 pp1, a further one in use
        always = [t for n, t in degrees.items() if n in dims.ALWAYS_NAMED]
        tags = [layout.strategy, *always, *list(w.tags), *(t for t in degrees.values() if t not in always)]
        if layout.schedule:
            tags += [layout.schedule, f"m{layout.micro_batches}"]
        # one W&B run per run folder: resume, elastic restart and preemption continue it
        self.identity = RunIdentity(run_dir)
        # provenance beside the job's keys, whatever system_stats says (run.git.commit, run.command ...)
        prov = run_meta.get("provenance") or {}
        config = {**cfg_dict, "run": {**prov, "layout": layout.to_dict(), "name": run_meta.get("run_name")}}
        self.client = WandbClient(
            mode=str(w.mode),
            project=str(w.project),
            entity=w.entity,
            group=w.group or run_meta.get("sweep_name"),
            job_type=layout.strategy,
            tags=tags,
            name=run_meta.get("run_name"),
            config=config,
            run_dir=run_dir,
            init_timeout=float(w.init_timeout),
            answer_timeout_s=float(w.answer_timeout_s),
            system_stats=bool(w.system_stats),
            console=str(w.console),
            save_requirements=bool(w.save_requirements),
            log=log,
            identity=self.identity,
            git=prov.get("git"),
        )

    def log_step(self, record: dict[str, Any]) -> None:
        self.client.log_metrics(record, step=int(record["step"]))

    def log_checkpoint(self, path: Path, *, step: int, loss: float | None) -> None:
        """The checkpoint as a reference artifact (aliases latest, step-N, and best for the lowest loss so far)."""
        self.client.log_checkpoint(path, step=step, loss=loss, best=self.identity.is_best(loss))

    def summary_fields(self) -> dict[str, Any]:
        return {"wandb_dir": self.client.directory}

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.client.log_summary({**summary, **self._memory_per_pp_rank(summary)})
        self.client.log_config(config_files(self.run_dir))
        # engines list files they wrote (traces, plots): {"images": {key: path}, "files": [path]}
        artifacts = summary.get("artifacts") or {}
        self.client.log_files(
            images={k: Path(v) for k, v in artifacts.get("images", {}).items()},
            files=[Path(p) for p in artifacts.get("files", [])],
        )

    def close(self, *, exit_code: int) -> None:
        self.client.finish(exit_code=exit_code)

    def _memory_per_pp_rank(self, summary: dict[str, Any]) -> dict[str, int]:
        """``memory/peak_bytes_pp{p}``: peak memory of pipeline rank p (max over its dp/tp ranks)."""
        peaks = summary.get("peak_memory_bytes_per_rank") or []
        out: dict[str, int] = {}
        for entry in self.layout.to_dict().get("rank_map") or []:
            rank, pp = int(entry["rank"]), int(entry.get("pp", 0))
            if rank < len(peaks) and peaks[rank] is not None:
                key = f"memory/peak_bytes_pp{pp}"
                out[key] = max(out.get(key, 0), int(peaks[rank]))
        return out
