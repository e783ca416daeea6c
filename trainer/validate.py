"""Refuse a bad config before any worker starts, with every problem named at once.

Each check reads the composed config (and the layout derived from it) and reports problems as
"key=value: what is wrong; what would fix it". This module holds the generic checks (layout arithmetic, batch
division, the model's config and memory) and asks the rest of whom they belong to: the model family's
``ModelSpec`` (``check``, ``tp_check``, ``inputs``, ``data_check``: models/spec.py), the strategy's
``StrategySpec.checks`` (parallel/assembly/registry.py), and the checks of a concern of their own in
``trainer/checks/`` (data and files, optimizer, compute, run keys, topology). ``CHECKS`` lists them in the order they run. What
the schema types (enums: pp.schedule, topology.backend, optim.decay ...) fails at compose and is not re-checked.
No torch import: refusing takes well under a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from models.spec import ConfigView
from parallel.assembly.registry import STRATEGIES, checks_for, strategy_spec
from parallel.foundation import dims
from parallel.foundation.dims import nearest_multiples as _nearest_multiples
from parallel.foundation.layout import ParallelLayout, dp_needs_fsdp, why_dp_needs_fsdp
from trainer.checks.compute import check_precision
from trainer.checks.data import check_data
from trainer.checks.findings import Check, ConfigError, Findings
from trainer.checks.keys import check_keys
from trainer.checks.lora import check_lora
from trainer.checks.optim import check_optim
from trainer.checks.run import check_callbacks, check_trainer
from trainer.checks.suggest import layout_words, layouts_that_fit, runnable
from trainer.checks.topology import check_backend, check_cores, check_topology
from trainer.hf.checks import check_init_from
from trainer.launch.environment import ExternalLaunch, detect_external_launch
from trainer.typed.run_spec import memory_budget_bytes, run_spec
from trainer.typed.sections import plain_values


@dataclass(frozen=True)
class ValidatedRun:
    layout: ParallelLayout
    warnings: tuple[str, ...]
    external: ExternalLaunch | None


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


def dim_sizes(cfg: DictConfig) -> dict[str, int]:
    """Each mesh dimension's degree, read from its config key (``dp.size`` ...)."""
    return {d.name: int(OmegaConf.select(cfg, d.key, throw_on_missing=True)) for d in dims.DIMENSIONS}


def build_layout(cfg: DictConfig, external: ExternalLaunch | None = None) -> ParallelLayout:
    sizes = dim_sizes(cfg)
    product = dims.world_size(sizes)
    if external is not None:
        nnodes, nproc = external.nnodes, external.local_world_size
    else:
        nnodes = int(cfg.topology.nnodes)
        nproc = cfg.topology.nproc_per_node
        nproc = int(nproc) if nproc is not None else max(1, math.ceil(product / max(1, nnodes)))
    # hybrid with pp.size=1 has no pipeline: it accumulates data.micro_batch_size chunks instead
    spec = strategy_spec(cfg.parallel.name)
    pp = sizes["pp"]
    pipelined = spec.pipelined(pp) if spec is not None else pp > 1
    return ParallelLayout(
        strategy=str(cfg.parallel.name),
        sizes=sizes,
        nnodes=nnodes,
        nproc_per_node=nproc,
        micro_batches=int(cfg.pp.micro_batches) if pipelined else 1,
        schedule=str(cfg.pp.schedule) if pipelined else None,
        stages_per_rank=int(cfg.pp.stages_per_rank) if pipelined else 1,
        split_points=split_points_of(cfg) if pipelined else None,
        dp_shard=bool(cfg.dp.shard) or (spec is not None and spec.shards_dp) or dp_needs_fsdp(sizes),
    )


# ---- checks ---------------------------------------------------------------------------------


def check_positive(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    keys = {
        **{d.key: OmegaConf.select(cfg, d.key) for d in dims.DIMENSIONS},
        "pp.micro_batches": cfg.pp.micro_batches,
        "pp.stages_per_rank": cfg.pp.stages_per_rank,
        "topology.nnodes": cfg.topology.nnodes,
        "trainer.max_steps": cfg.trainer.max_steps,
        "trainer.log_every": cfg.trainer.log_every,
        "trainer.measure_every": cfg.trainer.measure_every,
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
    for dim in dims.names():
        size = layout.size(dim)
        if size > 1 and dim not in spec.dims:
            f.error(
                f"{dims.dim(dim).key}={size} with parallel={name}: {name} does not use the {dim} dimension; "
                + (spec.foreign_dim_hint or combine_dimensions(cfg, layout, f, dim))
            )


def combine_dimensions(cfg: DictConfig, layout: ParallelLayout, f: Findings, dim: str) -> str:
    """The fix for a dimension the strategy lacks: hybrid with the run's degrees, where that validates, and the
    dimension at 1, where that does."""
    key = dims.dim(dim).key
    hybrid = layout_words(layout.sizes, current=layout.sizes, strategy="hybrid")
    combined = runnable(cfg, f, [hybrid])
    without = runnable(cfg, f, [[f"{key}=1"]])
    fixes = [f"use {combined[0]} to combine the dimensions"] if combined else []
    fixes += [f"set {key}=1"] if without or not combined else []
    return ", or ".join(fixes)


def check_borrowing(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """A dimension that borrows its ranks (ep from dp x cp) must divide its lenders' product."""
    for problem in dims.borrow_problems(layout.sizes):
        f.error(problem)


def sizes_product(layout: ParallelLayout) -> str:
    """``dp.size=2 x tp.size=1 x pp.size=2``: the key and degree of each dimension that multiplies the world size
    (``dims.named``), for messages."""
    return " x ".join(f"{dims.dim(n).key}={layout.size(n)}" for n in dims.named(layout.sizes))


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
        nproc = max(1, layout.world_size // max(1, layout.nnodes))
        nproc_fix = runnable(cfg, f, [[f"topology.nproc_per_node={nproc}"]])
        f.error(
            f"{sizes_product(layout)} = {layout.world_size} "
            f"but topology.nnodes={layout.nnodes} x topology.nproc_per_node={layout.nproc_per_node} = "
            f"{workers} workers. {layouts_that_fit(cfg, layout, f, workers)}"
            + (f" Or set {nproc_fix[0]} (null follows the layout)" if nproc_fix else "")
        )


def check_external(cfg: DictConfig, layout: ParallelLayout, external: ExternalLaunch, f: Findings) -> bool:
    """Started by srun or submitit: the task count is fixed by the launcher, so the fix names its keys
    (under torchrun, check_world's message names topology.* as before)."""
    keys = {
        "slurm": "hydra.launcher.nodes x hydra.launcher.tasks_per_node (SLURM_NTASKS)",
        "submitit_local": "hydra.launcher.tasks_per_node",
    }.get(external.kind)
    product = layout.world_size
    if keys is None or external.world_size == product:
        return False
    f.error(
        f"{external.kind} started {external.world_size} tasks ({external.nnodes} node(s) x "
        f"{external.local_world_size}) but {sizes_product(layout)} "
        f"= {product} ranks. Set {keys} to {product} in all, or choose a layout for {external.world_size} "
        f"ranks. {layouts_that_fit(cfg, layout, f, external.world_size)}"
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


def check_model(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """What the model's spec says its config must satisfy, and whether this layout can hold its weights."""
    from models.spec import BACKENDS, INIT_DEVICES, builder_kwargs, hydra_schema

    model = f.model(cfg)  # the family's typed config (trainer/typed/run_spec.py): what its rules read
    spec = model_spec(cfg, f)
    if spec is None:
        return
    if spec.config is not None and model.get("spec"):  # a user's model: check its keys against its schema
        try:
            OmegaConf.merge(OmegaConf.structured(hydra_schema(spec.config)), OmegaConf.create(builder_kwargs(model)))
        except OmegaConfBaseException as exc:  # ValidationError / ConfigKeyError name the key
            f.error(f"model={model.get('name')}: its config does not match {spec.config.__name__}: {exc}".strip())
            return
    for problem in spec.problems(model):
        f.error(problem)
    init_device = str(model.get("init_device", "auto"))
    if init_device not in INIT_DEVICES:
        f.error(f"model.init_device={init_device}: use auto, cpu or meta")
    backend = str(model.get("backend", "auto"))
    if backend not in BACKENDS:
        f.error(f"model.backend={backend}: use one of {', '.join(BACKENDS)} (who runs a model.init_from folder)")
    if f.problems or spec.shape is None or model.get("planner_only", False):
        return
    shape = spec.shape(model)
    full = 4.0 * shape.params
    share = full / (layout.tp * layout.pp * (layout.data_size if layout.dp_shard else 1))
    budget = memory_budget_bytes(cfg)
    if share > budget and not cfg.trainer.get("dry_run", False):
        f.error(
            f"model={model.name}: {shape.params / 1e9:.3g}B parameters; with "
            f"{data_sizes(layout, ' x ')} (sharded: {layout.dp_shard}) x tp.size={layout.tp} x pp.size={layout.pp} each rank would hold "
            f"{share / 1e9:.3g} GB of fp32 weights alone (gradients and optimizer state come on top), over its "
            f"{budget / 1e9:.3g} GB budget (topology.device_memory_gb={cfg.topology.device_memory_gb} x "
            f"planner.memory_fraction={cfg.planner.memory_fraction}). Plan a layout that fits: python -m "
            f"parallel.plan model={model.name} topology=<your cluster>, then train it there (model.init_device=auto "
            "builds it on the meta device and materialises only each rank's shard)"
        )


#: what each kind of input ``ModelSpec.inputs`` names is, and a data option that produces it
INPUTS = {"tokens": ("token sequences", "data=text"), "images": ("images", "data=images")}


def check_model_data(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """The model must consume what the data produce (its ``ModelSpec.inputs``), and its ``data_check`` holds.
    Checked before anything resolves ``${data.*}`` interpolations in the model config."""
    spec = model_spec(cfg)
    if spec is None or spec.inputs is None:
        return
    produced = "images" if "image_size" in cfg.data else "tokens"  # the image datasets alone have a size
    if spec.inputs != produced and spec.inputs in INPUTS:
        (wanted, option), (given, _) = INPUTS[spec.inputs], INPUTS[produced]
        f.error(
            f"model={cfg.model.get('name')} with data={cfg.data.get('name')}: the model reads {wanted}, the data "
            f"are {given}; use {option}, or a model family that reads {given}"
        )
        return
    if spec.data_check is None:  # nothing to ask of the data: no need to convert the data section
        return
    for problem in spec.data_problems(f.model(cfg), ConfigView(plain_values(cfg.data))):
        f.error(problem)


def data_sizes(layout: ParallelLayout, sep: str) -> str:
    """The data dimensions' degrees as their keys say them (``dp.size=2 x cp.size=1``), mesh order."""
    return sep.join(f"{dims.dim(n).key}={layout.size(n)}" for n in dims.data_names())


def check_dp_composition(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """With tp, pp or ep > 1 the data dimensions (dp x cp) are FSDP2 (build_layout sets dp_shard): say so and why."""
    if dp_needs_fsdp(layout.sizes) and not cfg.dp.shard:
        f.warn(
            f"dp.shard=false with {data_sizes(layout, ' ')}: the data dimensions use FSDP2 fully_shard instead of DDP "
            f"(same numerics) because {why_dp_needs_fsdp(layout)}. Set dp.shard=true to silence this."
        )
    if layout.tp == 1 and (cfg.tp.sequence_parallel or cfg.tp.loss_parallel):
        f.warn("tp.sequence_parallel / tp.loss_parallel have no effect with tp.size=1")


def check_strategy_rules(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """The strategy's own rules (``StrategySpec.checks``: pipeline schedules and splits, tensor-parallel sizes)."""
    checks = checks_for(cfg.parallel.name)
    if not checks:
        return
    run = run_spec(cfg, layout, model=f.model(cfg))  # the typed run the checks read (parallel/foundation/run.py)
    for check in checks:
        for problem in check(run, strategy_spec(cfg.parallel.name)):
            f.error(problem)


CHECKS: list[Check] = [
    check_keys,  # trainer/checks/keys.py: a key nothing reads (+paralel=fsdp) is refused, with the nearest one
    check_positive,
    check_strategy,
    check_borrowing,
    check_world,
    check_batch,
    check_data,
    check_model,
    check_lora,
    check_backend,
    check_strategy_rules,
    check_dp_composition,
    check_precision,
    check_optim,
    check_model_data,
    check_trainer,
    check_callbacks,
    check_topology,
    check_cores,
    check_init_from,  # trainer/hf/checks.py: model.init_from's config.json and tensors against this model
]


def validate(cfg: DictConfig, *, environ: dict[str, str] | None = None) -> ValidatedRun:
    """Check ``cfg`` and derive its layout; raise ``ConfigError`` listing every problem (each layout a problem
    suggests passes this validation itself: trainer/checks/suggest.py)."""
    external = detect_external_launch(environ)

    def runs(candidate: DictConfig) -> bool:
        try:
            _validate(candidate, external, runs=None)
        except ConfigError:
            return False
        return True

    return _validate(cfg, external, runs=runs)


def _validate(cfg: DictConfig, external: ExternalLaunch | None, *, runs) -> ValidatedRun:
    try:
        layout = build_layout(cfg, external)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"cannot read the parallel layout: {exc}"]) from None
    findings = Findings(external=external, runs=runs)
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
