"""Optimizer and learning-rate schedule from ``cfg.optim``.

The optim node holds the optimizer's constructor arguments (``_target_``, lr, betas ...) and the
schedule's (warm-up, decay) side by side, so a user tunes both in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from conf.schema import SCHEDULE_KEYS


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: DictConfig) -> torch.optim.Optimizer:
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in SCHEDULE_KEYS}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    params = list(params)
    # foreach kernels mix badly with DTensor parameters of different meshes; plain loops are exact too
    if any(type(p).__name__ == "DTensor" for p in params):
        kwargs.setdefault("foreach", False)
    return instantiate(kwargs, params=params, _convert_="all")


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, decay: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr at 0-based ``step``: linear warm-up, then cosine (or constant)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: DictConfig, *, max_steps: int):
    if cfg.get("decay", "constant") not in ("cosine", "constant"):
        raise ValueError(f"optim.decay={cfg.decay}: use cosine or constant")
    kw = dict(
        warmup_steps=int(cfg.get("warmup_steps", 0)),
        max_steps=max_steps,
        decay=str(cfg.get("decay", "constant")),
        min_lr_ratio=float(cfg.get("min_lr_ratio", 1.0)),
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, **kw))
