"""Optimizer and learning-rate schedule from ``cfg.optim``, built the way Hydra users expect.

The optim node is a partial (``_partial_: true``): ``instantiate`` returns ``functools.partial(AdamW, lr=...)``
and the trainer calls it with the parameters, so ``optim._target_`` may name any ``torch.optim`` class (or
the user's own) with its own keyword arguments. The schedule keys sit beside them (``warmup_steps``,
``decay``, ``min_lr_ratio``) and become torch's own schedulers: ``LinearLR`` warm-up, then
``CosineAnnealingLR`` / ``LinearLR`` / ``ConstantLR`` down to ``lr * min_lr_ratio``, joined by
``SequentialLR``. ``optim.scheduler`` may instead name any torch scheduler as a partial
(``{_target_: torch.optim.lr_scheduler.StepLR, _partial_: true, step_size: 100}``). The scheduler's
state travels in each checkpoint, so a resumed run continues its schedule exactly.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.optim import lr_scheduler

from conf.schema import SCHEDULE_KEYS


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: DictConfig) -> torch.optim.Optimizer:
    kwargs = {
        k: v for k, v in OmegaConf.to_container(cfg, resolve=True, enum_to_str=True).items() if k not in SCHEDULE_KEYS
    }
    kwargs["_partial_"] = True
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    params = list(params)
    # foreach kernels mix badly with DTensor parameters of different meshes; plain loops are exact too
    if any(type(p).__name__ == "DTensor" for p in params):
        kwargs.setdefault("foreach", False)
    factory = instantiate(kwargs, _convert_="all")
    return factory(params)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: DictConfig, *, max_steps: int) -> lr_scheduler.LRScheduler:
    """Warm-up then decay with torch's schedulers (or ``optim.scheduler``, a partial), stepped once per step."""
    custom = cfg.get("scheduler")
    if custom is not None:
        return instantiate(custom, _partial_=True)(optimizer)
    warmup = int(cfg.get("warmup_steps", 0))
    decay = str(cfg.get("decay", "constant"))
    floor = float(cfg.get("min_lr_ratio", 1.0))
    span = max(1, max_steps - warmup)
    if decay == "cosine":
        base = optimizer.param_groups[0]["lr"]
        after = lr_scheduler.CosineAnnealingLR(optimizer, T_max=span, eta_min=base * floor)
    elif decay == "linear":
        after = lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=floor, total_iters=span)
    elif decay == "constant":
        after = lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    else:  # the schema's enum refuses others at compose time; a hand-made config may still get here
        raise ValueError(f"optim.decay={decay}: use cosine, linear or constant")
    if warmup <= 0:
        return after
    # step s (0-based) of the warm-up runs at lr * (s + 1) / warmup, reaching lr at its last step
    ramp = lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=max(warmup - 1, 1))
    return _Sequential(optimizer, schedulers=[ramp, after], milestones=[warmup])


class _Sequential(lr_scheduler.SequentialLR):
    """``SequentialLR`` without the deprecation warning it triggers itself at each milestone
    (it calls the next scheduler's ``step(0)``)."""

    def step(self) -> None:  # type: ignore[override]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The epoch parameter", category=UserWarning)
            super().step()
