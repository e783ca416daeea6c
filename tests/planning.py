"""The planner's inputs for a composition, shared by the planner's unit and system tests. Composing takes about a
second, so each set of overrides is composed once per test process."""

from __future__ import annotations

import functools

from models.registry import typed_model
from parallel.plan.cli import compose, plain, specs_from_cfg

#: the Muon planner tests' run: optim=muon on 8 ranks, 16 sequences of 64 tokens
MUON = ("optim=muon", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8")


@functools.cache
def planned(*overrides: str):
    """(typed model config, (model, hardware, workload)) of ``overrides`` composed as the planner's command line
    composes them."""
    cfg = compose(list(overrides))
    return typed_model(plain(cfg.model)), specs_from_cfg(cfg, calibrate=False)
