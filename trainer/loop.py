"""The training loop: global batch → this rank's share → engine step → optimizer → measurements.

Every rank runs the same loop; collectives happen at the same steps on all ranks (loss reduction on
logged steps, the summary at the end). Rank 0 owns the sinks: console, metrics.jsonl, summary.json, W&B.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch import nn

from parallel.base import Engine, WorkerContext
from trainer.console import ProgressDisplay
from trainer.memory import peak_memory_bytes
from trainer.metrics import MetricsFile, StepStats, write_json
from trainer.optim import build_optimizer, build_scheduler


class NonFiniteLoss(RuntimeError):
    pass


def _micro_batch_per_forward(ctx: WorkerContext) -> int:
    per_replica = ctx.per_replica_batch()
    if ctx.layout.schedule is not None:
        return per_replica // max(1, ctx.layout.micro_batches)
    return per_replica // ctx.accumulation_steps()


def warn_small_batchnorm(engine: Engine, ctx: WorkerContext) -> None:
    """The classic trap: BatchNorm statistics over a handful of samples per rank are noise."""
    bns = [m for part in engine.model_parts for m in part.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns or any(isinstance(m, nn.SyncBatchNorm) for m in bns):
        return
    per_forward = _micro_batch_per_forward(ctx)
    if per_forward < 8:
        ctx.log.warning(
            "the model has %d BatchNorm layers but each forward pass on a rank sees only %d samples "
            "(data.global_batch_size=%d over dp.size=%d): batch statistics from fewer than 8 samples are "
            "noisy and hurt training. Raise data.global_batch_size, or set dp.sync_batchnorm=true so "
            "statistics span all replicas.",
            len(bns),
            per_forward,
            ctx.cfg.data.global_batch_size,
            ctx.layout.dp,
        )


class Trainer:
    def __init__(self, *, ctx: WorkerContext, engine: Engine, run_meta: dict[str, Any]):
        self.ctx = ctx
        self.engine = engine
        self.cfg = ctx.cfg
        self.run_meta = run_meta
        self.data = instantiate(self.cfg.data, seed=int(self.cfg.trainer.seed))
        self.optimizer = build_optimizer(engine.parameters(), self.cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, max_steps=int(self.cfg.trainer.max_steps))
        self.tokens_per_step = int(self.cfg.data.global_batch_size) * int(self.data.tokens_per_sample)
        self.stats = StepStats()
        self.first_loss: float | None = None
        self.last_loss: float | None = None

    # ---- collectives -------------------------------------------------------------------------

    def _reduce_loss(self, loss: torch.Tensor | None) -> float:
        """Mean of the loss over the ranks that computed one (last pipeline stage, all replicas)."""
        buf = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        if loss is not None:
            buf[0] = loss.detach().double()
            buf[1] = 1.0
        if self.ctx.world_size > 1:
            dist.all_reduce(buf)
        return (buf[0] / buf[1]).item() if buf[1] > 0 else float("nan")

    def _inject_faults(self, step: int) -> None:
        """``+debug.fail_at_step=N [+debug.fail_rank=R]``: raise on one rank, to test failure handling."""
        debug = self.cfg.get("debug") or {}
        if debug.get("fail_at_step") == step and self.ctx.rank == int(debug.get("fail_rank", 0)):
            raise RuntimeError(f"injected failure at step {step} on rank {self.ctx.rank} (debug.fail_at_step)")

    def _should_log(self, step: int) -> bool:
        every = int(self.cfg.trainer.log_every)
        return step == 1 or step % every == 0 or step == int(self.cfg.trainer.max_steps)

    # ---- the loop ----------------------------------------------------------------------------

    def fit(self, *, sinks: "RankZeroSinks | None") -> dict[str, Any]:
        ctx, cfg, engine = self.ctx, self.cfg, self.engine
        max_steps = int(cfg.trainer.max_steps)
        clip = float(cfg.trainer.grad_clip)
        warn_small_batchnorm(engine, ctx)
        engine.train()
        progress = ProgressDisplay(total_steps=max_steps, start_step=0, log=ctx.log, enabled=sinks is not None)
        t_start = time.perf_counter()
        first_step_s = None
        try:
            for step in range(1, max_steps + 1):
                t0 = time.perf_counter()
                inputs, targets = self.data.global_batch(step)
                x, y = engine.local_batch(ctx, inputs, targets)
                self.optimizer.zero_grad(set_to_none=True)
                self._inject_faults(step)
                loss = engine.train_step(x, y)
                grad_norm = engine.clip_grad_norm_(clip) if clip > 0 else None
                lr = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                self.scheduler.step()
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize(ctx.device)
                dt = time.perf_counter() - t0
                extras = engine.step_metrics()
                self.stats.add(dt, self.tokens_per_step)
                if first_step_s is None:
                    first_step_s = time.perf_counter() - t_start
                    self.first_step_end_unix = time.time()
                if self._should_log(step):
                    value = self._reduce_loss(loss)
                    if not math.isfinite(value):
                        raise NonFiniteLoss(f"loss is {value} at step {step}; last finite loss {self.last_loss}")
                    self.first_loss = value if self.first_loss is None else self.first_loss
                    self.last_loss = value
                    record = {
                        "step": step,
                        "loss": value,
                        "lr": lr,
                        "step_time_s": dt,
                        "tokens_per_s": self.tokens_per_step / dt,
                        **({"grad_norm": float(grad_norm)} if grad_norm is not None else {}),
                        **extras,
                    }
                    if sinks is not None:
                        sinks.log_step(record)
                        progress.logged(record)
                progress.advance(step)
        finally:
            progress.close()
        summary = self._summary(wall=time.perf_counter() - t_start, first_step_s=first_step_s)
        return summary

    def _summary(self, *, wall: float, first_step_s: float | None) -> dict[str, Any]:
        ctx = self.ctx
        peak = peak_memory_bytes(ctx.device)
        peaks = [peak]
        if ctx.world_size > 1:
            peaks = [None] * ctx.world_size
            dist.all_gather_object(peaks, peak)
        extras = self.engine.summary()  # may hold collectives: called on every rank
        return {
            "status": "completed",
            "strategy": ctx.layout.strategy,
            "steps": int(self.cfg.trainer.max_steps),
            "first_loss": self.first_loss,
            "final_loss": self.last_loss,
            "tokens_per_s": self.stats.median_tokens_per_s(),
            "median_step_time_s": self.stats.median_step_time(),
            "time_to_first_step_s": first_step_s,
            "first_step_end_unix": getattr(self, "first_step_end_unix", None),
            "wall_time_s": wall,
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_bytes_max": max(peaks),
            "layout": ctx.layout.to_dict(),
            **extras,
        }


class RankZeroSinks:
    """metrics.jsonl, summary.json and the W&B run: written by global rank 0 only."""

    def __init__(self, *, ctx: WorkerContext, cfg_dict: dict, run_meta: dict[str, Any]):
        from trainer.wandb_sink import WandbSink

        self.run_dir = ctx.run_dir
        self.metrics = MetricsFile(ctx.run_dir / "metrics.jsonl")
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
