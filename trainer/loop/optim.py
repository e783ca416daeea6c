"""Optimizer and learning-rate schedule from ``cfg.optim``, built the way Hydra users expect.

The optim node is a partial (``_partial_: true``): ``instantiate`` returns ``functools.partial(AdamW, lr=...)``
and the trainer calls it with the parameters, so ``optim._target_`` may name any ``torch.optim`` class (or
the user's own) with its own keyword arguments. The schedule keys sit beside them (``warmup_steps``,
``decay``, ``min_lr_ratio``) and become torch's own schedulers: ``LinearLR`` warm-up, then
``CosineAnnealingLR`` / ``LinearLR`` / ``ConstantLR`` down to ``lr * min_lr_ratio``, joined by
``SequentialLR`` (``WarmupDecay``). ``optim.scheduler`` may instead name any torch scheduler as a partial
(``{_target_: torch.optim.lr_scheduler.StepLR, _partial_: true, step_size: 100}``). The step count travels
in each checkpoint; a resumed run replays the schedule to it, so it continues exactly.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.optim import lr_scheduler

from conf.schema import NOT_OPTIMIZER_KEYS
from parallel.foundation.optimizer import build_optimizer_over


def build_optimizer(params: Iterable, cfg: DictConfig) -> torch.optim.Optimizer:
    """``cfg``'s optimizer over ``params`` (parameters, or (name, parameter) pairs), grouped by kind and with
    ``optim.implementation``'s kernels (parallel/foundation/optimizer.py). A class that assigns parameters by name
    (``takes_names``: ``optim=muon``, parallel/optim/muon.py) gets the pairs and the implementation itself."""
    kwargs = {
        k: v
        for k, v in OmegaConf.to_container(cfg, resolve=True, enum_to_str=True).items()
        if k not in NOT_OPTIMIZER_KEYS
    }
    kwargs["_partial_"] = True
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    factory = instantiate(kwargs, _convert_="all")
    implementation = str(cfg.get("implementation", "auto"))
    params = list(params)
    named = bool(params) and isinstance(params[0], tuple)
    if getattr(factory.func, "takes_names", False):
        if not named:
            raise ValueError(f"{factory.func.__name__} assigns parameters by name: pass (name, parameter) pairs")
        return factory(params, implementation=implementation)
    return build_optimizer_over(factory, [p for _, p in params] if named else params, implementation=implementation)


def build_optimization(
    params: Iterable, cfg: DictConfig, *, max_steps: int
) -> tuple[torch.optim.Optimizer, lr_scheduler.LRScheduler]:
    """``optim``'s optimizer over ``params`` and its learning-rate schedule over ``max_steps``."""
    optimizer = build_optimizer(params, cfg)
    return optimizer, build_scheduler(optimizer, cfg, max_steps=max_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: DictConfig, *, max_steps: int) -> lr_scheduler.LRScheduler:
    """Warm-up then decay with torch's schedulers (or ``optim.scheduler``, a partial), stepped once per step."""
    custom = cfg.get("scheduler")
    if custom is not None:
        return instantiate(custom, _partial_=True)(optimizer)
    warmup = int(cfg.get("warmup_steps", 0))
    decay = str(cfg.get("decay", "constant"))
    floor = float(cfg.get("min_lr_ratio", 1.0))
    span = max(1, max_steps - warmup)
    if decay not in ("cosine", "linear", "constant"):  # the schema's enum refuses others at compose time
        raise ValueError(f"optim.decay={decay}: use cosine, linear or constant")

    def parts() -> list[lr_scheduler.LRScheduler]:
        if decay == "cosine" and len({g["initial_lr"] for g in optimizer.param_groups}) > 1:
            # groups with their own lr (optim=muon): CosineAnnealingLR's eta_min is one number for all of them, so
            # the same curve as a factor of each group's own lr
            after = lr_scheduler.LambdaLR(
                optimizer, lambda t: floor + (1 - floor) * (1 + math.cos(math.pi * t / span)) / 2
            )
        elif decay == "cosine":
            base = optimizer.param_groups[0]["initial_lr"]
            after = lr_scheduler.CosineAnnealingLR(optimizer, T_max=span, eta_min=base * floor)
        elif decay == "linear":
            after = lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=floor, total_iters=span)
        else:
            after = lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
        if warmup <= 0:
            return [after]
        # step s (0-based) of the warm-up runs at lr * (s + 1) / warmup, reaching lr at its last step
        ramp = lr_scheduler.LinearLR(
            optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=max(warmup - 1, 1)
        )
        return [ramp, after]

    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return WarmupDecay(optimizer, parts=parts, milestones=[warmup] if warmup > 0 else [])


class WarmupDecay(lr_scheduler.SequentialLR):
    """torch's ``SequentialLR`` over the warm-up and decay schedulers, with two changes:

    - ``load_state_dict`` takes only the step from a checkpoint and replays the schedule to it under this
      run's config: for the same config that is bitwise the lr an uninterrupted run has (the same float
      operations from the same base lr); a run continued with a larger ``trainer.max_steps`` stretches its
      decay, as it would have from the start (torch's own state would keep the old ``T_max``).
    - no deprecation warning at the milestone (``SequentialLR`` calls the next scheduler's ``step(0)``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, parts, milestones: list[int]):
        self._parts = parts
        super().__init__(optimizer, schedulers=parts(), milestones=milestones)

    def step(self) -> None:  # type: ignore[override]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The epoch parameter", category=UserWarning)
            super().step()

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("_parts", None)  # a closure over the config, rebuilt from it
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        steps = int(state_dict["last_epoch"])
        for group, base in zip(self.optimizer.param_groups, self._schedulers[0].base_lrs):
            group["lr"] = group["initial_lr"] = base
        fresh = WarmupDecay(self.optimizer, parts=self._parts, milestones=list(self._milestones))
        with warnings.catch_warnings():  # a replay steps the schedule without optimizer steps, on purpose
            warnings.filterwarnings("ignore", message="Detected call of", category=UserWarning)
            for _ in range(steps):
                fresh.step()
        self.__dict__.update(fresh.__dict__)
