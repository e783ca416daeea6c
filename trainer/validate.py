"""Refuse a bad config before any worker starts, with every problem named at once.

Each check reads the composed config (and the layout derived from it) and reports problems as
"key=value: what is wrong; what would fix it". Checks are plain functions in ``CHECKS``; a strategy
module adds its own rules by appending to it. No torch import: refusing takes well under a second.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from omegaconf import DictConfig, ListConfig, OmegaConf

from conf.schema import STRATEGIES
from parallel.core.layout import ParallelLayout, describe_factorization, factorizations, why_dp_needs_fsdp
from trainer.launch.environment import ExternalLaunch, detect_external_launch


class ConfigError(ValueError):
    """One or more settings cannot work together; the message lists each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({len(self.problems)} problem(s)); no worker was started:\n{lines}")


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def error(self, msg: str) -> None:
        self.problems.append(msg)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


@dataclass(frozen=True)
class ValidatedRun:
    layout: ParallelLayout
    warnings: tuple[str, ...]
    external: ExternalLaunch | None


Check = Callable[[DictConfig, ParallelLayout, Findings], None]

#: dimensions each built-in strategy may use (others must be 1)
STRATEGY_DIMS = {
    "single": (),
    "dp": (),
    "ddp": ("dp",),
    "fsdp": ("dp",),
    "tp": ("tp",),
    "pp": ("pp",),
    "mp": ("pp",),
    "hybrid": ("dp", "tp", "pp"),
}
PIPELINED = ("pp", "mp", "hybrid")


def _nearest_multiples(value: int, base: int) -> str:
    """The multiples of ``base`` around ``value`` ("14 or 16" for 15 and 2)."""
    lo = (value // base) * base
    hi = lo + base
    return str(hi) if lo < base else f"{lo} or {hi}"


def split_points_of(cfg: DictConfig) -> tuple[int, ...] | None:
    """The explicit split points of the run (mp.split_points for mp), or None when a policy decides."""
    raw = cfg.mp.split_points if cfg.parallel.name == "mp" else cfg.pp.split_points
    if raw is None or (isinstance(raw, str) and raw.lower() == "auto"):
        return None
    if isinstance(raw, int):
        raw = [raw]
    if isinstance(raw, (list, tuple, ListConfig)):
        return tuple(int(x) for x in raw) if len(raw) else None
    raise ConfigError([f"split points {raw!r}: expected a list of block indices like [2] or 'auto'"])


def build_layout(cfg: DictConfig, external: ExternalLaunch | None = None) -> ParallelLayout:
    dp, tp, pp = int(cfg.dp.size), int(cfg.tp.size), int(cfg.pp.size)
    product = dp * tp * pp
    if external is not None:
        nnodes, nproc = external.nnodes, external.local_world_size
    else:
        nnodes = int(cfg.topology.nnodes)
        nproc = cfg.topology.nproc_per_node
        nproc = int(nproc) if nproc is not None else max(1, math.ceil(product / max(1, nnodes)))
    # hybrid with pp.size=1 has no pipeline: it accumulates data.micro_batch_size chunks instead
    pipelined = pp > 1 or (cfg.parallel.name in PIPELINED and cfg.parallel.name != "hybrid")
    return ParallelLayout(
        strategy=str(cfg.parallel.name),
        dp=dp,
        tp=tp,
        pp=pp,
        nnodes=nnodes,
        nproc_per_node=nproc,
        micro_batches=int(cfg.pp.micro_batches) if pipelined else 1,
        schedule=str(cfg.pp.schedule) if pipelined else None,
        stages_per_rank=int(cfg.pp.stages_per_rank) if pipelined else 1,
        split_points=split_points_of(cfg) if pipelined else None,
        dp_shard=bool(cfg.dp.shard) or cfg.parallel.name == "fsdp" or (dp > 1 and (tp > 1 or pp > 1)),
    )


# ---- checks ---------------------------------------------------------------------------------


def check_positive(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    keys = {
        "dp.size": cfg.dp.size,
        "tp.size": cfg.tp.size,
        "pp.size": cfg.pp.size,
        "pp.micro_batches": cfg.pp.micro_batches,
        "pp.stages_per_rank": cfg.pp.stages_per_rank,
        "topology.nnodes": cfg.topology.nnodes,
        "trainer.max_steps": cfg.trainer.max_steps,
        "trainer.log_every": cfg.trainer.log_every,
        "data.global_batch_size": cfg.data.global_batch_size,
        "data.seq_len": cfg.data.seq_len,
        "topology.threads_per_rank": cfg.topology.threads_per_rank,
    }
    if cfg.topology.nproc_per_node is not None:
        keys["topology.nproc_per_node"] = cfg.topology.nproc_per_node
    if cfg.data.get("micro_batch_size") is not None:
        keys["data.micro_batch_size"] = cfg.data.micro_batch_size
    for key, value in keys.items():
        if value is None or int(value) < 1:
            f.error(f"{key}={value}: must be a positive integer (>= 1)")
    if cfg.trainer.checkpoint_every < 0:
        f.error(f"trainer.checkpoint_every={cfg.trainer.checkpoint_every}: must be >= 0 (0 disables)")
    if cfg.topology.timeout_s <= 0:
        f.error(f"topology.timeout_s={cfg.topology.timeout_s}: must be > 0 seconds")


def check_strategy(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    name = cfg.parallel.name
    if name not in STRATEGY_DIMS:
        if name not in STRATEGIES and cfg.parallel._target_.startswith("parallel."):
            f.error(f"parallel.name={name}: unknown strategy; use one of {', '.join(STRATEGIES)}")
        return
    allowed = STRATEGY_DIMS[name]
    for dim in ("dp", "tp", "pp"):
        size = getattr(layout, dim)
        if size > 1 and dim not in allowed:
            if name == "dp":
                hint = "parallel=dp is one process driving all local GPUs; use parallel=ddp for dp.size > 1"
            else:
                hint = f"use parallel=hybrid to combine dimensions, or set {dim}.size=1"
            f.error(f"{dim}.size={size} with parallel={name}: {name} does not use the {dim} dimension; {hint}")


def check_world(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    if layout.world_size < 1:
        return
    workers = layout.nnodes * layout.nproc_per_node
    if cfg.parallel.name == "dp" and workers > 1:
        f.error(
            f"parallel=dp with {workers} workers (topology.nnodes={layout.nnodes} x "
            f"topology.nproc_per_node={layout.nproc_per_node}): DataParallel is a single process; "
            "use parallel=ddp for several processes, or set topology.nproc_per_node=1"
        )
        return
    if workers != layout.world_size:
        fits = "; ".join(describe_factorization(*t) for t in factorizations(workers)[:6])
        f.error(
            f"dp.size={layout.dp} x tp.size={layout.tp} x pp.size={layout.pp} = {layout.world_size} "
            f"but topology.nnodes={layout.nnodes} x topology.nproc_per_node={layout.nproc_per_node} = "
            f"{workers} workers. Layouts that fit {workers} workers: {fits}. "
            f"Or set topology.nproc_per_node={max(1, layout.world_size // max(1, layout.nnodes))} "
            "(null follows the layout)"
        )


def check_external(cfg: DictConfig, layout: ParallelLayout, external: ExternalLaunch, f: Findings) -> bool:
    """Started by srun or submitit: the task count is fixed by the launcher, so the fix names its keys
    (under torchrun, check_world's message names topology.* as before)."""
    keys = {
        "slurm": "hydra.launcher.nodes x hydra.launcher.tasks_per_node (SLURM_NTASKS)",
        "submitit_local": "hydra.launcher.tasks_per_node",
    }.get(external.kind)
    product = int(cfg.dp.size) * int(cfg.tp.size) * int(cfg.pp.size)
    if keys is None or external.world_size == product:
        return False
    fits = "; ".join(describe_factorization(*t) for t in factorizations(external.world_size)[:6])
    f.error(
        f"{external.kind} started {external.world_size} tasks ({external.nnodes} node(s) x "
        f"{external.local_world_size}) but dp.size={cfg.dp.size} x tp.size={cfg.tp.size} x pp.size={cfg.pp.size} "
        f"= {product} ranks. Set {keys} to {product} in all, or choose a layout for {external.world_size} "
        f"ranks: {fits}"
    )
    return True


def check_batch(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    gbs = int(cfg.data.global_batch_size)
    if gbs < 1 or layout.dp < 1:
        return
    if gbs % layout.dp:
        f.error(
            f"data.global_batch_size={gbs} is not divisible by dp.size={layout.dp}: every replica needs "
            f"the same number of samples; use data.global_batch_size={_nearest_multiples(gbs, layout.dp)}"
        )
        return
    per_rank = gbs // layout.dp
    mbs = cfg.data.get("micro_batch_size")
    if layout.schedule is not None:
        m = layout.micro_batches
        if m >= 1 and per_rank % m:
            f.error(
                f"data.global_batch_size={gbs} / dp.size={layout.dp} = {per_rank} samples per replica is not "
                f"divisible by pp.micro_batches={m}; use data.global_batch_size="
                f"{_nearest_multiples(gbs, layout.dp * m)} or a pp.micro_batches dividing {per_rank}"
            )
        elif mbs is not None and m >= 1 and mbs * m != per_rank:
            f.error(
                f"data.micro_batch_size={mbs} disagrees with pp.micro_batches={m} "
                f"({per_rank} samples per replica / {m} = {per_rank // m}); set data.micro_batch_size=null"
            )
    elif mbs is not None and mbs >= 1 and per_rank % int(mbs):
        f.error(
            f"data.micro_batch_size={mbs} does not divide the {per_rank} samples per replica "
            f"(data.global_batch_size={gbs} / dp.size={layout.dp}); choose a divisor of {per_rank}"
        )


def check_data(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    path = cfg.data.get("path")
    if path and not os.path.exists(os.path.expanduser(str(path))):
        f.error(f"data.path={path}: no such file; point it at a UTF-8 text file or a .npy/.bin token file")
    model = cfg.model
    if "max_seq_len" in model and int(model.max_seq_len) < int(cfg.data.seq_len):
        f.error(
            f"data.seq_len={cfg.data.seq_len} exceeds model.max_seq_len={model.max_seq_len}; "
            f"lower data.seq_len or raise model.max_seq_len"
        )
    if model.get("planner_only", False):
        f.error(
            f"model={model.name} is a description for the planner, too big to build here; plan it with "
            f"python -m parallel.plan model={model.name} topology=..., or train model=gpt_small"
        )
    if "n_heads" in model and "d_model" in model and int(model.d_model) % max(1, int(model.n_heads)):
        f.error(f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}")


def check_backend(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    if cfg.topology.backend not in ("auto", "gloo", "nccl"):
        f.error(f"topology.backend={cfg.topology.backend}: use auto, gloo or nccl")
    if cfg.topology.device not in ("auto", "cpu", "cuda"):
        f.error(f"topology.device={cfg.topology.device}: use auto, cpu or cuda")
    if cfg.topology.backend == "nccl" and cfg.topology.device == "cpu":
        f.error("topology.backend=nccl with topology.device=cpu: NCCL needs CUDA; use topology.backend=gloo")
    if cfg.dp.sync_batchnorm and cfg.topology.device == "cpu":
        f.error(
            "dp.sync_batchnorm=true with topology.device=cpu: torch's SyncBatchNorm runs on CUDA only; "
            "on CPU raise data.global_batch_size so each rank sees >= 8 samples instead"
        )
    if cfg.logger.wandb.mode not in ("offline", "online", "disabled"):
        f.error(f"logger.wandb.mode={cfg.logger.wandb.mode}: use offline, online or disabled")
    if cfg.trainer.on_nonfinite not in ("stop", "skip"):
        f.error(f"trainer.on_nonfinite={cfg.trainer.on_nonfinite}: use stop or skip")


def model_blocks(model: DictConfig) -> int | None:
    """Number of splittable blocks of the configured model, when its config tells (GPT, CNN)."""
    if "n_layers" in model:
        return int(model.n_layers)
    if "channels" in model:
        return len(model.channels)
    return None


def check_pipeline(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """Schedule, micro-batches, stages per rank and split points of pp / mp / hybrid runs."""
    from parallel.pipeline.schedules import SCHEDULES
    from parallel.pipeline.split import POLICIES

    if layout.schedule is None:
        return
    name = cfg.parallel.name
    m, pp, v = layout.micro_batches, layout.pp, layout.stages_per_rank
    num_stages = pp * v
    split_key = "mp.split_points" if name == "mp" else "pp.split_points"
    if name == "mp":
        if m != 1:
            f.error(
                f"pp.micro_batches={m} with parallel=mp: model parallel runs one micro-batch through the "
                "stages in turn; use parallel=pp to pipeline micro-batches, or set pp.micro_batches=1"
            )
        if layout.schedule != "gpipe" or v != 1:
            f.error(
                f"pp.schedule={layout.schedule} pp.stages_per_rank={v} with parallel=mp: model parallel "
                "runs stages in order (gpipe, one stage per rank); use parallel=pp for other schedules"
            )
    spec = SCHEDULES.get(layout.schedule)
    if spec is None:
        f.error(f"pp.schedule={layout.schedule}: unknown schedule; use one of {', '.join(SCHEDULES)}")
    else:
        problem = spec.stages_per_rank_problem(v)
        if problem:
            f.error(f"pp.stages_per_rank={v} with pp.schedule={spec.name}: {spec.name} {problem}")
        else:
            problem = spec.micro_batch_problem(micro_batches=m, pp=pp, stages=num_stages)
            if problem:
                per_replica = int(cfg.data.global_batch_size) // max(1, layout.dp)
                ok = spec.suggest_micro_batches(pp=pp, stages=num_stages, per_replica=per_replica)
                fix = (
                    f"use pp.micro_batches={' or '.join(map(str, ok))}"
                    if ok
                    else f"raise data.global_batch_size so it holds at least {num_stages} micro-batches per replica"
                )
                f.error(
                    f"pp.micro_batches={m} with pp.schedule={spec.name}: {spec.name} {problem}; {fix}"
                    + ("" if spec.name != "1f1b" else ", or pp.schedule=gpipe")
                )
    if str(cfg.pp.split) not in POLICIES:
        f.error(f"pp.split={cfg.pp.split}: unknown split policy; use one of {', '.join(POLICIES)}")
    if int(cfg.pp.trace_step) < 0:
        f.error(f"pp.trace_step={cfg.pp.trace_step}: must be >= 0 (0 writes no timeline)")
    n = model_blocks(cfg.model)
    if n is None:
        return
    if num_stages > n:
        f.error(
            f"pp.size={pp} x pp.stages_per_rank={v} = {num_stages} stages but model.n_layers={n}: every stage "
            f"needs at least one block; use at most {n} stages or a deeper model"
        )
        return
    points = layout.split_points
    if points is None:
        return
    shown = list(points)
    if len(points) != num_stages - 1:
        f.error(
            f"{split_key}={shown}: {len(points)} split point(s) make {len(points) + 1} stages but the layout has "
            f"{num_stages} (pp.size={pp} x pp.stages_per_rank={v}); give {num_stages - 1} block indices"
        )
    bad = [p for p in points if not 0 < p < n]
    if bad:
        f.error(
            f"{split_key}={shown}: {bad} out of range; split points are block indices where a new stage "
            f"starts, between 1 and {n - 1} for model.n_layers={n}"
        )
    elif any(b <= a for a, b in zip(points, points[1:])):
        f.error(
            f"{split_key}={shown}: split points must be strictly increasing (a repeated point leaves an "
            "empty stage); e.g. " + str(list(range(1, num_stages)) if num_stages <= n else [])
        )


def check_tensor_parallel(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """What the GPT tensor-parallel plan (models/gpt/parallelize.py) needs from the model's sizes."""
    tp, model = layout.tp, cfg.model
    if tp == 1:
        if cfg.tp.sequence_parallel or cfg.tp.loss_parallel:
            f.warn("tp.sequence_parallel / tp.loss_parallel have no effect with tp.size=1")
        return
    if "n_heads" not in model:
        f.error(
            f"tp.size={tp} with model.name={model.get('name')}: the tensor-parallel plan exists for the GPT "
            "(models/gpt/parallelize.py); use model=gpt_small, or tp.size=1 with parallel=ddp or fsdp"
        )
        return
    heads, d_model = int(model.n_heads), int(model.d_model)
    widths = [int(w) for w in (model.get("layer_d_ff") or [])] or [int(model.get("d_ff") or 0) or 4 * d_model]
    if heads % tp:
        f.error(
            f"model.n_heads={heads} is not divisible by tp.size={tp}: each tp rank owns whole attention heads; "
            f"use a tp.size dividing {heads}"
        )
    if d_model % tp:
        f.error(
            f"model.d_model={d_model} is not divisible by tp.size={tp}: wq/wk/wv/wo are split by columns; "
            f"use a model.d_model that is a multiple of {tp}"
        )
    for width in sorted(set(widths)):
        if width % tp:
            f.error(
                f"feed-forward width {width} (model.d_ff / model.layer_d_ff) is not divisible by tp.size={tp}: "
                f"w1/w2 are split by it; use a multiple of {tp}"
            )
    if cfg.tp.loss_parallel and int(model.vocab_size) % tp:
        f.error(
            f"model.vocab_size={model.vocab_size} is not divisible by tp.size={tp} with tp.loss_parallel=true; "
            "set tp.loss_parallel=false"
        )
    if cfg.tp.loss_parallel and layout.pp > 1:
        f.error(
            f"tp.loss_parallel=true with pp.size={layout.pp}: the pipeline schedule computes the loss outside "
            "loss_parallel() on plain tensors; set tp.loss_parallel=false (the head then gathers the logits)"
        )
    if cfg.tp.sequence_parallel and int(cfg.data.seq_len) % tp:
        f.error(
            f"data.seq_len={cfg.data.seq_len} is not divisible by tp.size={tp} with tp.sequence_parallel=true: "
            f"the sequence is split over tp ranks; use data.seq_len={_nearest_multiples(int(cfg.data.seq_len), tp)}"
        )


def check_dp_composition(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """With tp > 1 or pp > 1 the dp dimension is FSDP2 (build_layout sets dp_shard): say so and why."""
    if layout.dp > 1 and (layout.tp > 1 or layout.pp > 1) and not cfg.dp.shard:
        f.warn(
            f"dp.shard=false with dp.size={layout.dp}: the dp dimension uses FSDP2 fully_shard instead of DDP "
            f"(same numerics) because {why_dp_needs_fsdp(layout)}. Set dp.shard=true to silence this."
        )


CHECKS: list[Check] = [
    check_positive,
    check_strategy,
    check_world,
    check_batch,
    check_data,
    check_backend,
    check_pipeline,
    check_tensor_parallel,
    check_dp_composition,
]


def validate(cfg: DictConfig, *, environ: dict[str, str] | None = None) -> ValidatedRun:
    """Check ``cfg`` and derive its layout; raise ``ConfigError`` listing every problem."""
    external = detect_external_launch(environ)
    try:
        layout = build_layout(cfg, external)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"cannot read the parallel layout: {exc}"]) from None
    findings = Findings()
    checks = CHECKS
    if external is not None and check_external(cfg, layout, external, findings):
        checks = [c for c in CHECKS if c is not check_world]  # said above, in the outer launcher's words
    for check in checks:
        check(cfg, layout, findings)
        if check is check_positive and findings.problems:
            break  # later checks divide by these sizes
    if findings.problems:
        raise ConfigError(findings.problems)
    return ValidatedRun(layout=layout, warnings=tuple(findings.warnings), external=external)


def resolved_container(cfg: DictConfig) -> dict:
    """Plain, fully resolved containers travel to spawned workers (DictConfig does not pickle well)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
