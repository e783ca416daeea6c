"""Refuse a bad config before any worker starts, with every problem named at once.

Each check reads the composed config (and the layout derived from it) and reports problems as
"key=value: what is wrong; what would fix it". Checks are plain functions in ``CHECKS``; a strategy
module adds its own rules by appending to it. No torch import: refusing takes well under a second.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from conf.schema import AC_MODES, PRECISIONS, DebugConfig, Decay
from parallel.core.layout import ParallelLayout, describe_factorization, factorizations, why_dp_needs_fsdp
from parallel.core.registry import DIMS, STRATEGIES, strategy_spec
from trainer.hf.checks import check_init_from
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
    external: ExternalLaunch | None = None
    """Set when torchrun / Slurm started this process (ranks and addresses are theirs)."""

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


def _nearest_multiples(value: int, base: int) -> str:
    """The multiples of ``base`` around ``value`` ("14 or 16" for 15 and 2)."""
    lo = (value // base) * base
    hi = lo + base
    return str(hi) if lo < base else f"{lo} or {hi}"


def split_points_of(cfg: DictConfig) -> tuple[int, ...] | None:
    """The explicit split points of the run (mp.split_points for mp), or None when a policy decides."""
    spec = strategy_spec(cfg.parallel.name)
    key = spec.split_points_key if spec is not None else "pp.split_points"
    raw = OmegaConf.select(cfg, key)
    if raw is None or (isinstance(raw, str) and raw.lower() == "auto"):
        return None
    if isinstance(raw, int):
        raw = [raw]
    if isinstance(raw, (list, tuple, ListConfig)):
        return tuple(int(x) for x in raw) if len(raw) else None
    raise ConfigError([f"{key}={raw!r}: expected a list of block indices like [2] or 'auto'"])


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
    spec = strategy_spec(cfg.parallel.name)
    pipelined = spec.pipelined(pp) if spec is not None else pp > 1
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
        dp_shard=bool(cfg.dp.shard) or (spec is not None and spec.shards_dp) or (dp > 1 and (tp > 1 or pp > 1)),
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
    if cfg.trainer.prefetch < 0:
        f.error(f"trainer.prefetch={cfg.trainer.prefetch}: must be >= 0 (batches built ahead; 0 builds in the loop)")
    if cfg.trainer.eval_every < 0:
        f.error(f"trainer.eval_every={cfg.trainer.eval_every}: must be >= 0 (0 disables evaluation)")
    if cfg.trainer.eval_every > 0 and cfg.trainer.eval_batches < 1:
        f.error(f"trainer.eval_batches={cfg.trainer.eval_batches}: must be >= 1 when trainer.eval_every > 0")
    if cfg.trainer.checkpoint_every < 0:
        f.error(f"trainer.checkpoint_every={cfg.trainer.checkpoint_every}: must be >= 0 (0 disables)")
    if cfg.topology.timeout_s <= 0:
        f.error(f"topology.timeout_s={cfg.topology.timeout_s}: must be > 0 seconds")


def check_strategy(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    name = cfg.parallel.name
    spec = strategy_spec(name)
    if spec is None or spec.resolved_before_launch:
        target = str(cfg.parallel._target_)
        if spec is None and (not target or target.startswith("parallel.")):
            f.error(
                f"parallel.name={name}: unknown strategy; use one of {', '.join(STRATEGIES)}, or set "
                "parallel._target_ to your own Strategy class"
            )
        return
    for dim in DIMS:
        size = getattr(layout, dim)
        if size > 1 and dim not in spec.dims:
            f.error(
                f"{dim}.size={size} with parallel={name}: {name} does not use the {dim} dimension; "
                + spec.dim_problem(dim)
            )


def check_world(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    if layout.world_size < 1:
        return
    workers = layout.nnodes * layout.nproc_per_node
    spec = strategy_spec(cfg.parallel.name)
    if spec is not None and spec.single_process and workers > 1:
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


VAL_OBJECTIVES = ("val_loss", "best_val_loss", "val_ppl")


def check_data(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    path = cfg.data.get("path")
    prepared = cfg.data.get("name") == "tokens"
    if prepared and not path:
        f.error(
            "data=tokens needs data.path=<folder written by `python -m trainer.data.prepare --input FILES "
            "--output FOLDER`>; or use data=text (byte-level, no preparation)"
        )
    elif path and not os.path.exists(os.path.expanduser(str(path))):
        what = "a prepared dataset folder" if prepared else "a UTF-8 text file or a .npy/.bin token file"
        f.error(f"data.path={path}: no such file or folder; point it at {what}")
    if str(cfg.trainer.objective) in VAL_OBJECTIVES and int(cfg.trainer.eval_every) <= 0:
        f.error(
            f"trainer.objective={cfg.trainer.objective} needs an evaluation: set trainer.eval_every to a "
            "positive number of steps"
        )
    if "val_fraction" in cfg.data and not 0 <= float(cfg.data.val_fraction) < 1:
        f.error(f"data.val_fraction={cfg.data.val_fraction}: must be in [0, 1)")
    model = cfg.model
    spec = model_spec(cfg)
    longest = spec.max_seq_len(model) if spec is not None and spec.max_seq_len is not None else None
    if longest is not None and longest < int(cfg.data.seq_len):
        f.error(
            f"data.seq_len={cfg.data.seq_len} exceeds model.max_seq_len={longest}; "
            f"lower data.seq_len or raise model.max_seq_len"
        )
    if model.get("planner_only", False):
        f.error(
            f"model={model.name} is a description for the planner, too big to build here; plan it with "
            f"python -m parallel.plan model={model.name} topology=..., or train model=gpt_small"
        )


def model_spec(cfg: DictConfig, f: Findings | None = None):
    """The model's ``ModelSpec`` (``models/registry.py``); an unknown ``model.spec`` / ``model.family`` is a
    problem in ``f`` (then None)."""
    from models.registry import UnknownModel, spec_for

    try:
        return spec_for(cfg.model)
    except UnknownModel as exc:
        if f is not None:
            f.error(str(exc))
        return None


def rank_budget_bytes(cfg: DictConfig) -> float:
    """Memory one rank may use: topology.device_memory_gb x planner.memory_fraction (the planner's budget)."""
    return float(cfg.topology.device_memory_gb) * 1e9 * float(cfg.planner.memory_fraction)


def check_model(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """What the model's spec says its config must satisfy, and whether this layout can hold its weights."""
    from models.spec import INIT_DEVICES, builder_kwargs

    model = cfg.model
    spec = model_spec(cfg, f)
    if spec is None:
        return
    if spec.config is not None and model.get("spec"):  # a user's model: check its keys against its schema
        try:
            OmegaConf.merge(OmegaConf.structured(spec.config), OmegaConf.create(builder_kwargs(model)))
        except OmegaConfBaseException as exc:  # ValidationError / ConfigKeyError name the key
            f.error(f"model={model.get('name')}: its config does not match {spec.config.__name__}: {exc}".strip())
            return
    for problem in spec.problems(model):
        f.error(problem)
    init_device = str(model.get("init_device", "auto"))
    if init_device not in INIT_DEVICES:
        f.error(f"model.init_device={init_device}: use auto, cpu or meta")
    if f.problems or spec.shape is None or model.get("planner_only", False):
        return
    shape = spec.shape(model)
    if shape.tied_embeddings and layout.pp > 1:
        f.error(
            f"model.tie_embeddings=true with pp.size={layout.pp}: the token embedding lives on the first stage and "
            "the output projection on the last, so one weight cannot serve both; set model.tie_embeddings=false"
        )
    full = 4.0 * shape.params
    share = full / (layout.tp * layout.pp * (layout.dp if layout.dp_shard else 1))
    budget = rank_budget_bytes(cfg)
    if share > budget and not cfg.trainer.get("dry_run", False):
        f.error(
            f"model={model.name}: {shape.params / 1e9:.3g}B parameters; with dp.size={layout.dp} "
            f"(sharded: {layout.dp_shard}) x tp.size={layout.tp} x pp.size={layout.pp} each rank would hold "
            f"{share / 1e9:.3g} GB of fp32 weights alone (gradients and optimizer state come on top), over its "
            f"{budget / 1e9:.3g} GB budget (topology.device_memory_gb={cfg.topology.device_memory_gb} x "
            f"planner.memory_fraction={cfg.planner.memory_fraction}). Plan a layout that fits: python -m "
            f"parallel.plan model={model.name} topology=<your cluster>, then train it there (model.init_device=auto "
            "builds it on the meta device and materialises only each rank's shard)"
        )


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


def model_blocks(cfg: DictConfig) -> int | None:
    """Number of splittable blocks of the configured model, from its spec (None when it does not say)."""
    spec = model_spec(cfg)
    return spec.n_blocks(cfg.model) if spec is not None else None


def check_pipeline(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """Schedule, micro-batches, stages per rank and split points of pp / mp / hybrid runs."""
    from parallel.pipeline.schedules import SCHEDULES
    from parallel.pipeline.split import POLICIES

    if layout.schedule is None:
        return
    name = cfg.parallel.name
    strategy = strategy_spec(name)
    m, pp, v = layout.micro_batches, layout.pp, layout.stages_per_rank
    num_stages = pp * v
    split_key = strategy.split_points_key if strategy is not None else "pp.split_points"
    if strategy is not None and strategy.fixed_pipeline is not None:  # parallel=mp: registry.MODEL_PARALLEL
        fixed = strategy.fixed_pipeline
        for problem in fixed.problems(name=name, micro_batches=m, schedule=layout.schedule, stages_per_rank=v):
            f.error(problem)
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
    spec = model_spec(cfg)
    if spec is not None and spec.pipeline is None:
        f.error(
            f"parallel={name} with model={cfg.model.get('name')}: the model family '{spec.family}' cannot be split "
            "into pipeline stages (ModelSpec.pipeline is None); use parallel=ddp or fsdp"
        )
        return
    n = model_blocks(cfg)
    if n is None:
        return
    depth = f"model.n_layers={n}" if "n_layers" in cfg.model else f"{n} blocks in the model (its ModelSpec.blocks)"
    if num_stages > n:
        f.error(
            f"pp.size={pp} x pp.stages_per_rank={v} = {num_stages} stages but {depth}: every stage "
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
            f"starts, between 1 and {n - 1} for {depth}"
        )
    elif any(b <= a for a, b in zip(points, points[1:])):
        f.error(
            f"{split_key}={shown}: split points must be strictly increasing (a repeated point leaves an "
            "empty stage); e.g. " + str(list(range(1, num_stages)) if num_stages <= n else [])
        )


def check_tensor_parallel(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """What the model's tensor-parallel plan needs from its sizes (its ``ModelSpec.tp_check``) and the layout."""
    tp, model = layout.tp, cfg.model
    if tp == 1:
        if cfg.tp.sequence_parallel or cfg.tp.loss_parallel:
            f.warn("tp.sequence_parallel / tp.loss_parallel have no effect with tp.size=1")
        return
    spec = model_spec(cfg)
    if spec is None:
        return
    for problem in spec.tp_problems(model, tp):
        f.error(problem)
    if spec.parallelize is None:
        return
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


def _cuda_compute_capabilities() -> list[float] | None:
    """Compute capabilities of the visible NVIDIA GPUs from nvidia-smi (no torch import); None if unknown."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        caps = [float(line) for line in out.stdout.split() if line.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return caps or None


def _runs_on_cuda(cfg: DictConfig) -> bool | None:
    """True/False when the device is known without torch; None for topology.device=auto without nvidia-smi
    answering (then the workers pick CPU unless torch sees a GPU)."""
    if cfg.topology.device == "cuda":
        return True
    if cfg.topology.device == "cpu":
        return False
    return True if _cuda_compute_capabilities() else None


def check_precision(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """trainer.precision, activation checkpointing, compile and profiling (parallel/core/precision.py,
    parallel/core/regional.py, trainer/observe/perf.py)."""
    tr = cfg.trainer
    precision = str(tr.precision)
    if precision not in PRECISIONS:
        hint = (
            " (fp16 needs a loss scaler this trainer does not have; bf16 has fp32's range and needs none)"
            if precision in ("fp16", "16-mixed", "float16", "half")
            else ""
        )
        f.error(f"trainer.precision={precision}: unknown precision; use one of {', '.join(PRECISIONS)}{hint}")
    elif precision != "fp32" and _runs_on_cuda(cfg):
        caps = _cuda_compute_capabilities()
        old = [c for c in caps or [] if c < 8.0]
        if old:
            f.error(
                f"trainer.precision={precision} on a GPU of compute capability {min(old)}: bf16 needs compute "
                "capability 8.0 or newer (A100, H100, L4, RTX 30xx+); use trainer.precision=fp32 on this GPU"
            )
    mode = str(tr.activation_checkpointing)
    if mode not in AC_MODES:
        f.error(f"trainer.activation_checkpointing={mode}: unknown mode; use one of {', '.join(AC_MODES)}")
    every = int(tr.ac_every)
    if every < 1:
        f.error(f"trainer.ac_every={every}: must be >= 1 (1: op-level selective on every block; k: every k-th block)")
    elif every > 1 and mode != "selective":
        f.error(
            f"trainer.ac_every={every} with trainer.activation_checkpointing={mode}: ac_every chooses which blocks "
            "selective checkpointing recomputes; use trainer.activation_checkpointing=selective, or ac_every=1"
        )
    if mode != "none" and model_blocks(cfg) is None:
        f.error(
            f"trainer.activation_checkpointing={mode} with model={cfg.model.get('name')}: checkpointing works per "
            "block and this model has no blocks in model.layers; use trainer.activation_checkpointing=none"
        )
    if tr.compile:
        on_cuda = _runs_on_cuda(cfg)
        compilers = [c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)]
        if not on_cuda and not compilers:
            f.error(
                "trainer.compile=true on CPU needs a C++ compiler for inductor's kernels and none was found "
                "(g++, c++, clang++ or $CXX); install one (apt-get install g++) or set trainer.compile=false"
            )
    if cfg.parallel.name == "dp" and (mode != "none" or tr.compile) and len(_cuda_compute_capabilities() or []) > 1:
        f.error(
            f"parallel=dp with trainer.activation_checkpointing={mode} trainer.compile={tr.compile}: DataParallel "
            "copies the model to each GPU every step and the copies would skip the per-block checkpointing and "
            "compile; use parallel=ddp (one process per GPU), or activation_checkpointing=none compile=false"
        )
    steps = list(tr.profile_steps or [])
    if steps:
        max_steps = int(tr.max_steps)
        if len(steps) != 2 or not 1 <= int(steps[0]) <= int(steps[1]) <= max_steps:
            f.error(
                f"trainer.profile_steps={steps}: give [first, last] steps with 1 <= first <= last <= "
                f"trainer.max_steps={max_steps}, e.g. trainer.profile_steps=[{min(3, max_steps)},{min(4, max_steps)}]"
            )


# ---- what a worker would otherwise reject (optimizer, model/data, trainer, debug, topology) --------

#: numeric summary.json keys every run writes: what trainer.objective may name
OBJECTIVES = (
    "tokens_per_s",
    "final_loss",
    "first_loss",
    "median_step_time_s",
    "time_to_first_step_s",
    "wall_time_s",
    "peak_memory_bytes_max",
)
DECAYS = tuple(Decay.values())


def _number(value) -> float | None:
    """``value`` as a float when it is a real number (bools and strings are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _require(f: Findings, key: str, value, ok: bool, rule: str) -> None:
    if not ok:
        f.error(f"{key}={value}: {rule}")


def check_optim(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """Hyper-parameters torch.optim and the lr schedule would reject (or silently misuse) in a worker."""
    o = cfg.optim
    lr = _number(o.get("lr"))
    _require(
        f,
        "optim.lr",
        o.get("lr"),
        lr is not None and math.isfinite(lr) and lr > 0,
        "must be a number > 0, e.g. optim.lr=3e-3",
    )
    if "weight_decay" in o:
        wd = _number(o.weight_decay)
        _require(
            f,
            "optim.weight_decay",
            o.weight_decay,
            wd is not None and math.isfinite(wd) and wd >= 0,
            "must be >= 0 (0 disables weight decay)",
        )
    if "betas" in o:
        betas = o.betas
        ok = isinstance(betas, (list, tuple, ListConfig)) and len(betas) == 2
        ok = ok and all((b := _number(x)) is not None and 0 <= b < 1 for x in betas)
        shown = list(betas) if isinstance(betas, ListConfig) else betas
        _require(f, "optim.betas", shown, ok, "must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.95]")
    if "eps" in o:
        eps = _number(o.eps)
        _require(
            f, "optim.eps", o.eps, eps is not None and math.isfinite(eps) and eps > 0, "must be a number > 0, e.g. 1e-8"
        )
    if "momentum" in o:
        mom = _number(o.momentum)
        _require(
            f, "optim.momentum", o.momentum, mom is not None and 0 <= mom < 1, "must be in [0, 1) (0 disables momentum)"
        )
    decay = o.get("decay", "constant")
    _require(f, "optim.decay", decay, str(decay) in DECAYS, f"unknown decay; use one of {', '.join(DECAYS)}")
    ratio = _number(o.get("min_lr_ratio", 1.0))
    _require(
        f,
        "optim.min_lr_ratio",
        o.get("min_lr_ratio"),
        ratio is not None and 0 <= ratio <= 1,
        "must be in [0, 1] (the share of optim.lr the cosine decays to)",
    )
    warm = o.get("warmup_steps", 0)
    _require(
        f, "optim.warmup_steps", warm, isinstance(warm, int) and warm >= 0, "must be an integer >= 0 (0: no warm-up)"
    )


def _model_family(model: DictConfig) -> str | None:
    if "vocab_size" in model:
        return "gpt"
    if "channels" in model and "num_classes" in model:
        return "cnn"
    return None


def check_model_data(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """The model must consume what the data produces: token sequences for the GPT, images for the CNN.
    Checked before anything resolves ``${data.*}`` interpolations in the model config."""
    family = _model_family(cfg.model)
    images = "image_size" in cfg.data
    model_name, data_name = cfg.model.get("name"), cfg.data.get("name")
    if family == "gpt" and images:
        f.error(
            f"model={model_name} with data={data_name}: the model reads token sequences, the data are images; "
            "use data=text (or model=cnn_bn for images)"
        )
    elif family == "cnn" and not images:
        f.error(
            f"model={model_name} with data={data_name}: the CNN classifies images, the data are token sequences; "
            "use data=images (or model=gpt_small for text)"
        )


def check_model_shape(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """Sizes the model constructors would reject."""
    m = cfg.model
    family = _model_family(m)
    if family == "gpt" and not m.get("planner_only", False):
        for key in ("vocab_size", "n_layers", "d_model", "n_heads"):
            if key in m:
                _require(f, f"model.{key}", m[key], int(m[key]) >= 1, "must be a positive integer (>= 1)")
        if "d_ff" in m:
            _require(f, "model.d_ff", m.d_ff, int(m.d_ff) >= 0, "must be >= 0 (0 means 4 * model.d_model)")
        if "dropout" in m:
            dropout = _number(m.dropout)
            _require(f, "model.dropout", m.dropout, dropout is not None and 0 <= dropout < 1, "must be in [0, 1)")
        widths = list(m.get("layer_d_ff") or [])
        n = int(m.get("n_layers", 0))
        if widths and len(widths) != n:
            f.error(
                f"model.layer_d_ff={widths}: {len(widths)} width(s) for model.n_layers={n}; give one width per "
                f"block ({n} entries), or [] to use model.d_ff everywhere"
            )
        if any(int(w) < 1 for w in widths):
            f.error(f"model.layer_d_ff={widths}: every feed-forward width must be >= 1")
    elif family == "cnn":
        channels = list(m.channels)
        if not channels or any(int(c) < 1 for c in channels):
            f.error(f"model.channels={channels}: give one or more positive channel counts, e.g. [16,32,64]")
            return
        size = cfg.data.get("image_size")
        if size is not None and int(size) < 2 ** len(channels):
            f.error(
                f"data.image_size={size} with model.channels={channels}: each of the {len(channels)} blocks halves "
                f"the image (2x2 max-pool); use data.image_size >= {2 ** len(channels)} or fewer channels"
            )
        for key in ("channels", "num_classes"):
            if key in cfg.data and int(cfg.data[key]) < 1:
                f.error(f"data.{key}={cfg.data[key]}: must be a positive integer (>= 1)")
        if "image_size" in cfg.data and int(cfg.data.image_size) < 1:
            f.error(f"data.image_size={cfg.data.image_size}: must be a positive integer (>= 1)")
        noise = _number(cfg.data.get("noise", 0.0))
        _require(f, "data.noise", cfg.data.get("noise"), noise is not None and noise >= 0, "must be >= 0")


def check_trainer(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    t = cfg.trainer
    clip = _number(t.grad_clip)
    _require(
        f,
        "trainer.grad_clip",
        t.grad_clip,
        clip is not None and not math.isnan(clip),
        "must be a number: the max global gradient norm (<= 0 or inf disables clipping)",
    )
    _require(
        f,
        "trainer.objective",
        t.objective,
        str(t.objective) in OBJECTIVES,
        f"not a summary.json number; use one of {', '.join(OBJECTIVES)}",
    )
    _require(f, "trainer.keep_checkpoints", t.keep_checkpoints, int(t.keep_checkpoints) >= 1, "must be >= 1")
    _require(f, "trainer.stop_grace_s", t.stop_grace_s, float(t.stop_grace_s) >= 0, "must be >= 0 seconds")
    resume = str(t.resume)
    if resume not in ("auto", "never") and not resume.strip():
        f.error("trainer.resume='': use auto, never, or a checkpoint folder")
    bucket = _number(cfg.dp.bucket_cap_mb)
    _require(
        f,
        "dp.bucket_cap_mb",
        cfg.dp.bucket_cap_mb,
        bucket is not None and math.isfinite(bucket) and bucket > 0,
        "must be a number of MiB > 0 (DDP's gradient bucket size, e.g. 25)",
    )
    w = cfg.logger.wandb
    _require(f, "logger.wandb.init_timeout", w.init_timeout, float(w.init_timeout) > 0, "must be > 0 seconds")
    _require(
        f, "logger.wandb.console", w.console, str(w.console) in ("off", "wrap", "redirect"), "use off, wrap or redirect"
    )
    if "max_bytes" in cfg.data:
        _require(f, "data.max_bytes", cfg.data.max_bytes, int(cfg.data.max_bytes) >= 1, "must be >= 1")


def check_debug(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """``+debug.<key>`` adds keys past the typed group: anything not in DebugConfig is a typo."""
    known = [fl.name for fl in fields(DebugConfig)]
    debug = cfg.get("debug") or {}
    for key in debug:
        if key not in known:
            f.error(f"debug.{key}={debug[key]}: unknown debug key; known: {', '.join(known)}")
            continue
        value = debug[key]
        if value is None or not key.endswith(("_at_step", "_rank")):  # the others are typed by the schema
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key.endswith("_rank") else 1):
            f.error(f"debug.{key}={value}: must be an integer >= {0 if key.endswith('_rank') else 1}")
        elif key.endswith("_rank") and value >= layout.world_size:
            f.error(f"debug.{key}={value}: no such rank; the job has ranks 0..{layout.world_size - 1}")


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_topology(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """Contradictions a multi-node rendezvous would otherwise turn into a hang or a C++ trace."""
    topo = cfg.topology
    _require(f, "topology.max_restarts", topo.max_restarts, int(topo.max_restarts) >= 0, "must be >= 0")
    port = int(topo.master_port)
    _require(f, "topology.master_port", port, 0 <= port <= 65535, "must be a TCP port in 0..65535 (0 picks a free one)")
    timeout = topo.get("rendezvous_timeout_s")
    if timeout is not None:
        _require(f, "topology.rendezvous_timeout_s", timeout, float(timeout) > 0, "must be > 0 seconds")
    if f.external is not None:
        return  # torchrun / Slurm chose ranks and addresses
    nnodes, node_rank = int(topo.nnodes), int(topo.node_rank)
    if not 0 <= node_rank < max(1, nnodes):
        f.error(
            f"topology.node_rank={node_rank} with topology.nnodes={nnodes}: node ranks run 0..{max(1, nnodes) - 1}; "
            f"start each node with its own topology.node_rank in that range"
        )
        return
    if nnodes <= 1:
        return
    addr = str(topo.master_addr)
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError):
        f.error(
            f"topology.master_addr={addr}: this host name does not resolve here; give node 0's host name or IP "
            "address as every node sees it"
        )
        return
    if port == 0:
        f.error("topology.master_port=0 with topology.nnodes>1: every node must know the port; set one, e.g. 29500")
    elif node_rank == 0 and _port_in_use("", port):
        f.error(
            f"topology.master_port={port}: the port is in use on this host (node 0 serves the rendezvous there); "
            "choose a free port and give the same one to every node"
        )


CHECKS: list[Check] = [
    check_positive,
    check_strategy,
    check_world,
    check_batch,
    check_data,
    check_model,
    check_backend,
    check_pipeline,
    check_tensor_parallel,
    check_dp_composition,
    check_precision,
    check_optim,
    check_model_data,
    check_model_shape,
    check_trainer,
    check_debug,
    check_topology,
    check_init_from,  # trainer/hf/checks.py: model.init_from's config.json and tensors against this model
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
    findings = Findings(external=external)
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
    """Plain, fully resolved containers travel to spawned workers (DictConfig does not pickle well); enum choices become their strings."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)  # type: ignore[return-value]
