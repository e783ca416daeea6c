"""How a run computes: ``trainer.precision``, activation checkpointing, compile and profiling
(parallel/foundation/precision.py, parallel/techniques/checkpointing.py, trainer/observe/perf.py), and the GPU it needs for them.
No torch import: the GPUs are asked through nvidia-smi."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

from omegaconf import DictConfig

from models.registry import UnknownModel, spec_for
from parallel.foundation.precision import FP8_MIN_CAPABILITY
from trainer.checks.findings import Findings


def cuda_compute_capabilities() -> list[float] | None:
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


def runs_on_cuda(cfg: DictConfig) -> bool | None:
    """True/False when the device is known without torch; None for topology.device=auto without nvidia-smi
    answering (then the workers pick CPU unless torch sees a GPU)."""
    if cfg.topology.device == "cuda":
        return True
    if cfg.topology.device == "cpu":
        return False
    return True if cuda_compute_capabilities() else None


def _has_blocks(cfg: DictConfig, f: Findings) -> bool:
    try:
        model = f.model(cfg)
        return spec_for(model).n_blocks(model) is not None
    except UnknownModel:
        return True  # validation's model check says so


def check_precision(cfg: DictConfig, layout: object, f: Findings) -> None:
    tr = cfg.trainer
    precision = str(tr.precision)  # its values and activation_checkpointing's: the schema's enums (conf/schema.py)
    if precision == "fp8":
        check_fp8(cfg, layout, f)
    elif precision != "fp32" and runs_on_cuda(cfg):
        old = [c for c in cuda_compute_capabilities() or [] if c < 8.0]
        if old:
            f.error(
                f"trainer.precision={precision} on a GPU of compute capability {min(old)}: bf16 needs compute "
                "capability 8.0 or newer (A100, H100, L4, RTX 30xx+); use trainer.precision=fp32 on this GPU"
            )
    mode = str(tr.activation_checkpointing)
    every = int(tr.ac_every)
    if every < 1:
        f.error(f"trainer.ac_every={every}: must be >= 1 (1: op-level selective on every block; k: every k-th block)")
    elif every > 1 and mode != "selective":
        f.error(
            f"trainer.ac_every={every} with trainer.activation_checkpointing={mode}: ac_every chooses which blocks "
            "selective checkpointing recomputes; use trainer.activation_checkpointing=selective, or ac_every=1"
        )
    if mode != "none" and not _has_blocks(cfg, f):
        f.error(
            f"trainer.activation_checkpointing={mode} with model={cfg.model.get('name')}: checkpointing works per "
            "block and this model has no blocks in model.layers; use trainer.activation_checkpointing=none"
        )
    if tr.compile:
        compilers = [c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)]
        if not runs_on_cuda(cfg) and not compilers:
            f.error(
                "trainer.compile=true on CPU needs a C++ compiler for inductor's kernels and none was found "
                "(g++, c++, clang++ or $CXX); install one (apt-get install g++) or set trainer.compile=false"
            )
    if cfg.parallel.name == "dp" and (mode != "none" or tr.compile) and len(cuda_compute_capabilities() or []) > 1:
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


def _wraps_fsdp(cfg: DictConfig, layout: object) -> bool:
    """Whether FSDP2 shards the weights (parallel=fsdp, or a sharded dp dimension of size > 1)."""
    return cfg.parallel.name == "fsdp" or (layout.dp > 1 and layout.dp_shard)


def check_fp8(cfg: DictConfig, layout: object, f: Findings) -> None:
    """trainer.precision=fp8 (parallel/techniques/fp8.py): torchao present, a GPU with float8 matmuls (or CPU, where
    torchao emulates them), and a recipe/all-gather/strategy combination torchao supports."""
    fp8 = cfg.trainer.get("fp8") or {}
    recipe = str(fp8.get("recipe", "tensorwise"))  # one of FP8_RECIPES: the schema's enum
    gather = fp8.get("fsdp_float8_all_gather")
    if importlib.util.find_spec("torchao") is None:
        f.error(
            "trainer.precision=fp8 trains through torchao's Float8Linear and torchao is not installed; install it "
            "(pip install 'torchao>=0.18', a meshtrain dependency) or use trainer.precision=bf16-mixed"
        )
    if gather and recipe != "tensorwise":
        f.error(
            f"trainer.fp8.fsdp_float8_all_gather=true with trainer.fp8.recipe={recipe}: torchao all-gathers float8 "
            "weights with one scale per tensor only; use trainer.fp8.recipe=tensorwise, or "
            "trainer.fp8.fsdp_float8_all_gather=false (rowwise all-gathers in bf16)"
        )
    elif gather and not _wraps_fsdp(cfg, layout):
        f.error(
            f"trainer.fp8.fsdp_float8_all_gather=true with parallel={cfg.parallel.name} (dp.size={layout.dp}, "
            f"sharded: {layout.dp_shard}): nothing all-gathers weights without FSDP2; use parallel=fsdp (or a "
            "sharded dp dimension of size > 1), or leave trainer.fp8.fsdp_float8_all_gather unset"
        )
    lora = cfg.model.get("lora") or {}
    if str(lora.get("rank", 0)).isdigit() and int(lora.get("rank", 0)) > 0:
        f.error(
            f"trainer.precision=fp8 with model.lora.rank={lora.get('rank')}: LoRA's layers keep their own forward, so "
            "only the adapters could become float8 (the frozen base would not); use trainer.precision=bf16-mixed "
            "with LoRA"
        )
    if runs_on_cuda(cfg):
        old = [c for c in cuda_compute_capabilities() or [] if c < FP8_MIN_CAPABILITY]
        if old:
            f.error(
                f"trainer.precision=fp8 on a GPU of compute capability {min(old)}: float8 matmuls need compute "
                f"capability {FP8_MIN_CAPABILITY} or newer (L4, L40S, RTX 40xx, H100, H200, B200); use "
                "trainer.precision=bf16-mixed on this GPU"
            )
    if cfg.parallel.name == "dp" and len(cuda_compute_capabilities() or []) > 1:
        f.error(
            "parallel=dp with trainer.precision=fp8: DataParallel copies the model to each GPU every step and "
            "torchao's float8 training supports DDP, FSDP2, tensor and pipeline parallel, not DataParallel; use "
            "parallel=ddp (one process per GPU)"
        )
