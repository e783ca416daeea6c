"""The planner's inputs for a composition, shared by the planner's unit and system tests. Hydra's compose takes
0.1-0.3 s, so each set of group choices is composed once per test process, each set of overrides typed once."""

from __future__ import annotations

import functools

from models.registry import typed_model
from parallel.plan.cli import plain, specs_from_cfg, workload_overrides
from tests.composing import Composer, session_composer
from tests.helpers import CONF

#: the Muon planner tests' run: optim=muon on 8 ranks, 16 sequences of 64 tokens
MUON = ("optim=muon", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8")


@functools.cache
def _composer() -> Composer:
    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()
    return session_composer(CONF)  # the compose_cfg fixture's: their compositions are shared


def _initialize():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    return initialize_config_dir(config_dir=str(CONF), version_base="1.3")


def plan_cfg(*overrides: str):
    """The config ``python -m parallel.plan OVERRIDES`` plans (``parallel.plan.cli.compose``: ``data.seq_len`` and
    ``data.global_batch_size`` also set ``planner.*``), each set of group choices composed once per test process
    (tests/composing.py); a fresh copy each call."""
    return _composer()(workload_overrides(list(overrides)), initialize=_initialize)


def planner_inputs(cfg):
    """(typed model config, (model, hardware, workload)) of a composed config, as the planner's command line types
    it: what ``dry_run`` and ``estimate`` take."""
    return typed_model(plain(cfg.model)), specs_from_cfg(cfg, calibrate=False)


@functools.cache
def planned(*overrides: str):
    """``planner_inputs`` of ``overrides`` composed as the planner's command line composes them."""
    return planner_inputs(plan_cfg(*overrides))


def plan_cli_composes_once(monkeypatch) -> None:
    """``python -m parallel.plan``'s own composition (``parallel.plan.cli.compose``: Hydra's compose of the command
    line's overrides, ``workload_overrides`` applied) answered by ``plan_cfg``, the same config with each set of group
    choices composed once per session: ``main`` in-process plans what the command plans. The command's own compose
    runs in tests/unit/test_command_line_paths_and_keys.py and as a process in tests/integration."""
    from parallel.plan import cli

    monkeypatch.setattr(cli, "compose", lambda overrides: plan_cfg(*overrides))
