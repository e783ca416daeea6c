"""The optimizer as a Hydra partial and the LR schedule from torch's schedulers: the same lrs as the
closed-form warm-up + cosine, and a resume that replays the schedule to its step exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from trainer.loop.optim import WarmupDecay, build_optimizer, build_scheduler


def _cfg(**kw):
    base = {"_target_": "torch.optim.AdamW", "lr": 3e-3, "warmup_steps": 10, "decay": "cosine", "min_lr_ratio": 0.1}
    return OmegaConf.create({**base, **kw})


def _lrs(cfg, *, max_steps: int, steps: range, state=None):
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer([p], cfg)
    sched = build_scheduler(opt, cfg, max_steps=max_steps)
    if state is not None:
        opt.load_state_dict(state[0])
        sched.load_state_dict(json.loads(json.dumps(state[1], default=str)))  # as the checkpoint marker keeps it
    out = []
    for _ in steps:
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
    return out, (opt.state_dict(), sched.state_dict())


def test_warmup_then_cosine_matches_the_closed_form():
    lrs, _ = _lrs(_cfg(), max_steps=40, steps=range(40))
    closed = [(s + 1) / 10 if s < 10 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 30)) for s in range(40)]
    assert lrs == pytest.approx([3e-3 * f for f in closed], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("stop", [5, 10, 13])
def test_resume_replays_the_schedule_exactly(decay, stop):
    cfg = _cfg(decay=decay)
    straight, _ = _lrs(cfg, max_steps=20, steps=range(20))
    _, state = _lrs(cfg, max_steps=20, steps=range(stop))
    resumed, _ = _lrs(cfg, max_steps=20, steps=range(stop, 20), state=state)
    assert resumed == straight[stop:]  # bitwise


def test_a_longer_run_stretches_the_decay_like_a_fresh_one():
    """10 steps with max_steps=10, then continued to 20: the lrs of a run configured for 20 from the start
    (torch's own state would keep T_max of the first run)."""
    cfg = _cfg()
    straight, _ = _lrs(cfg, max_steps=20, steps=range(20))
    _, state = _lrs(cfg, max_steps=10, steps=range(10))
    resumed, _ = _lrs(cfg, max_steps=20, steps=range(10, 20), state=state)
    assert resumed == straight[10:]


def test_optimizer_is_a_partial_and_scheduler_pluggable():
    cfg = _cfg()
    cfg.scheduler = {"_target_": "torch.optim.lr_scheduler.StepLR", "_partial_": True, "step_size": 2, "gamma": 0.5}
    lrs, _ = _lrs(cfg, max_steps=6, steps=range(6))
    assert lrs == pytest.approx([3e-3, 3e-3, 1.5e-3, 1.5e-3, 7.5e-4, 7.5e-4])
    _, (_, state) = _lrs(_cfg(), max_steps=5, steps=range(3))
    assert state["last_epoch"] == 3 and "_parts" not in state and json.dumps(state)
    p = torch.nn.Parameter(torch.ones(2))
    assert isinstance(build_scheduler(build_optimizer([p], _cfg()), _cfg(), max_steps=5), WarmupDecay)
    sgd = OmegaConf.create({"_target_": "torch.optim.SGD", "lr": 0.1, "momentum": 0.9, "name": "sgd"})
    assert type(build_optimizer([p], sgd)) is torch.optim.SGD
