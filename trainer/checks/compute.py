"""How a run computes: ``trainer.precision``, activation checkpointing, compile and profiling
(parallel/core/precision.py, parallel/techniques/checkpointing.py, trainer/observe/perf.py), and the GPU it needs for them.
No torch import: the GPUs are asked through nvidia-smi."""

from __future__ import annotations

import os
import shutil
import subprocess

from omegaconf import DictConfig

from models.registry import UnknownModel, spec_for
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


def _has_blocks(cfg: DictConfig) -> bool:
    try:
        return spec_for(cfg.model).n_blocks(cfg.model) is not None
    except UnknownModel:
        return True  # validation's model check says so


def check_precision(cfg: DictConfig, layout: object, f: Findings) -> None:
    tr = cfg.trainer
    precision = str(tr.precision)  # its values and activation_checkpointing's: the schema's enums (conf/schema.py)
    if precision != "fp32" and runs_on_cuda(cfg):
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
    if mode != "none" and not _has_blocks(cfg):
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
