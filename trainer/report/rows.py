"""One row per sweep job, the best configuration and the Pareto front (throughput vs peak memory).

Completed jobs take their numbers from ``summary.json``; skipped and failed jobs take their layout
from the composed config Hydra saved (``.hydra/config.yaml``), so the report shows what was asked
for and why it did not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.sweeps.jobs import SweepJob

MIB = 1024 * 1024


@dataclass
class ReportRow:
    job: int
    status: str
    strategy: str
    dp: int
    tp: int
    pp: int
    schedule: str | None
    micro_batches: int | None
    split_points: list[int] | None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    bubble_measured: float | None = None
    bubble_theoretical: float | None = None
    bubble_schedule: float | None = None
    bubble_imbalance: float | None = None
    bubble_overhead: float | None = None
    """The measured bubble's parts (schedule + imbalance + overhead = measured; parallel/pipeline/schedules.py)."""
    peak_memory_per_stage: list[int] = field(default_factory=list)  # bytes, max over the stage's ranks
    predicted_step_time_s: float | None = None
    """The planner's prediction for this job's layout (parallel/plan), from the job's own config."""
    val_loss: float | None = None  # the last evaluation's (trainer.eval_every > 0)
    best_val_loss: float | None = None
    reason: str = ""
    best: bool = False
    pareto: bool = False

    @property
    def layout(self) -> str:
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}"

    @property
    def split(self) -> str:
        return "-" if not self.split_points else ",".join(str(s) for s in self.split_points)

    @property
    def prediction_error(self) -> float | None:
        """(predicted - measured) / measured step time."""
        if self.predicted_step_time_s is None or not self.step_time_s:
            return None
        return (self.predicted_step_time_s - self.step_time_s) / self.step_time_s

    @property
    def peak_memory(self) -> int | None:
        return max(self.peak_memory_per_stage) if self.peak_memory_per_stage else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _split(value: Any) -> list[int] | None:
    return [int(v) for v in value] if isinstance(value, list) and value else None


def peak_memory_per_stage(summary: dict[str, Any]) -> list[int]:
    """Peak bytes per pipeline stage (the max over the ranks holding it; one value without pp)."""
    peaks = summary.get("peak_memory_bytes_per_rank") or []
    rank_map = (summary.get("layout") or {}).get("rank_map") or []
    stage_of = {int(r["rank"]): int(r.get("pp", 0)) for r in rank_map}
    per_stage: dict[int, int] = {}
    for rank, peak in enumerate(peaks):
        if isinstance(peak, (int, float)):
            stage = stage_of.get(rank, 0)
            per_stage[stage] = max(per_stage.get(stage, 0), int(peak))
    return [per_stage[s] for s in sorted(per_stage)]


def _from_summary(job: SweepJob) -> ReportRow:
    s = job.summary or {}
    layout = s.get("layout") or {}
    pipe = s.get("pipeline") or {}
    return ReportRow(
        job=job.num,
        status=job.status,
        strategy=str(layout.get("strategy", s.get("strategy", "?"))),
        dp=int(layout.get("dp", 1)),
        tp=int(layout.get("tp", 1)),
        pp=int(layout.get("pp", 1)),
        schedule=pipe.get("schedule", layout.get("schedule")),
        micro_batches=_int(pipe.get("micro_batches", layout.get("micro_batches"))),
        split_points=_split(pipe.get("split_points", layout.get("split_points"))),
        tokens_per_s=_float(s.get("tokens_per_s")),
        step_time_s=_float(s.get("median_step_time_s")),
        bubble_measured=_float(pipe.get("bubble_fraction", s.get("bubble_fraction"))),
        bubble_theoretical=_float(pipe.get("bubble_theoretical", s.get("bubble_theoretical"))),
        bubble_schedule=_float(pipe.get("bubble_schedule")),
        bubble_imbalance=_float(pipe.get("bubble_imbalance")),
        bubble_overhead=_float(pipe.get("bubble_overhead")),
        peak_memory_per_stage=peak_memory_per_stage(s),
        predicted_step_time_s=planner_prediction(job.config),
        val_loss=_float(s.get("val_loss")),
        best_val_loss=_float(s.get("best_val_loss")),
        reason=job.reason,
    )


def planner_prediction(config: dict[str, Any]) -> float | None:
    """Step time the planner predicts for the layout a job's composed config asks for; None where it
    cannot describe the job (a model it does not know, an unreadable config)."""
    if not config:
        return None
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from parallel.plan.api import predicted_step_time
    from parallel.plan.specs import PlanError
    from trainer.typed.planner_request import planner_request
    from trainer.typed.run_spec import run_spec
    from trainer.validate import ConfigError, build_layout

    try:
        cfg = OmegaConf.create(config)
        request = planner_request(cfg)
        run = run_spec(cfg, build_layout(cfg), model=request.model_config)
        return predicted_step_time(run, request)
    except (PlanError, ConfigError, OmegaConfBaseException, KeyError, TypeError, ValueError):
        return None


def _from_config(job: SweepJob) -> ReportRow:
    c = job.config
    pp = c.get("pp") or {}
    pp_size = _int(pp.get("size")) or 1
    strategy = str((c.get("parallel") or {}).get("name", "?"))
    piped = strategy in ("pp", "hybrid") or pp_size > 1
    return ReportRow(
        job=job.num,
        status=job.status,
        strategy=strategy,
        dp=_int((c.get("dp") or {}).get("size")) or 1,
        tp=_int((c.get("tp") or {}).get("size")) or 1,
        pp=pp_size,
        schedule=pp.get("schedule") if piped else None,
        micro_batches=_int(pp.get("micro_batches")) if piped else None,
        split_points=_split(pp.get("split_points")) if piped else None,
        reason=job.reason,
    )


#: what the report can rank by: summary key -> (label, True when higher is better)
RANK_KEYS = {"tokens_per_s": ("tokens/s", True), "val_loss": ("validation loss", False)}


def build_rows(jobs: list[SweepJob], *, rank_by: str | None = None) -> list[ReportRow]:
    """One row per job, in job order; with ``rank_by``, best first (jobs without that number last)."""
    rows = [_from_summary(j) if j.summary is not None else _from_config(j) for j in jobs]
    mark_best_and_pareto(rows, rank_by=rank_by or "tokens_per_s")
    if rank_by is not None:
        higher = RANK_KEYS[rank_by][1]

        def key(r: ReportRow) -> tuple[int, float, int]:
            v = getattr(r, rank_by) if r.status == "completed" else None
            return (1, 0.0, r.job) if v is None else (0, -v if higher else v, r.job)

        rows.sort(key=key)
    return rows


def mark_best_and_pareto(rows: list[ReportRow], *, rank_by: str = "tokens_per_s") -> None:
    """Best: the highest tokens/s (or the lowest validation loss with ``rank_by="val_loss"``). Pareto
    front: no other job is at least as fast with at most as much peak memory (and strictly better in one)."""
    if rank_by not in RANK_KEYS:
        raise ValueError(f"rank_by={rank_by!r}: use one of {', '.join(RANK_KEYS)}")
    ranked = [r for r in rows if r.status == "completed" and getattr(r, rank_by) is not None]
    if ranked:
        pick = max if RANK_KEYS[rank_by][1] else min
        pick(ranked, key=lambda r: getattr(r, rank_by)).best = True
    measured = [r for r in rows if r.status == "completed" and r.tokens_per_s is not None]
    if not measured:
        return
    for r in measured:
        if r.peak_memory is None:
            continue
        r.pareto = not any(
            q is not r
            and q.peak_memory is not None
            and q.tokens_per_s >= r.tokens_per_s
            and q.peak_memory <= r.peak_memory
            and (q.tokens_per_s > r.tokens_per_s or q.peak_memory < r.peak_memory)
            for q in measured
        )
