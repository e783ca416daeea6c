"""Where rank 0 writes a run's results: metrics.jsonl, summary.json and the W&B run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel.core.base import WorkerContext
from trainer.observe.metrics import MetricsFile, write_json


class RankZeroSinks:
    """metrics.jsonl, summary.json and the W&B run: written by global rank 0 only."""

    def __init__(self, *, ctx: WorkerContext, cfg_dict: dict, run_meta: dict[str, Any], start_step: int = 0):
        from trainer.observe.wandb_sink import WandbSink

        self.run_dir = ctx.run_dir
        self.metrics = MetricsFile(ctx.run_dir / "metrics.jsonl", keep_through_step=start_step)
        w = ctx.cfg.logger.wandb
        layout = ctx.layout
        group = w.group or run_meta.get("sweep_name")
        tags = [layout.strategy, f"dp{layout.dp}", f"tp{layout.tp}", f"pp{layout.pp}", *list(w.tags)]
        if layout.schedule:
            tags += [layout.schedule, f"m{layout.micro_batches}"]
        self.wandb = WandbSink(
            mode=str(w.mode),
            project=str(w.project),
            entity=w.entity,
            group=group,
            job_type=layout.strategy,
            tags=tags,
            name=run_meta.get("run_name"),
            config=cfg_dict,
            run_dir=ctx.run_dir,
            init_timeout=float(w.init_timeout),
            system_stats=bool(w.system_stats),
            console=str(w.console),
            log=ctx.log,
            crash_at_step=(ctx.cfg.get("debug") or {}).get("wandb_crash_at_step"),
        )

    def log_step(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log_metrics(record, step=int(record["step"]))

    def finish(self, summary: dict[str, Any] | None, *, exit_code: int) -> None:
        try:
            if summary is not None:
                summary["wandb_dir"] = self.wandb.directory
                write_json(self.run_dir / "summary.json", summary)
                self.wandb.log_summary(summary)
                # engines list files they wrote (traces, plots): {"images": {key: path}, "files": [path]}
                artifacts = summary.get("artifacts") or {}
                self.wandb.log_files(
                    images={k: Path(v) for k, v in artifacts.get("images", {}).items()},
                    files=[Path(p) for p in artifacts.get("files", [])],
                )
        finally:
            self.metrics.close()
            self.wandb.finish(exit_code=exit_code)


def output_listing(run_dir: Path) -> str:
    names = ["metrics.jsonl", "summary.json", "logs/", "wandb/", ".hydra/"]
    present = [n for n in names if (run_dir / n.rstrip("/")).exists()]
    return f"outputs in {run_dir}: " + ", ".join(present)
