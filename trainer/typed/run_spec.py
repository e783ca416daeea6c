"""Where the config stops: the composed Hydra config becomes the typed run (``parallel/foundation/run.py``), once.

Validation's strategy checks read the ``RunSpec`` this module builds, and so does every worker (through its
``WorkerContext``); ``parallel/`` and ``models/`` never see a config node. The trainer's own parts (the loop, sinks,
checkpoints) keep the config beside it, on the worker's ``TrainerContext`` (``trainer/launch/worker.py``). No torch
import: validation builds a ``RunSpec`` too. What the planner reads of the config is its own typed object
(``trainer/typed/planner_request.py``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from models.objectives import OBJECTIVES as PREFERENCE_OBJECTIVES
from models.objectives import PreferenceObjective
from models.registry import spec_for, typed_model
from parallel.foundation import dims
from parallel.foundation.layout import ParallelLayout
from parallel.foundation.memory import rank_budget_bytes
from parallel.foundation.run import BatchSpec, ComposeSettings, DDPSettings, Float8Settings, PipelineOptions, RunSpec
from trainer.typed.sections import plain_values


def model_config(cfg: DictConfig) -> Any:
    """``cfg.model`` typed (``models.registry.typed_model``)."""
    return typed_model(plain_values(cfg.model))


def fp8_settings(cfg: DictConfig, model: Any) -> Float8Settings:
    """``trainer.fp8.*``, with the family's output head and MoE router kept out of float8 (torchtitan skips the
    output layer and the router)."""
    fp8 = cfg.trainer.get("fp8") or {}
    spec = spec_for(model)
    family_skip = [spec.tp_plan.head if spec.tp_plan is not None else "output"]
    if spec.moe is not None:
        family_skip += [p.removesuffix(".weight") for p in spec.moe.router]
    gather = fp8.get("fsdp_float8_all_gather")
    return Float8Settings(
        recipe=str(fp8.get("recipe", "tensorwise")),
        fsdp_float8_all_gather=None if gather is None else bool(gather),
        skip=(*family_skip, *(str(p) for p in fp8.get("skip") or [])),
    )


def compose_settings(cfg: DictConfig, model: Any) -> ComposeSettings:
    """``trainer.precision`` (and ``trainer.fp8.*``), ``trainer.activation_checkpointing`` / ``ac_every`` /
    ``compile``, ``tp.*``, ``dp.*``; ``model``: the typed model config (fp8 skips its head and router)."""
    trainer, tp, dp = cfg.trainer, cfg.tp, cfg.dp
    precision = str(trainer.precision)
    return ComposeSettings(
        precision=precision,
        fp8=fp8_settings(cfg, model) if precision == "fp8" else Float8Settings(),
        activation_checkpointing=str(trainer.activation_checkpointing),
        ac_every=int(trainer.ac_every),
        compile=bool(trainer.compile),
        sequence_parallel=bool(tp.sequence_parallel),
        loss_parallel=bool(tp.loss_parallel),
        options=dimension_options(cfg),
        ddp=DDPSettings(
            bucket_cap_mb=None if dp.bucket_cap_mb is None else float(dp.bucket_cap_mb),
            find_unused_parameters=bool(dp.find_unused_parameters),
            sync_batchnorm=bool(dp.sync_batchnorm),
        ),
        measure_dp_comm=bool(dp.measure_comm),
        measure_tp_comm=bool(tp.measure_comm),
    )


def dimension_options(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Each further dimension's config group beside its size (``cp.attention``), by dimension (``MeshDim.technique``:
    the module that reads them)."""
    groups = {d.name: d.key.rsplit(".", 1)[0] for d in dims.DIMENSIONS if d.technique}
    values = {name: plain_values(cfg[group]) if cfg.get(group) is not None else {} for name, group in groups.items()}
    return {name: {k: v for k, v in got.items() if k != "size"} for name, got in values.items()}


def memory_budget_bytes(cfg: DictConfig) -> float:
    """What one rank may hold (``rank_budget_bytes`` of ``topology.device_memory_gb`` and
    ``planner.memory_fraction``)."""
    return rank_budget_bytes(
        device_memory_gb=float(cfg.topology.device_memory_gb), memory_fraction=float(cfg.planner.memory_fraction)
    )


def run_spec(cfg: DictConfig, layout: ParallelLayout, *, model: Any = None) -> RunSpec:
    """The typed run of a composed config and its layout (``model``: ``model_config(cfg)`` where the caller has it)."""
    mbs = cfg.data.get("micro_batch_size")
    model = model_config(cfg) if model is None else model
    return RunSpec(
        layout=layout,
        model=model,
        batch=BatchSpec(
            global_batch_size=int(cfg.data.global_batch_size),
            seq_len=int(cfg.data.seq_len),
            micro_batch_size=int(mbs) if mbs else None,
        ),
        compose=compose_settings(cfg, model),
        pipeline=PipelineOptions(split=str(cfg.pp.split), trace_step=int(cfg.pp.trace_step)),
        dp_shard=bool(cfg.dp.shard),
        seed=int(cfg.trainer.seed),
        max_steps=int(cfg.trainer.max_steps),
        memory_budget_bytes=memory_budget_bytes(cfg),
        objective=training_objective(cfg),
    )


def training_objective(cfg: DictConfig) -> PreferenceObjective | None:
    """``trainer.objective`` when it names a training objective (dpo, simpo) with ``trainer.preference.*``; None
    when it names a summary key (the family's own loss trains)."""
    name = str(cfg.trainer.objective)
    if name not in PREFERENCE_OBJECTIVES:
        return None
    p = cfg.trainer.preference
    return PreferenceObjective(
        name=name, beta=float(p.beta), label_smoothing=float(p.label_smoothing), gamma=float(p.gamma)
    )
