"""The training loop: global batch → this rank's share → engine step → optimizer → measurements.

``Trainer.fit`` runs ``Trainer.step`` for each step: ``_forward_backward`` (batch, engine, clip),
``_agree`` (one all-reduce), ``_update`` (``optimizer.step()``, or skip), then ``_log`` and
``_boundary`` (checkpoint, preemption). Callbacks (``trainer.callbacks``, ``callbacks.py``) hook in around it;
rank 0's sinks (console, files, trackers: ``trainer/observe/sinks.py``) receive the logged records.

Every rank runs the same loop; collectives happen at the same steps on all ranks: one small all-reduce
per step (did a stop signal arrive, did any rank go non-finite; on logged steps the loss's mean over the
ranks rides in it), checkpoints, the summary at the end. Rank 0 owns the sinks: console, metrics.jsonl,
summary.json, W&B, TensorBoard.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch import nn

from models.losses import count_targets
from models.preference import mean_stats
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.foundation.state_bytes import model_state_bytes
from trainer.data.prefetch import Prefetcher
from trainer.loop.callbacks import build_callbacks, call
from trainer.loop.optim import build_optimization
from trainer.loop.reference import attach_reference, held_reference
from trainer.observe.expert_load_figure import announce_expert_load
from trainer.observe.memory import peak_memory_bytes
from trainer.observe.metrics import StepStats, read_metrics
from trainer.observe.perf import StepInstruments
from trainer.observe.sink import Sink


class NonFiniteError(RuntimeError):
    """The loss or gradient norm stopped being finite; names the step and the ranks."""


class CollectiveTimeout(RuntimeError):
    """A rank stopped answering; names it."""


#: what torch raises when a collective times out or loses a peer (NCCL, the TCP store, the network)
DIST_FAILURES = (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError)


def is_collective_timeout(exc: BaseException, *, waited_s: float, timeout_s: float) -> bool:
    """Recognised by type, not by message: torch's distributed error types; gloo on torch 2.13 raises a
    plain RuntimeError for a timed-out collective, which is told apart from other errors by when it came:
    a timeout cannot end a step before ``topology.timeout_s`` has passed in it."""
    if isinstance(exc, DIST_FAILURES):
        return True
    return type(exc) is RuntimeError and waited_s >= 0.95 * timeout_s


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


class StopFlag(Protocol):
    """What the loop reads of the launcher's stop-signal flag (``trainer/launch/preemption.py``: the worker
    hands it in; the loop sits below the launcher and does not import it)."""

    @property
    def name(self) -> str: ...

    @property
    def requested(self) -> bool: ...

    def honoured(self) -> None: ...


@dataclass
class StepOutcome:
    """What one optimizer step left behind, for the log and the step boundary."""

    loss: torch.Tensor | None
    """This rank's mean loss (None on ranks that compute none, such as early pipeline stages)."""
    grad_norm: torch.Tensor
    lr: float
    seconds: float
    cpu_seconds: float
    """This rank's process CPU time (all threads) during the step."""
    skipped: bool
    """Some rank went non-finite and trainer.on_nonfinite=skip dropped the update."""
    preempt: bool
    """Some rank got a stop signal: checkpoint and stop at this boundary."""
    extras: dict[str, float]
    data_seconds: float = 0.0
    """How long the step waited for its global batch (the prefetcher's queue, or building it)."""
    pairs: torch.Tensor | None = None
    """A preference objective's summed pair statistics on this rank (``models.preference.STATS``)."""
    mean_loss: float | None = None
    """On logged steps: the loss averaged over the ranks that computed one (``_agree``'s all-reduce carried it)."""
    measured: bool = False
    """The step ran the costlier measurements (``Trainer._should_measure``): its saved activations are reported."""


def parameter_names(engine: Engine) -> dict[int, str]:
    """id(parameter) -> its name in the full model (a pipeline stage is a pruned copy; DDP's wrapper looked
    through), as checkpoints key it."""
    names: dict[int, str] = {}
    for part in engine.model_parts:
        module = part.module if isinstance(part, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else part
        for name, p in module.named_parameters():
            names.setdefault(id(p), name)
    return names


class Trainer:
    """The loop of one rank: ``fit`` runs ``step`` after ``step``, then summarises."""

    def __init__(self, *, ctx: WorkerContext, engine: Engine):
        self.ctx = ctx
        self.engine = engine
        self.cfg = ctx.cfg
        self.data = instantiate(self.cfg.data, seed=int(self.cfg.trainer.seed))
        # frozen weights (LoRA's base, models/lora.py) get no optimizer state; names as checkpoints key them
        names = parameter_names(engine)
        trainable = [(names.get(id(p), ""), p) for p in engine.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_optimization(
            trainable, self.cfg.optim, max_steps=int(self.cfg.trainer.max_steps)
        )
        self.max_steps = int(self.cfg.trainer.max_steps)
        clip = float(self.cfg.trainer.grad_clip)
        self.max_grad_norm = clip if clip > 0 else float("inf")
        self.skip_nonfinite = self.cfg.trainer.on_nonfinite == "skip"
        # read once: an OmegaConf lookup costs ~20 us, and the loop asks these several times a step
        self.log_every = int(self.cfg.trainer.log_every)
        self.measure_every = int(self.cfg.trainer.measure_every)
        self.eval_every = int(self.cfg.trainer.get("eval_every", 0))
        self.checkpoint_every = int(self.cfg.trainer.checkpoint_every)
        self.tokens_per_step = int(self.cfg.data.global_batch_size) * int(self.data.tokens_per_sample)
        # what throughput counts: "samples" for image data; a dataset that says nothing (chat, a user's) counts tokens
        self.unit = str(getattr(self.data, "unit", "tokens"))
        self.callbacks = build_callbacks(self.cfg.trainer.get("callbacks"))
        self.sinks: list[Sink] = []
        """Rank 0's sinks (``fit``'s); none on the other ranks."""
        self.preemption: StopFlag | None = None
        """``fit``'s stop-signal flag (a callback may wait for it)."""
        self.stats = StepStats()
        self.instruments = StepInstruments(ctx=ctx, tokens_per_step=self.tokens_per_step)
        self.first_loss: float | None = None
        """The run's first logged loss (a resumed run: the first one metrics.jsonl holds), at ``first_loss_step``."""
        self.first_loss_step: int | None = None
        self.last_loss: float | None = None
        self.skipped_steps: list[int] = []
        self.resumed_from: str | None = None
        self.started_at: float | None = None
        """perf_counter() when ``fit`` began."""
        self.step_started: float | None = None
        """perf_counter() when the current step began (a collective timeout cannot come sooner than timeout_s)."""
        self.first_step_s: float | None = None
        """Seconds from ``fit`` to the end of its first step (shape inference, first collectives): the summary's
        ``fit_to_first_step_s``; its ``time_to_first_step_s`` counts from the command's start (``ctx.clock``)."""
        self.first_step_end_unix: float | None = None
        self._checkpointer: Any = None
        self.val_history: list[tuple[int, float]] = []
        self._val_batches: list | None = None
        self._prefetch: Prefetcher | None = None
        self.data_wait_s = 0.0
        self.step_time_total_s = 0.0
        self.objective = ctx.loss_fn() if ctx.run.objective is not None else None
        """The preference loss (``models/preference.py``) whose pair statistics the log reads; None otherwise."""
        self.last_pairs: dict[str, float] = {}
        self.reference: dict[str, Any] | None = None
        lora = int(self.cfg.model.get("lora", {}).get("rank", 0) or 0) > 0
        self.frozen_reference = held_reference(self.cfg, engine=engine, lora=lora)
        """``trainer.preference.reference=copy``: the reference run on every batch (``resume`` copies the initial
        weights)."""

    # ---- the loop ----------------------------------------------------------------------------

    def fit(
        self, *, sinks: list[Sink] | None = None, start_step: int = 0, preemption: StopFlag | None = None
    ) -> dict[str, Any]:
        warn_small_batchnorm(self.engine, self.ctx)
        self.engine.train()
        self.sinks, self.preemption = list(sinks or []), preemption
        # What was built before the loop (imports, configs, the launcher's objects a forked worker inherited) lives
        # as long as the run: left out of later collections, whose full passes otherwise scan it and pause this
        # rank while the others wait at the next collective (docs/benchmarks.md). The worker froze it at its start
        # (trainer/launch/worker.py ``run``, fit's one caller) and keeps it frozen to its end (the model, a few
        # thousand objects, stays collectable). Not asked again here: gc.get_freeze_count() walks every frozen
        # object (about 530,000: 40-60 ms CPU a rank, each run).
        self.started_at = time.perf_counter()
        status, step = "completed", start_step
        if start_step > 0 and self.ctx.is_rank0:  # a resumed run's best validation loss counts earlier evaluations
            # and its first loss is the run's, not this attempt's ("loss 3.4747 -> 3.4747" after one more step)
            self.val_history, first = history_before(self.ctx.run_dir / "metrics.jsonl", through_step=start_step)
            if first is not None:
                self.first_loss_step, self.first_loss = first
        self.reference = attach_reference(trainer=self, start_step=start_step)  # before any batch is built
        if self.objective is not None:  # what a build-time loss call saw (pp.split=balanced's timing) is no step's
            self.objective.take(self.ctx.device)
        self._prefetch = Prefetcher(
            self.data.global_batch,
            first_step=start_step + 1,
            last_step=self.max_steps,
            depth=int(self.cfg.trainer.get("prefetch", 2)),
        )
        call(self.callbacks, "on_train_start", self, start_step=start_step)
        try:
            for step in range(start_step + 1, self.max_steps + 1):
                outcome = self.step(step, preemption=preemption)
                record = self._log(step, outcome)
                call(self.callbacks, "on_step_end", self, step=step, metrics=record or {"step": step})
                if self._boundary(step, outcome, preemption=preemption):
                    status = "preempted"
                    break
        except RuntimeError as exc:
            timeout = self._as_collective_timeout(exc, step)
            if timeout is None:
                raise
            raise timeout from None
        finally:
            self._prefetch.close()
        if self._checkpointer is not None:  # a background save still running: its marker comes now
            self._checkpointer.wait()
        summary = self._summary(wall=time.perf_counter() - self.started_at)
        summary.update(
            status=status,
            last_step=step,
            start_step=start_step,
            resumed_from=self.resumed_from,
            skipped_steps=self.skipped_steps,
            checkpoints_not_saved=self._checkpointer.failed_steps if self._checkpointer is not None else [],
        )
        call(self.callbacks, "on_train_end", self, summary=summary)
        return summary

    def step(self, step: int, *, preemption: StopFlag | None = None) -> StepOutcome:
        """One optimizer step: forward/backward and clip, agree across ranks, update (or skip), measure."""
        call(self.callbacks, "on_step_start", self, step=step)
        t0, cpu0 = time.perf_counter(), time.process_time()
        self.step_started = t0
        measured = self._should_measure(step)
        loss, grad_norm, data_s = self._forward_backward(step, measure=measured)
        pairs = self.objective.take(self.ctx.device) if self.objective is not None else None
        preempt, bad_ranks, mean_loss = self._agree(
            preempt=bool(preemption and preemption.requested),
            grad_norm=grad_norm,
            loss=loss,
            logged=self._should_log(step),
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self._update(step, bad_ranks)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        dt = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
        extras = self.engine.step_metrics()
        self.stats.add(dt, self.tokens_per_step, cpu_s=cpu_s)
        self.data_wait_s += data_s
        self.step_time_total_s += dt
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self.started_at
            self.first_step_end_unix = time.time()
            self.ctx.log.info(self.ctx.clock.line(f"first step done ({dt * 1000:.0f} ms)"))
        if self._eval_due(step) and not preempt:  # every rank: the evaluation is collective
            evaluation = self.evaluate(step)
            extras.update(evaluation)
            call(self.callbacks, "on_validation", self, step=step, metrics=evaluation)
        return StepOutcome(
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            seconds=dt,
            cpu_seconds=cpu_s,
            skipped=bool(bad_ranks),
            preempt=preempt,
            extras=extras,
            data_seconds=data_s,
            pairs=pairs,
            mean_loss=mean_loss,
            measured=measured,
        )

    def _forward_backward(self, step: int, *, measure: bool) -> tuple[torch.Tensor | None, torch.Tensor, float]:
        """This rank's share of the global batch through the engine: the loss, the gradient norm before
        clipping, and the seconds spent waiting for the batch."""
        if self._prefetch is None:  # step() called outside fit(): build batches in the loop
            self._prefetch = Prefetcher(self.data.global_batch, first_step=step, last_step=self.max_steps, depth=0)
        (inputs, targets), data_s = self._prefetch.get(step)
        self.engine.batch_targets = self._batch_targets(targets)
        x, y = self.engine.local_batch(self.ctx, inputs, targets)
        if self.frozen_reference is not None:
            y = self.frozen_reference.fill(self, x, y)
        self.optimizer.zero_grad(set_to_none=True)
        # saved activations and the engine's sampled comm meters on measured steps; profiler at trainer.profile_steps
        self.engine.measure_step = measure
        with self.instruments.step(step, measure=measure):
            loss = self.engine.train_step(x, y)
        call(self.callbacks, "on_after_backward", self, step=step, loss=loss)
        return loss, self.engine.clip_grad_norm_(self.max_grad_norm), data_s

    def _update(self, step: int, bad_ranks: list[int]) -> None:
        """``optimizer.step()``, unless a rank went non-finite: then stop, or skip the update."""
        if bad_ranks:
            what = f"non-finite loss or gradient norm at step {step} on rank(s) {bad_ranks}"
            if not self.skip_nonfinite:
                raise NonFiniteError(
                    f"{what}; stopped. Last good checkpoint: {self._latest_checkpoint()}. "
                    "Set trainer.on_nonfinite=skip to skip such steps instead"
                )
            self.ctx.log.warning("%s; step skipped (trainer.on_nonfinite=skip)", what)
            self.skipped_steps.append(step)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.engine.after_optimizer_step()
        self.scheduler.step()

    def _log(self, step: int, outcome: StepOutcome) -> dict[str, Any] | None:
        """On logged steps: the loss averaged over ranks (a collective), to the sinks (the console among them); the
        record (None on other steps)."""
        record = None
        if self._should_log(step) and not outcome.skipped:
            value = outcome.mean_loss
            if self.first_loss is None:
                self.first_loss, self.first_loss_step = value, step
            self.last_loss = value
            record = {
                "step": step,
                "loss": value,
                "lr": outcome.lr,
                "step_time_s": outcome.seconds,
                "step_cpu_s": outcome.cpu_seconds,
                "tokens_per_s": self.tokens_per_step / outcome.seconds,
                "grad_norm": float(outcome.grad_norm),
                "data_time_s": outcome.data_seconds,
                # mfu, memory, saved activations on measured steps (collective)
                **self.instruments.logged(step, outcome.seconds, measured=outcome.measured),
                **outcome.extras,
                **self._pair_means(outcome.pairs),
            }
            if self.unit == "samples":  # an image model: the same number, named for what it counts
                record["samples_per_s"] = int(self.cfg.data.global_batch_size) / outcome.seconds
            for sink in self.sinks:
                sink.log_step(record)
        for sink in self.sinks:
            sink.advance(step)
        return record

    def _pair_means(self, sums: torch.Tensor | None, *, prefix: str = "") -> dict[str, float]:
        """A preference objective's per-pair means (rewards, margin, accuracy, log-probs) over every rank's pairs
        (one all-reduce; every rank calls it on the same steps); empty for other objectives."""
        if sums is None:
            return {}
        if self.ctx.world_size > 1:
            dist.all_reduce(sums)
        means = mean_stats(sums, prefix=prefix)
        self.last_pairs.update(means)
        return means

    def _boundary(self, step: int, outcome: StepOutcome, *, preemption: StopFlag | None) -> bool:
        """Checkpoint when due or asked to stop; True when the run stops here (preempted)."""
        if outcome.preempt and preemption is not None:
            preemption.honoured()
        if self._checkpoint_due(step) or outcome.preempt:
            saved = self.checkpointer.save(step)
            if saved is not None:  # None: the save failed, or it completes in the background
                for sink in self.sinks:
                    sink.log_checkpoint(saved, step=step, loss=self.last_loss)
            call(self.callbacks, "on_checkpoint", self, step=step, path=saved)
            if outcome.preempt:  # the process exits next: the (possibly background) save must be complete
                self.checkpointer.wait()
        if not outcome.preempt:
            return False
        self.ctx.log.warning(
            "preempted (%s): checkpoint saved at step %d; `trainer.resume=auto` in the same folder continues",
            (preemption.name if preemption is not None else None) or "signal on another rank",
            step,
        )
        return True

    def _should_log(self, step: int) -> bool:
        return step == 1 or step % self.log_every == 0 or step == self.max_steps or self._eval_due(step)

    def _should_measure(self, step: int) -> bool:
        """A logged step that is the first logged one of its window of ``trainer.measure_every`` steps: the costlier
        measurements (collective timers, saved activations) run there. Decided from the step number alone, so a
        resumed run measures the steps an uninterrupted one would."""
        if not self._should_log(step):
            return False
        window_start = max(1, step - step % self.measure_every)
        return not any(self._should_log(s) for s in range(window_start, step))

    # ---- evaluation ----------------------------------------------------------------------------

    def _eval_due(self, step: int) -> bool:
        return self.eval_every > 0 and (step % self.eval_every == 0 or step == self.max_steps)

    def evaluate(self, step: int) -> dict[str, float]:
        """Validation loss over ``trainer.eval_batches`` held-out batches (the same ones every time), every
        rank through its engine's forward-only path: the mean over all their target tokens (each batch's token
        mean weighted by its count of targets); one all-reduce gives the mean over the ranks that computed a
        loss, as for the training loss."""
        ctx, engine = self.ctx, self.engine
        t0 = time.perf_counter()
        if self._val_batches is None:
            self._val_batches = [self.data.val_batch(i) for i in range(int(self.cfg.trainer.eval_batches))]
        buf = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        engine.train(False)
        try:
            for inputs, targets in self._val_batches:
                engine.batch_targets = self._batch_targets(targets)
                x, y = engine.local_batch(ctx, inputs, targets)
                if self.frozen_reference is not None:
                    y = self.frozen_reference.fill(self, x, y)
                loss = engine.eval_step(x, y)
                if loss is not None:
                    weight = float(self._count(targets))
                    buf[0] += loss.detach().double() * weight
                    buf[1] += weight
        finally:
            engine.train(True)
        if ctx.world_size > 1:
            dist.all_reduce(buf)
        value = (buf[0] / buf[1]).item() if buf[1] > 0 else float("nan")
        self.val_history.append((step, value))
        if self.objective is not None:  # a preference loss has no perplexity: its pair statistics instead
            pairs = self._pair_means(self.objective.take(ctx.device), prefix="val_")
            return {"val_loss": value, **pairs, "eval_time_s": time.perf_counter() - t0}
        ppl = math.exp(value) if value < 700 else float("inf")
        return {"val_loss": value, "val_ppl": ppl, "eval_time_s": time.perf_counter() - t0}

    def _batch_targets(self, targets: torch.Tensor) -> int | None:
        """The global batch's count of targets, counted on the host: the loss mesh's ranks share the batch out, so it
        is the count their all-reduce would sum (``Engine.batch_targets``: the step has one collective fewer). None
        where a share is more than a slice of ``targets`` (a preference objective's pairs and reference columns), the
        rows do not split evenly over dp, or the batch is not on the host (a count would wait for the device)."""
        if self.objective is not None or self.frozen_reference is not None or targets.device.type != "cpu":
            return None
        if targets.shape[0] % self.ctx.layout.dp:
            return None
        return int(count_targets(targets))

    def _count(self, targets: torch.Tensor) -> torch.Tensor:
        """What the loss is a mean over in ``targets``: target tokens, or a preference objective's pairs."""
        return self.objective.count(targets) if self.objective is not None else count_targets(targets)

    def _val_summary(self) -> dict[str, Any]:
        if not self.val_history:
            return {}
        best_step, best = min(self.val_history, key=lambda sv: sv[1])
        last_step, last = self.val_history[-1]
        ppl = {} if self.objective is not None else {"val_ppl": math.exp(last) if last < 700 else float("inf")}
        return {  # a preference loss has no perplexity
            "val_loss": last,
            **ppl,
            "val_step": last_step,
            "best_val_loss": best,
            "best_val_step": best_step,
            "val_history": [{"step": s, "val_loss": v} for s, v in self.val_history],
        }

    # ---- collectives -------------------------------------------------------------------------

    def _agree(
        self, *, preempt: bool, grad_norm: torch.Tensor, loss: torch.Tensor | None, logged: bool = False
    ) -> tuple[bool, list[int], float | None]:
        """One small all-reduce per step: did any rank get a stop signal, which ranks went non-finite (loss or
        gradient norm), and on ``logged`` steps the loss's mean over the ranks that computed one (each returned its
        part of the global token mean scaled by the loss mesh's size: ``parallel/foundation/token_loss.py``; NaN when
        none did, None on other steps). A float64 sum: each rank sets only its own flag, so the sum says what a
        maximum would. The values are set on the device and read once: the step's one wait for the GPU before the
        update, which has to know whether to skip."""
        n = self.ctx.world_size
        flags = torch.zeros(1 + n + (2 if logged else 0), dtype=torch.float64, device=self.ctx.device)
        if preempt:
            flags[0] = 1
        finite = torch.isfinite(grad_norm.to(flags.device))
        if loss is not None:
            finite &= torch.isfinite(loss.to(flags.device))
            if logged:
                flags[1 + n] = loss.detach().double()
                flags[2 + n] = 1.0
        flags[1 + self.ctx.rank] = ~finite
        if n > 1:
            dist.all_reduce(flags)
        values = flags.tolist()
        mean = None
        if logged:
            mean = values[1 + n] / values[2 + n] if values[2 + n] > 0 else float("nan")
        return values[0] > 0, [r for r in range(n) if values[1 + r] > 0], mean

    def _as_collective_timeout(self, exc: RuntimeError, step: int) -> CollectiveTimeout | None:
        """A collective that timed out, as an error naming the ranks that stopped answering; None otherwise."""
        waited = time.perf_counter() - (self.step_started or time.perf_counter())
        if isinstance(exc, NonFiniteError) or not is_collective_timeout(
            exc, waited_s=waited, timeout_s=float(self.cfg.topology.timeout_s)
        ):
            return None
        silent = [r for r in self._unresponsive_ranks(step) if r != self.ctx.rank]
        who = f"rank(s) {silent} stopped answering" if silent else "a rank stopped answering"
        return CollectiveTimeout(
            f"{who} at step {step}: no reply within topology.timeout_s="
            f"{self.cfg.topology.timeout_s}s ({str(exc).splitlines()[0][:200]})"
        )

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

    # ---- checkpoints ---------------------------------------------------------------------------

    @property
    def checkpointer(self):
        """Built on first use: ``torch.distributed.checkpoint`` costs ~0.9 s to import (it pulls in
        dynamo), which a fresh run should not pay before its first step."""
        if self._checkpointer is None:
            from trainer.checkpoint.checkpointer import Checkpointer

            self._checkpointer = Checkpointer(
                ctx=self.ctx, engine=self.engine, optimizer=self.optimizer, scheduler=self.scheduler
            )
        return self._checkpointer

    def resume(self) -> int:
        """Load the checkpoint this run continues from (collective); returns the step it ends at."""
        from trainer.checkpoint.files import checkpoints_root, complete_checkpoints, resolve_resume

        resume = str(self.cfg.trainer.resume)
        own = complete_checkpoints(checkpoints_root(self.ctx.run_dir))
        # a restarted or re-launched run continues from its own newest checkpoint, whatever it started from
        path = own[-1][1] if own and resume != "never" else resolve_resume(resume, self.ctx.run_dir)
        if path is None:
            start = self._init_from() if self.ctx.weights_from_checkpoint else 0
            if self.frozen_reference is not None:
                self.frozen_reference.take()
            return start
        if self.frozen_reference is not None:  # the reference is the weights the run started from, not the checkpoint's
            if self.ctx.weights_from_checkpoint:
                self._init_from()
            self.frozen_reference.take()
        self.resumed_from = str(path)
        self.ctx.log.info(self.ctx.clock.line(f"reading checkpoint {path}"))
        return self.checkpointer.load(path)

    def _init_from(self) -> int:
        """A fresh run from Hugging Face weights: each rank reads the slices it holds (trainer/hf/load.py)."""
        from trainer.checkpoint.checkpointer import state_view
        from trainer.hf.load import load_hf_weights

        folder = str(self.cfg.model.init_from)
        self.ctx.log.info(self.ctx.clock.line(f"reading the weights this rank holds from {folder}"))
        info = load_hf_weights(state_view(self.engine.model_parts), folder=folder, model_cfg=self.cfg.model)
        self.ctx.model_init["hf_load"] = info
        self.ctx.log.info("weights read from %s: %s", folder, info)
        return 0

    def _checkpoint_due(self, step: int) -> bool:
        return self.checkpoint_every > 0 and (step % self.checkpoint_every == 0 or step == self.max_steps)

    def _latest_checkpoint(self) -> str:
        from trainer.checkpoint.files import checkpoints_root, complete_checkpoints

        found = complete_checkpoints(checkpoints_root(self.ctx.run_dir))
        return str(found[-1][1]) if found else "none (trainer.checkpoint_every=0 or none written yet)"

    # ---- the summary -------------------------------------------------------------------------

    def _summary(self, *, wall: float) -> dict[str, Any]:
        ctx = self.ctx
        mine = (
            peak_memory_bytes(ctx.device),
            model_state_bytes(list(self.engine.parameters()), self.optimizer),
            self.stats.median_step_cpu_s(),
        )
        gathered = [mine]
        if ctx.world_size > 1:
            gathered = [None] * ctx.world_size
            dist.all_gather_object(gathered, mine)
        peaks = [g[0] for g in gathered]
        inits = [ctx.model_init]
        if ctx.world_size > 1:
            inits = [None] * ctx.world_size
            dist.all_gather_object(inits, ctx.model_init)
        extras = self.engine.summary()  # may hold collectives: called on every rank
        if ctx.is_rank0:  # a MoE run's expert-load heatmap, drawn from metrics.jsonl when the run ends
            announce_expert_load(run_dir=ctx.run_dir, summary=extras)
        perf = self.instruments.summary(step_times=self.stats.step_times)  # collective too
        if perf.get("profile_files"):
            artifacts = extras.setdefault("artifacts", {"images": {}, "files": []})
            artifacts.setdefault("files", []).extend(perf["profile_files"])
        return {
            "status": "completed",
            "strategy": ctx.layout.strategy,
            "steps": self.max_steps,
            "first_loss": self.first_loss,
            "first_loss_step": self.first_loss_step,
            "final_loss": self.last_loss,
            "tokens_per_s": self.stats.median_tokens_per_s(),
            # image data counts samples (one "token" each): the same median, named for what it counts
            **({"samples_per_s": self.stats.median_tokens_per_s()} if self.unit == "samples" else {}),
            "median_step_time_s": self.stats.median_step_time(),
            # each rank's process CPU seconds per steady step: the host's work, apart from waiting
            "median_step_cpu_s_per_rank": [g[2] for g in gathered],
            # from the command's start (trainer/observe/startup.py); fit_to_first_step_s: from the loop's
            "time_to_first_step_s": self.first_step_end_unix - ctx.clock.started_unix
            if self.first_step_end_unix is not None
            else None,
            "fit_to_first_step_s": self.first_step_s,
            "data_time_s_total": self.data_wait_s,
            "data_wait_fraction": self.data_wait_s / self.step_time_total_s if self.step_time_total_s else None,
            **self._val_summary(),
            **self.last_pairs,  # a preference objective's last logged pair statistics (val_: its last evaluation)
            **({"reference": self.reference} if self.reference else {}),
            "first_step_end_unix": self.first_step_end_unix,
            "wall_time_s": wall,
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_bytes_max": max(peaks),
            # parameters, gradients and optimizer state each rank holds (local shards), as the dry run counts
            "model_state_bytes_per_rank": [g[1] for g in gathered],
            "layout": ctx.layout.to_dict(),
            "model_init": {
                "init_device": ctx.model_init.get("init_device"),
                "lora_modules": ctx.model_init.get("lora_modules", 0),  # linear layers with adapters (models/lora.py)
                "full_fp32_bytes": ctx.model_init.get("full_fp32_bytes"),
                "local_param_bytes_per_rank": [i.get("local_param_bytes") for i in inits],
                "materialised_bytes_max_per_rank": [i.get("materialised_bytes_max") for i in inits],
                "build_peak_growth_bytes_per_rank": [i.get("build_peak_growth_bytes") for i in inits],
                **({"hf_load_per_rank": [i.get("hf_load") for i in inits]} if ctx.weights_from_checkpoint else {}),
            },
            **perf,
            **extras,
        }


def history_before(path: Path, *, through_step: int) -> tuple[list[tuple[int, float]], tuple[int, float] | None]:
    """What metrics.jsonl already holds up to ``through_step`` (a resumed run's earlier attempts): the
    (step, val_loss) of its evaluations and the (step, loss) of its first logged step (None: nothing logged)."""
    try:
        records = [r for r in read_metrics(path) if r.get("step", through_step + 1) <= through_step]
    except (OSError, ValueError):
        return [], None
    first = next(((int(r["step"]), float(r["loss"])) for r in records if "loss" in r), None)
    return [(int(r["step"]), float(r["val_loss"])) for r in records if "val_loss" in r], first
