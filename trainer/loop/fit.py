"""The training loop: global batch → this rank's share → engine step → optimizer → measurements.

Every rank runs the same loop; collectives happen at the same steps on all ranks: one small all-reduce
per step (did a stop signal arrive, did any rank go non-finite), the loss on logged steps, checkpoints,
the summary at the end. Rank 0 owns the sinks: console, metrics.jsonl, summary.json, W&B.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch import nn

from parallel.core.base import Engine, WorkerContext
from trainer.launch.preemption import PreemptionFlag
from trainer.loop.optim import build_optimizer, build_scheduler
from trainer.observe.console import ProgressDisplay
from trainer.observe.memory import peak_memory_bytes
from trainer.observe.metrics import MetricsFile, StepStats, write_json


class NonFiniteError(RuntimeError):
    """The loss or gradient norm stopped being finite; names the step and the ranks."""


class CollectiveTimeout(RuntimeError):
    """A rank stopped answering; names it."""


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
    def __init__(self, *, ctx: WorkerContext, engine: Engine):
        self.ctx = ctx
        self.engine = engine
        self.cfg = ctx.cfg
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

    def _agree(self, *, preempt: bool, bad: bool) -> tuple[bool, list[int]]:
        """One small all-reduce per step: did any rank get a stop signal, which ranks went non-finite."""
        flags = torch.zeros(1 + self.ctx.world_size, dtype=torch.int32, device=self.ctx.device)
        flags[0] = int(preempt)
        flags[1 + self.ctx.rank] = int(bad)
        if self.ctx.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), [r for r in range(self.ctx.world_size) if flags[1 + r]]

    def _unresponsive_ranks(self, step: int, wait_s: float = 3.0) -> list[int]:
        """After a collective timed out: ranks that do not check in through the rendezvous store."""
        try:
            store = dist.distributed_c10d._get_default_store()
            key = f"meshtrain/alive/{step}"
            store.set(f"{key}/{self.ctx.rank}", "1")
            time.sleep(wait_s)
            return [r for r in range(self.ctx.world_size) if not store.check([f"{key}/{r}"])]
        except Exception:  # noqa: BLE001 - diagnosis is best effort; the timeout itself is reported
            return []

    # ---- faults for tests (+debug.*) ------------------------------------------------------------

    def _debug(self, key: str, step: int) -> bool:
        """True when ``+debug.<key>_at_step=step`` targets this rank (``+debug.<key>_rank``, default 0),
        in the first attempt only (an elastic restart must not repeat the fault)."""
        debug = self.cfg.get("debug") or {}
        if debug.get(f"{key}_at_step") != step or self.ctx.rank != int(debug.get(f"{key}_rank", 0)):
            return False
        return key == "fail" or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0

    def _inject_faults(self, step: int) -> None:
        if self._debug("fail", step):
            raise RuntimeError(f"injected failure at step {step} on rank {self.ctx.rank} (debug.fail_at_step)")
        if self._debug("kill", step):
            self.ctx.log.info("debug.kill_at_step: killing rank %d at step %d", self.ctx.rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
        if self._debug("hang", step):
            self.ctx.log.info("debug.hang_at_step: rank %d stops answering at step %d", self.ctx.rank, step)
            time.sleep(10**6)

    def _inject_nan(self, step: int, loss: torch.Tensor | None) -> torch.Tensor | None:
        if not self._debug("nan", step):
            return loss
        for p in self.engine.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
                break
        return loss * float("nan") if loss is not None else loss

    def _should_log(self, step: int) -> bool:
        every = int(self.cfg.trainer.log_every)
        return step == 1 or step % every == 0 or step == int(self.cfg.trainer.max_steps)

    # ---- checkpoints ---------------------------------------------------------------------------

    @functools.cached_property
    def checkpointer(self):
        """Built on first use: ``torch.distributed.checkpoint`` costs ~0.9 s to import (it pulls in
        dynamo), which a fresh run should not pay before its first step."""
        from trainer.checkpoint.checkpointer import Checkpointer

        return Checkpointer(ctx=self.ctx, engine=self.engine, optimizer=self.optimizer, scheduler=self.scheduler)

    def resume(self) -> int:
        """Load the checkpoint this run continues from (collective); returns the step it ends at."""
        from trainer.checkpoint.files import checkpoints_root, complete_checkpoints, resolve_resume

        resume = str(self.cfg.trainer.resume)
        own = complete_checkpoints(checkpoints_root(self.ctx.run_dir))
        # a restarted or re-launched run continues from its own newest checkpoint, whatever it started from
        path = own[-1][1] if own and resume != "never" else resolve_resume(resume, self.ctx.run_dir)
        if path is None:
            return 0
        self.resumed_from = str(path)
        return self.checkpointer.load(path)

    def _checkpoint_due(self, step: int) -> bool:
        every = int(self.cfg.trainer.checkpoint_every)
        return every > 0 and (step % every == 0 or step == int(self.cfg.trainer.max_steps))

    def _latest_checkpoint(self) -> str:
        from trainer.checkpoint.files import checkpoints_root, complete_checkpoints

        found = complete_checkpoints(checkpoints_root(self.ctx.run_dir))
        return str(found[-1][1]) if found else "none (trainer.checkpoint_every=0 or none written yet)"

    # ---- the loop ----------------------------------------------------------------------------

    def fit(
        self, *, sinks: RankZeroSinks | None, start_step: int = 0, preemption: PreemptionFlag | None = None
    ) -> dict[str, Any]:
        ctx, cfg, engine = self.ctx, self.cfg, self.engine
        max_steps = int(cfg.trainer.max_steps)
        clip = float(cfg.trainer.grad_clip)
        skip_nonfinite = cfg.trainer.on_nonfinite == "skip"
        warn_small_batchnorm(engine, ctx)
        engine.train()
        progress = ProgressDisplay(total_steps=max_steps, start_step=start_step, log=ctx.log, enabled=sinks is not None)
        t_start = time.perf_counter()
        first_step_s = None
        status, step = "completed", start_step
        self.skipped_steps: list[int] = []
        try:
            for step in range(start_step + 1, max_steps + 1):
                t0 = time.perf_counter()
                inputs, targets = self.data.global_batch(step)
                x, y = engine.local_batch(ctx, inputs, targets)
                self.optimizer.zero_grad(set_to_none=True)
                self._inject_faults(step)
                loss = self._inject_nan(step, engine.train_step(x, y))
                grad_norm = engine.clip_grad_norm_(clip if clip > 0 else float("inf"))
                bad = not bool(torch.isfinite(grad_norm)) or (loss is not None and not bool(torch.isfinite(loss)))
                preempt, bad_ranks = self._agree(preempt=bool(preemption and preemption.requested), bad=bad)
                lr = self.optimizer.param_groups[0]["lr"]
                if bad_ranks:
                    what = f"non-finite loss or gradient norm at step {step} on rank(s) {bad_ranks}"
                    if not skip_nonfinite:
                        raise NonFiniteError(
                            f"{what}; stopped. Last good checkpoint: {self._latest_checkpoint()}. "
                            "Set trainer.on_nonfinite=skip to skip such steps instead"
                        )
                    ctx.log.warning("%s; step skipped (trainer.on_nonfinite=skip)", what)
                    self.skipped_steps.append(step)
                    self.optimizer.zero_grad(set_to_none=True)
                else:
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
                if self._should_log(step) and not bad_ranks:
                    value = self._reduce_loss(loss)
                    self.first_loss = value if self.first_loss is None else self.first_loss
                    self.last_loss = value
                    record = {
                        "step": step,
                        "loss": value,
                        "lr": lr,
                        "step_time_s": dt,
                        "tokens_per_s": self.tokens_per_step / dt,
                        "grad_norm": float(grad_norm),
                        **extras,
                    }
                    if sinks is not None:
                        sinks.log_step(record)
                        progress.logged(record)
                progress.advance(step)
                if preempt and preemption is not None:
                    preemption.honoured()
                if self._checkpoint_due(step) or preempt:
                    saved = self.checkpointer.save(step)
                    if sinks is not None:
                        sinks.checkpoint_saved(saved, step=step, loss=self.last_loss)
                if preempt:
                    status = "preempted"
                    ctx.log.warning(
                        "preempted (%s): checkpoint saved at step %d; `trainer.resume=auto` in the same "
                        "folder continues",
                        preemption.name or "signal on another rank",
                        step,
                    )
                    break
        except RuntimeError as exc:
            if (
                isinstance(exc, NonFiniteError)
                or "timed out" not in str(exc).lower()
                and "timeout" not in str(exc).lower()
            ):
                raise
            silent = [r for r in self._unresponsive_ranks(step) if r != ctx.rank]
            who = f"rank(s) {silent} stopped answering" if silent else "a rank stopped answering"
            raise CollectiveTimeout(
                f"{who} at step {step}: no reply within topology.timeout_s="
                f"{cfg.topology.timeout_s}s ({str(exc).splitlines()[0][:200]})"
            ) from None
        finally:
            progress.close()
        summary = self._summary(wall=time.perf_counter() - t_start, first_step_s=first_step_s)
        summary.update(
            status=status,
            last_step=step,
            start_step=start_step,
            resumed_from=getattr(self, "resumed_from", None),
            skipped_steps=self.skipped_steps,
        )
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

    def __init__(self, *, ctx: WorkerContext, cfg_dict: dict, run_meta: dict[str, Any], start_step: int = 0):
        from trainer.observe.wandb_run import RunIdentity
        from trainer.observe.wandb_sink import WandbSink

        self.run_dir = ctx.run_dir
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
            identity=self.identity,
            git=prov.get("git"),
        )
        self._config_logged = False

    def _write_resolved_config(self, cfg_dict: dict) -> list[Path]:
        from omegaconf import OmegaConf

        path = self.run_dir / "resolved_config.yaml"
        OmegaConf.save(OmegaConf.create(cfg_dict), path)
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

    def log_step(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log_metrics(record, step=int(record["step"]))

    def checkpoint_saved(self, path: Path, *, step: int, loss: float | None) -> None:
        if self.identity is not None:
            self.wandb.log_checkpoint(path, step=step, loss=loss, best=self.identity.is_best(loss))

    def finish(self, summary: dict[str, Any] | None, *, exit_code: int) -> None:
        try:
            if summary is not None:
                summary["wandb_dir"] = self.wandb.directory
                write_json(self.run_dir / "summary.json", summary)
                self.wandb.log_summary({**summary, **self._memory_per_pp_rank(summary)})
                self.wandb.log_config(self.config_files)
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
