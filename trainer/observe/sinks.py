"""Where rank 0 writes a run's results: metrics.jsonl, summary.json, the W&B run and TensorBoard's event files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel.core.base import WorkerContext
from parallel.core.figures import draw_announced
from trainer.observe.durable import write_json, write_text
from trainer.observe.metrics import MetricsFile


class RankZeroSinks:
    """metrics.jsonl, summary.json, the W&B run and TensorBoard (``logger=``): written by global rank 0 only."""

    def __init__(self, *, ctx: WorkerContext, cfg_dict: dict, run_meta: dict[str, Any], start_step: int = 0):
        from trainer.observe.wandb_run import RunIdentity
        from trainer.observe.wandb_sink import WandbSink

        self.run_dir = ctx.run_dir
        self.log = ctx.log
        self.layout = ctx.layout
        self.metrics = MetricsFile(ctx.run_dir / "metrics.jsonl", keep_through_step=start_step)
        w = ctx.cfg.logger.wandb
        layout = ctx.layout
        group = w.group or run_meta.get("sweep_name")
        tags = [layout.strategy, f"dp{layout.dp}", f"tp{layout.tp}", f"pp{layout.pp}", *list(w.tags)]
        if layout.schedule:
            tags += [layout.schedule, f"m{layout.micro_batches}"]
        # one W&B run per run folder: resume, elastic restart and preemption continue it
        self.identity = RunIdentity(ctx.run_dir) if str(w.mode) != "disabled" else None
        # provenance beside the job's keys, whatever system_stats says (run.git.commit, run.command ...)
        prov = run_meta.get("provenance") or {}
        config = {**cfg_dict, "run": {**prov, "layout": layout.to_dict(), "name": run_meta.get("run_name")}}
        self.config_files = self._write_resolved_config(cfg_dict)
        self.wandb = WandbSink(
            mode=str(w.mode),
            project=str(w.project),
            entity=w.entity,
            group=group,
            job_type=layout.strategy,
            tags=tags,
            name=run_meta.get("run_name"),
            config=config,
            run_dir=ctx.run_dir,
            init_timeout=float(w.init_timeout),
            system_stats=bool(w.system_stats),
            console=str(w.console),
            log=ctx.log,
            crash_at_step=(ctx.cfg.get("debug") or {}).get("wandb_crash_at_step"),
            identity=self.identity,
            git=prov.get("git"),
        )
        tb = ctx.cfg.logger.get("tensorboard") or {}
        self.tensorboard = None
        if tb.get("enabled"):
            from trainer.observe.tensorboard_sink import TensorBoardSink

            self.tensorboard = TensorBoardSink(log_dir=ctx.run_dir / str(tb.get("dir") or "tensorboard"))

    def _write_resolved_config(self, cfg_dict: dict) -> list[Path]:
        from omegaconf import OmegaConf

        path = self.run_dir / "resolved_config.yaml"
        write_text(path, OmegaConf.to_yaml(OmegaConf.create(cfg_dict)))  # rewritten by every resume: atomically
        hydra_dir = self.run_dir / ".hydra"
        return [path] + [hydra_dir / n for n in ("config.yaml", "overrides.yaml", "hydra.yaml")]

    def _memory_per_pp_rank(self, summary: dict[str, Any]) -> dict[str, int]:
        """``memory/peak_bytes_pp{p}``: peak memory of pipeline rank p (max over its dp/tp ranks), for W&B."""
        peaks = summary.get("peak_memory_bytes_per_rank") or []
        out: dict[str, int] = {}
        for entry in self.layout.to_dict().get("rank_map") or []:
            rank, pp = int(entry["rank"]), int(entry.get("pp", 0))
            if rank < len(peaks) and peaks[rank] is not None:
                key = f"memory/peak_bytes_pp{pp}"
                out[key] = max(out.get(key, 0), int(peaks[rank]))
        return out

    def _draw_figures(self) -> None:
        """The figures announced during the run (rank map, pipeline timeline), drawn now that no step waits for
        them; a failure to draw is logged and loses only the picture."""
        try:
            draw_announced()
        except Exception as exc:  # noqa: BLE001 - the summary and W&B run must still be written
            self.log.warning("a figure of the run was not drawn: %s: %s", type(exc).__name__, exc)

    def log_step(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log_metrics(record, step=int(record["step"]))
        if self.tensorboard is not None:
            self.tensorboard.log_metrics(record, step=int(record["step"]))

    def checkpoint_saved(self, path: Path | None, *, step: int, loss: float | None) -> None:
        """A checkpoint as a W&B artifact by reference (None: the save failed, or it completes in the background)."""
        if self.identity is not None and path is not None:
            self.wandb.log_checkpoint(path, step=step, loss=loss, best=self.identity.is_best(loss))

    def finish(self, summary: dict[str, Any] | None, *, exit_code: int) -> None:
        try:
            self._draw_figures()
            if summary is not None:
                summary["wandb_dir"] = self.wandb.directory
                write_json(self.run_dir / "summary.json", summary)
                self.wandb.log_summary({**summary, **self._memory_per_pp_rank(summary)})
                if self.tensorboard is not None:
                    self.tensorboard.log_summary(summary)
                self.wandb.log_config(self.config_files)
                # engines list files they wrote (traces, plots): {"images": {key: path}, "files": [path]}
                artifacts = summary.get("artifacts") or {}
                self.wandb.log_files(
                    images={k: Path(v) for k, v in artifacts.get("images", {}).items()},
                    files=[Path(p) for p in artifacts.get("files", [])],
                )
        finally:
            self.metrics.close()
            if self.tensorboard is not None:
                self.tensorboard.finish()
            self.wandb.finish(exit_code=exit_code)


def output_listing(run_dir: Path) -> str:
    names = ["metrics.jsonl", "summary.json", "logs/", "wandb/", "tensorboard/", ".hydra/"]
    present = [n for n in names if (run_dir / n.rstrip("/")).exists()]
    return f"outputs in {run_dir}: " + ", ".join(present)
