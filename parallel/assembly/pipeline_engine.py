"""The pipeline engine behind parallel=pp, mp and hybrid: blocks split into stages, driven by a torch schedule.

How one rank gets its engine (``build_pipeline_engine``), in order:
1. split: explicit split points, or a policy (``parallel/pipeline/split.py``) — the same on every rank;
2. place: stage s runs on pp rank ``stage_ranks`` (one per rank, looped, or V; ``parallel/pipeline/schedules.py``);
3. build: each local stage is the full model pruned to its blocks, names kept (``parallel/pipeline/stages.py``),
   wrapped in ``parallel/assembly/compose.py``'s order (TP, AC, compile, FSDP2/DDP as the strategy's ``Composition``
   says; none for pp and mp), then a ``PipelineStage``;
4. schedule: torch's class for ``pp.schedule`` with ``scale_grads=False`` and the model family's loss
   (``ModelSpec.loss``) summed over each micro-batch's targets and divided by the step's count of targets over
   the loss mesh (``parallel/foundation/token_loss.py``, counted by the last stage before the schedule runs), so the
   accumulated gradient is exactly the gradient of the global batch's token-mean loss (torch's default
   ``scale_grads=True`` divides the accumulated gradients after the fact instead; torchtitan#1733);
5. tie: a tied embedding's copies on the first and last stage start equal and have their gradients summed over
   the embedding group after each step (``parallel/pipeline/tied.py``);
6. measure: every F/B/W action timed on its stage (``parallel/pipeline/timing.py``); per step the pp group
   exchanges a few numbers to give the measured bubble, per-stage busy time, imbalance and bytes sent, and
   on the loop's measured steps the peak activation memory; at ``pp.trace_step`` every rank's actions go to rank 0,
   which writes a Chrome trace and a Gantt PNG (``parallel/pipeline/timeline.py``).

``parallel=mp`` is the same machinery with its registry entry's ``FixedPipeline`` (one micro-batch, GPipe, blocks
split evenly): stages run strictly one after the other, and the same measurements show what that costs (per-stage
busy time, idle share, bytes sent). Composed stages (hybrid) add the tp group's and the dp dimension's
communication time.
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from models.moe import set_aux_loss_scale
from models.mtp import mtp_metrics
from parallel.assembly.compose import Composition, PipelinePlan, compose_on_rank
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.registry import strategy_spec
from parallel.foundation.expert_load import ExpertLoad
from parallel.foundation.intervals import IntervalLog, Meter, union_seconds
from parallel.foundation.rank_map import announce_rank_map
from parallel.foundation.run import ComposeSettings
from parallel.foundation.ties import tied_parameters
from parallel.foundation.token_loss import TokenMean
from parallel.pipeline.schedules import (
    action_order,
    bubble_parts,
    simulate,
)
from parallel.pipeline.split import SplitPlan, even_split, min_max_partition, profile_blocks, uniform_costs
from parallel.pipeline.stages import StageSpec, pipeline_parts, placed_stages
from parallel.pipeline.tied import TiedCopies, embedding_group, tied_copies
from parallel.pipeline.timing import StageRecorder, StepRecord, union_busy

#: per-rank numbers exchanged each step: window start/end, busy, bytes sent (act, grad), peak live act
_FIXED = 6


def choose_split(model: nn.Module, *, ctx: WorkerContext, num_stages: int) -> SplitPlan:
    """Split points for this run, identical on every rank (``balanced`` measures on rank 0 only)."""
    layout = ctx.layout
    pre, blocks, post = pipeline_parts(model, units=ctx.model_spec.pipeline)
    n = len(blocks)
    # torchtitan's weights: an embedding or a head counts as one block (when the model has one)
    uniform = uniform_costs(n, input_weight=1.0 if pre else 0.0, output_weight=1.0 if post else 0.0)
    if layout.split_points is not None:
        return SplitPlan(split_points=tuple(layout.split_points), policy="explicit", costs=uniform)
    strategy = strategy_spec(layout.strategy)
    if strategy is not None and strategy.fixed_pipeline is not None:  # parallel=mp: blocks shared evenly
        return SplitPlan(
            split_points=even_split(n, num_stages),
            policy="even",
            costs=uniform_costs(n, input_weight=0, output_weight=0),
        )
    policy = ctx.run.pipeline.split
    if policy == "balanced" and any(p.is_meta for p in model.parameters()):
        ctx.log.warning(
            "pp.split=balanced needs a built model to time its blocks; this one is on the meta "
            "device (model.init_device), so the split is uniform"
        )
        policy = "uniform"
    if policy == "balanced" and ctx.sample_batch is None:
        ctx.log.warning("pp.split=balanced needs a sample of the data to time the blocks on; the split is uniform")
        policy = "uniform"
    if policy == "uniform":
        costs = uniform
        return SplitPlan(split_points=min_max_partition(costs, num_stages), policy="uniform", costs=costs)
    # balanced: profile on global rank 0, share the result
    box: list[Any] = [None]
    if ctx.rank == 0:
        mb = max(1, ctx.per_replica_batch() // max(1, layout.micro_batches))
        inputs, targets = ctx.sample_batch(mb)
        # each part timed alone, the parts in the model's own order (pipeline_parts without the family's units)
        costs = profile_blocks(model, inputs[:mb], targets[:mb], loss_fn=ctx.loss_fn(), parts=pipeline_parts(model))
        box[0] = costs
        ctx.log.info(
            "balanced split: measured block costs (ms) pre %.2f, blocks %s, post %.2f",
            costs.pre * 1e3,
            [round(c * 1e3, 2) for c in costs.blocks],
            costs.post * 1e3,
        )
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    costs = box[0]
    return SplitPlan(split_points=min_max_partition(costs, num_stages), policy="balanced", costs=costs)


class PipelineEngine(Engine):
    """This rank's stages and their schedule; measures every action and reports per stage, plus, for composed
    stages, the techniques' meters (``Engine.meters``) and the dp dimension's collectives (``dp_timers``, one per
    stage)."""

    def __init__(
        self,
        *,
        ctx: WorkerContext,
        stages: list[Any],
        specs: list[StageSpec],
        schedule: Any,
        recorder: StageRecorder,
        plan: SplitPlan,
        part_names: tuple[list[str], list[str], list[str]],
        meters: list[Meter] | None = None,
        dp_timers: list[IntervalLog] | None = None,
        rank_map: dict[str, Any] | None = None,
        loss: TokenMean | None = None,
        tied: list[TiedCopies] | None = None,
    ):
        self.ctx = ctx
        self.moe = ctx.model_spec.moe is not None  # every rank knows: the balance's gather over pp is collective
        self.mtp = bool(getattr(ctx.run.model, "mtp_depth", 0))  # the MTP loss's sum over pp, too
        self.expert_load = ExpertLoad()
        self.loss = loss
        self.tied = [t for t in tied or () if t.active]
        self.uncounted = tuple(p for t in self.tied for p in t.uncounted)
        self.state_aliases = {k: v for t in self.tied for k, v in t.aliases.items()}
        self.meters = list(meters or ())
        self.dp_timers = dp_timers or []
        self.rank_map = rank_map or {}
        self._step_start = time.perf_counter()
        self.stages = stages
        self.specs = specs
        self.local_specs = [s for s in specs if s.pp_rank == ctx.coords["pp"]]
        self.schedule = schedule
        self.recorder = recorder
        self.plan = plan
        self.part_names = part_names
        self.model_parts = [st.submod for st in stages]
        for part in self.model_parts:  # a MoE's auxiliary loss scaled as the LM loss (loss / micro-batches)
            set_aux_loss_scale(part, 1.0 / ctx.layout.micro_batches)
        self.pp_group = ctx.mesh["pp"].get_group() if ctx.mesh is not None else None
        self.pp = ctx.layout.pp
        self.m = ctx.layout.micro_batches
        self.has_first = any(st.is_first for st in stages)
        self.has_last = any(st.is_last for st in stages)
        self.order = action_order(str(ctx.layout.schedule), pp=self.pp, micro_batches=self.m, schedule=schedule)
        self.bubble_theoretical = float(simulate(self.order, num_stages=len(specs))["bubble_fraction"])
        trace_step = ctx.run.pipeline.trace_step
        self.trace_step = min(trace_step, ctx.run.max_steps) if trace_step > 0 else 0
        self.steps = 0
        self.history: list[dict[str, Any]] = []
        self.artifacts: dict[str, Any] = {"images": {}, "files": []}
        self._last: StepRecord | None = None

    # ---- one step --------------------------------------------------------------------------------

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        self._step_start = time.perf_counter()
        self.steps += 1
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        args = (inputs,) if self.has_first else ()
        if self.has_last and self.loss is not None:
            self.loss.start(targets, global_count=self.batch_targets)
        self.recorder.begin_step(count_saved=self.measure_step)
        with ExitStack() as stack:
            self.metered(stack)
            self.schedule.step(*args, target=targets if self.has_last else None, losses=losses)
        for tied in self.tied:  # before the gradient norm: the copies' gradients summed into each
            tied.sync_grads()
        self._last = self.recorder.end_step()
        if not losses:
            return None
        return torch.stack([loss.detach() for loss in losses]).sum()  # each is already over the step's count

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The schedule's own forward-only path (``schedule.eval``: same micro-batches, no backward).

        torch re-initialises the stages when a schedule switches between eval and train, so this costs
        one extra shape exchange per switch. It must follow a training step (torch#162822: evaluating
        before the first ``step`` breaks the pipeline); the loop only evaluates after one. Its actions
        are recorded apart, so they never count in the training step's bubble or busy time.
        """
        if self.steps == 0:
            raise RuntimeError("pipeline eval_step before the first training step (torch#162822)")
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        args = (inputs,) if self.has_first else ()
        runtime = hasattr(self.schedule, "pipeline_order_with_comms")
        saved = self.schedule.pipeline_order_with_comms if runtime else None
        if runtime:
            self._use_forward_only_order()
        if self.has_last and self.loss is not None:
            self.loss.start(targets, global_count=self.batch_targets)
        self.recorder.begin_step(count_saved=False)  # no gradients: nothing is saved for backward
        try:
            with torch.no_grad():
                self.schedule.eval(*args, target=targets if self.has_last else None, losses=losses)
        finally:
            self.recorder.end_step()
            if runtime:
                self.schedule.pipeline_order_with_comms = saved
        if not losses:
            return None
        return torch.stack([loss.detach() for loss in losses]).sum()  # each is already over the batch's count

    def _use_forward_only_order(self) -> None:
        """Multi-stage schedules run an action list (torch's ``_PipelineScheduleRuntime``). In eval mode
        torch skips its backward actions, except where two stages share a rank (V placements: zbv,
        dualpipev), where it still hands gradients between them and fails. So evaluation runs the same
        schedule's forward actions only, in their order, lowered with their sends and receives once."""
        if getattr(self, "_eval_order", None) is None:
            from torch.distributed.pipelining.schedules import _ComputationType

            forward = _ComputationType.FORWARD
            order: dict[int, list[Any]] = {}
            for rank, actions in self.schedule.pipeline_order.items():
                flat = []
                for a in actions:
                    if a is None:
                        continue
                    flat += list(a.sub_actions) if getattr(a, "sub_actions", None) else [a]
                order[rank] = [a for a in flat if a.computation_type == forward]
            # torch's own lowering (``_prepare_schedule_with_comms`` without its check that every stage
            # has its backward actions, which a forward-only order cannot pass)
            from torch.distributed.pipelining.schedules import _add_send_recv, _add_unshard_reshard

            to_rank = dict(self.schedule.stage_index_to_group_rank)
            self._eval_order = _add_send_recv(
                {rank: _add_unshard_reshard(actions) for rank, actions in order.items()},
                stage_to_rank=lambda s: to_rank[s],
                num_stages=self.schedule._num_stages,
            )
        self.schedule.pipeline_order_with_comms = self._eval_order

    # ---- measurement -----------------------------------------------------------------------------

    def step_metrics(self) -> dict[str, Any]:
        out = {**self._comm_metrics(), **self._moe_metrics(), **self._mtp_metrics()}
        rec = self._last
        if rec is None:
            return out
        out.update(self._pipeline_metrics(rec))
        return out

    def _comm_metrics(self) -> dict[str, float]:
        """The techniques' meters and the dp dimension's (every local stage's, as one union) communication time."""
        elapsed = max(time.perf_counter() - self._step_start, 1e-9)  # the loop's step, as ModuleEngine's
        out = self.meter_metrics(elapsed)
        if self.dp_timers:
            intervals = [i for t in self.dp_timers for i in t.take_intervals()]
            busy = union_seconds(intervals)
            out.update(dp_comm_time_s=busy, comm_time_s=busy, comm_fraction=min(1.0, busy / elapsed))
            out[self.dp_timers[0].count_key] = len(intervals)
        return out

    def _moe_metrics(self) -> dict[str, Any]:
        """The step's expert balance and tokens per expert over every stage's MoE blocks (each stage's counts summed
        over dp, then the stages' tables gathered over pp; added up over the run for the summary)."""
        if not self.moe:
            return {}
        group = self.loss.group if self.loss is not None else None
        return self.expert_load.take_stages(
            self.model_parts,
            reduce=(lambda t: dist.all_reduce(t, group=group)) if group else None,
            gather=self._gather_over_pp if self.pp_group is not None and self.pp > 1 else None,
        )

    def _mtp_metrics(self) -> dict[str, Any]:
        """The MTP loss of the step: the last stage's, summed over dp, then over pp (the other stages add zeros)."""
        if not self.mtp:
            return {}
        groups = [g for g in (self.loss.group if self.loss is not None else None, self.pp_group) if g is not None]

        def reduce(t: torch.Tensor) -> None:
            for g in groups:
                dist.all_reduce(t, group=g)

        return mtp_metrics(self.model_parts, device=self.ctx.device, reduce=reduce if groups else None)

    def _gather_over_pp(self, mine: list) -> list[list]:
        gathered: list[Any] = [None] * self.pp
        dist.all_gather_object(gathered, mine, group=self.pp_group)
        return gathered

    def _pipeline_metrics(self, rec: StepRecord) -> dict[str, float]:
        busy = union_busy(rec.actions, start=rec.start, end=rec.end)
        local = [
            rec.start,
            rec.end,
            busy,
            rec.sent_activation_bytes,
            rec.sent_gradient_bytes,
            sum(rec.peak_live_activation_bytes.values()),
        ]
        per_stage = {}
        for spec in self.local_specs:
            acts = [a for a in rec.actions if a.stage == spec.index]
            per_stage[spec.index] = [sum(a.seconds for a in acts if a.kind == k) for k in "FBW"]
            per_stage[spec.index].append(rec.peak_live_activation_bytes.get(spec.index, 0))
        vec = local + [x for s in self.local_specs for x in per_stage[s.index]]
        rows = self._gather_pp(torch.tensor(vec, dtype=torch.float64))
        start = min(r[0] for r in rows)
        end = max(r[1] for r in rows)
        window = max(end - start, 1e-9)
        rank_busy = [r[2] for r in rows]
        stage_rows: dict[int, list[float]] = {}
        for pp_rank, row in enumerate(rows):
            specs = [s for s in self.specs if s.pp_rank == pp_rank]
            for k, spec in enumerate(specs):
                stage_rows[spec.index] = row[_FIXED + 4 * k : _FIXED + 4 * k + 4]
        stage_busy = [sum(stage_rows[s][:3]) for s in range(len(self.specs))]
        measured = 1.0 - sum(rank_busy) / (self.pp * window)
        per_action = {s: dict(zip("FBW", (t / self.m for t in row[:3]))) for s, row in stage_rows.items()}
        parts = bubble_parts(self.order, num_stages=len(self.specs), measured=measured, stage_costs=per_action)
        out: dict[str, float] = {
            "bubble_fraction": measured,
            "bubble_theoretical": self.bubble_theoretical,
            "bubble_schedule": parts["schedule"],
            "bubble_imbalance": parts["imbalance"],
            "bubble_overhead": parts["overhead"],
            "pipeline_time_s": window,
            "imbalance_ratio": max(stage_busy) / max(min(stage_busy), 1e-9),
            "activation_bytes_sent": sum(r[3] for r in rows),
            "gradient_bytes_sent": sum(r[4] for r in rows),
            "peak_activation_bytes": max(r[5] for r in rows),
        }
        for s, b in enumerate(stage_busy):
            out[f"stage{s}_busy_s"] = b
        for r, b in enumerate(rank_busy):
            out[f"rank{r}_idle_s"] = window - b
        self.history.append({"step": self.steps, **out, "stage_rows": stage_rows, "rank_busy": rank_busy})
        if self.steps == self.trace_step:
            self._write_timeline(rec)
        return out

    def _gather_pp(self, vec: torch.Tensor) -> list[list[float]]:
        if self.pp_group is None or self.pp == 1:
            return [vec.tolist()]
        # ranks hold different numbers of stages only if placement is uneven; pad to the longest
        size = _FIXED + 4 * max(sum(1 for s in self.specs if s.pp_rank == r) for r in range(self.pp))
        padded = torch.zeros(size, dtype=torch.float64)
        padded[: vec.numel()] = vec
        out = [torch.zeros_like(padded) for _ in range(self.pp)]
        dist.all_gather(out, padded, group=self.pp_group)
        return [t.tolist() for t in out]

    def _write_timeline(self, rec: StepRecord) -> None:
        from parallel.foundation.figures import draw_later
        from parallel.pipeline.timeline import write_chrome_trace, write_gantt_png

        mine = {
            "rank": self.ctx.rank,
            "pp_rank": self.ctx.coords["pp"],
            "start": rec.start,
            "end": rec.end,
            "actions": [(a.kind, a.stage, a.micro_batch, a.start, a.end) for a in rec.actions],
        }
        gathered: list[Any] | None = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
        if self.ctx.world_size > 1:
            dist.gather_object(mine, gathered, dst=0)
        else:
            gathered = [mine]
        if self.ctx.rank != 0:
            return
        folder = self.ctx.run_dir / "timeline"
        title = (
            f"{self.ctx.layout.strategy} {self.ctx.layout.schedule}, {len(self.specs)} stages on "
            f"{self.pp} ranks, m={self.m}, step {self.steps}"
        )
        trace = write_chrome_trace(folder / f"pipeline_step{self.steps}.trace.json", ranks=gathered, title=title)
        path = folder / f"pipeline_step{self.steps}.png"
        png = draw_later(path, lambda: write_gantt_png(path, ranks=gathered, title=title))  # at the end of the run
        self.artifacts["files"].append(str(trace))
        self.artifacts["images"]["pipeline_timeline"] = str(png)
        self.ctx.log.info("pipeline timeline of step %d: %s, %s (drawn when the run ends)", self.steps, trace, png)

    # ---- report ------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        hist = self.history[1:] or self.history  # step 1 includes shape inference
        stages = self._stage_rows(hist)
        pipeline = self._pipeline_summary(hist, stages)
        if self.ctx.rank == 0:
            self._log_stages(stages)
        out: dict[str, Any] = {
            "pipeline": pipeline,
            "bubble_fraction": pipeline["bubble_fraction"],
            "bubble_theoretical": self.bubble_theoretical,
        }
        out.update({k: v for k, v in self.rank_map.items() if k != "artifacts"})
        out.update(self.meter_summary())  # this rank's
        out.update(self.expert_load.summary())  # every stage's layers, summed over dp
        artifacts = [self.artifacts, self.rank_map.get("artifacts") or {}]
        images = {k: v for part in artifacts for k, v in part.get("images", {}).items()}
        files = [f for part in artifacts for f in part.get("files", [])]
        if images or files:
            out["artifacts"] = {"images": images, "files": files}
        return out

    def _stage_rows(self, hist: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each stage's median forward, backward and weight-gradient time, busy time and its measured and
        predicted share of the pipeline's work."""
        pre, _, post = self.part_names
        predicted = self.plan.predicted
        costs = self.plan.costs
        total_pred = sum(predicted) if predicted else None
        params = self._gather_params()
        stages = []
        for spec in self.specs:
            f = statistics.median(h["stage_rows"][spec.index][0] for h in hist) if hist else None
            b = statistics.median(h["stage_rows"][spec.index][1] for h in hist) if hist else None
            w = statistics.median(h["stage_rows"][spec.index][2] for h in hist) if hist else None
            busy = (f or 0) + (b or 0) + (w or 0)
            row = {
                "stage": spec.index,
                "pp_rank": spec.pp_rank,
                "layers": spec.describe(pre, post),
                "blocks": [spec.start, spec.stop],
                "parameters": params.get(spec.index),
                "forward_s": f,
                "backward_s": b,
                "weight_grad_s": w,
                "busy_s": busy,
                "busy_per_micro_batch_s": busy / self.m,
                "peak_activation_bytes": max(h["stage_rows"][spec.index][3] for h in hist) if hist else None,
            }
            if predicted:
                row["predicted_share"] = predicted[spec.index] / total_pred if total_pred else None
                if costs is not None and costs.unit == "s":
                    row["predicted_per_micro_batch_s"] = predicted[spec.index]
            stages.append(row)
        busy_all = sum(r["busy_s"] for r in stages) or 1.0
        for r in stages:
            r["measured_share"] = r["busy_s"] / busy_all
        return stages

    def _pipeline_summary(self, hist: list[dict[str, Any]], stages: list[dict[str, Any]]) -> dict[str, Any]:
        """summary.json's ``pipeline``: the schedule and split, the measured bubble and its parts (medians over the
        steps), the imbalance, the bytes sent, the stages' rows."""
        med = (lambda key: statistics.median(h[key] for h in hist)) if hist else (lambda key: None)
        return {
            "schedule": self.ctx.layout.schedule,
            "micro_batches": self.m,
            "stages_per_rank": self.ctx.layout.stages_per_rank,
            "num_stages": len(self.specs),
            "split_points": list(self.plan.split_points),
            "split_policy": self.plan.policy,
            "bubble_fraction": med("bubble_fraction") if hist else None,
            "bubble_theoretical": self.bubble_theoretical,
            # measured = schedule + imbalance + overhead (parallel/pipeline/schedules.py bubble_parts)
            "bubble_schedule": med("bubble_schedule") if hist else None,
            "bubble_imbalance": med("bubble_imbalance") if hist else None,
            # the remainder of the medians, so that the three parts add up to the reported bubble exactly
            "bubble_overhead": (med("bubble_fraction") - med("bubble_schedule") - med("bubble_imbalance"))
            if hist
            else None,
            # slowest over fastest stage, from each stage's median busy time (robust to one noisy step)
            "imbalance_ratio": (
                max(r["busy_s"] for r in stages) / max(min(r["busy_s"] for r in stages), 1e-9) if hist else None
            ),
            "activation_bytes_sent_per_step": med("activation_bytes_sent") if hist else None,
            "gradient_bytes_sent_per_step": med("gradient_bytes_sent") if hist else None,
            "pipeline_time_s": med("pipeline_time_s") if hist else None,
            "stages": stages,
        }

    def _log_stages(self, stages: list[dict[str, Any]]) -> None:
        for r in stages:
            pred = r.get("predicted_per_micro_batch_s")
            self.ctx.log.info(
                "stage %d (%s): %.2f ms busy per micro-batch%s, share %.0f%% (predicted %.0f%%)",
                r["stage"],
                r["layers"],
                r["busy_per_micro_batch_s"] * 1e3,
                f" (predicted {pred * 1e3:.2f} ms)" if pred is not None else "",
                100 * r["measured_share"],
                100 * (r.get("predicted_share") or 0.0),
            )

    def _gather_params(self) -> dict[int, int]:
        mine = {
            spec.index: sum(p.numel() for p in st.submod.parameters())
            for spec, st in zip(self.local_specs, self.stages)
        }
        if self.ctx.world_size == 1:
            return mine
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine)
        merged: dict[int, int] = {}
        for d in everyone:
            merged.update(d)
        return merged

    def close(self) -> None:
        self.schedule = None
        self.stages = []
        super().close()


def build_pipeline_engine(
    *,
    ctx: WorkerContext,
    composition: Composition,
    settings: ComposeSettings,
    model: nn.Module | None = None,
) -> PipelineEngine:
    """This rank's pipeline engine: the split chosen (the same on every rank), then ``compose`` cuts this rank's
    stages, wraps each (TP, AC, compile, FSDP2/DDP as ``composition`` says) and makes them ``PipelineStage``s
    under ``pp.schedule``."""
    layout = ctx.layout
    num_stages = layout.pp * layout.stages_per_rank
    model = model if model is not None else ctx.build_model(materialize=False)
    units = ctx.model_spec.pipeline
    part_names = pipeline_parts(model, units=units)
    plan = choose_split(model, ctx=ctx, num_stages=num_stages)
    specs = placed_stages(
        n_blocks=len(part_names[1]),
        split_points=plan.split_points,
        schedule=str(layout.schedule),
        pp=layout.pp,
        num_stages=num_stages,
    )
    ranks = [s.pp_rank for s in specs]
    pp_rank = ctx.coords["pp"]
    group = ctx.mesh["pp"].get_group()
    recorder = StageRecorder()
    m = layout.micro_batches
    loss = TokenMean(ctx.loss_fn(), loss_mesh=ctx.loss_mesh())

    def instrument(stage: Any, s: StageSpec) -> None:
        recorder.instrument(
            stage,
            sends_forward=not s.last and ranks[s.index + 1] != pp_rank,
            sends_backward=not s.first and ranks[s.index - 1] != pp_rank,
        )

    local_specs = [s for s in specs if s.pp_rank == pp_rank]
    ties = tied_parameters(model)  # (head, embedding) of a tied model, found before the stages are cut
    composed = compose_on_rank(
        ctx,
        model,
        composition=composition,
        pipeline=PipelinePlan(
            stages=local_specs,
            num_stages=num_stages,
            schedule=str(layout.schedule),
            micro_batches=m,
            loss_fn=recorder.wrap_loss(loss),
            group=group,
            units=units,
            instrument=instrument,
        ),
    )
    del model
    tied = _tie_stages(ctx, [c.module for c in composed.parts], ties=ties, ranks=ranks)
    if ctx.world_size > 1:
        dist.barrier(group=group)
    recorder.origin = time.perf_counter()
    ctx.log.info(
        "pipeline: %s, %d stages (split %s, %s), this rank runs %s",
        layout.schedule,
        num_stages,
        list(plan.split_points),
        plan.policy,
        "; ".join(f"stage {s.index}: {s.describe(part_names[0], part_names[2])}" for s in local_specs),
    )
    return _engine(ctx, composition, composed, specs=specs, recorder=recorder, plan=plan, part_names=part_names,
                   loss=loss, tied=tied, local_specs=local_specs)  # fmt: skip


def _tie_stages(ctx: WorkerContext, parts: list[nn.Module], *, ties: list, ranks: list[int]) -> list[TiedCopies]:
    """A tied embedding's copies on the first and the last stage, the last one's values taken from the first (a meta
    build draws each apart); the group of their pp ranks is made on every rank (its creation is collective)."""
    tied_group = embedding_group(ctx.mesh, first=ranks[0], last=ranks[-1]) if ties else None
    tied = [tied_copies(parts, alias=alias, original=original, group=tied_group) for alias, original in ties]
    for copies in tied:
        copies.sync_values()
    return tied


def _engine(
    ctx: WorkerContext,
    composition: Composition,
    composed: Any,
    *,
    specs: list[StageSpec],
    recorder: StageRecorder,
    plan: SplitPlan,
    part_names: tuple[list[str], list[str], list[str]],
    loss: TokenMean,
    tied: list[TiedCopies],
    local_specs: list[StageSpec],
) -> PipelineEngine:
    """The engine over the composed stages, with their meters, rank map and after-step hooks."""
    rank_map = (
        announce_rank_map(ctx, stage_modules=[c.module for c in composed.parts], stages=[s.index for s in local_specs])
        if composition.rank_map
        else None
    )
    engine = PipelineEngine(
        ctx=ctx,
        stages=composed.stages,
        specs=specs,
        schedule=composed.schedule,
        recorder=recorder,
        plan=plan,
        part_names=part_names,
        meters=composed.meters,
        dp_timers=[c.dp_timer for c in composed.parts if c.dp_timer is not None],
        rank_map=rank_map,
        loss=loss,
        tied=tied,
    )
    engine.after_update = composed.after_update
    engine.sample_shares = composed.sample_shares
    return engine
