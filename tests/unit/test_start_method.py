"""How local workers start (trainer/launch/start_method.py): fork where it is safe, spawn otherwise."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from trainer.launch.start_method import resolve_start_method


def topology(**kw):
    return OmegaConf.create({"start_method": "auto", "device": "cpu", "calibrate": False, **kw})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is chosen on Linux only")
def test_cpu_workers_fork_and_cuda_workers_spawn():
    assert resolve_start_method(topology()) == "fork"
    assert resolve_start_method(topology(device="cuda")) == "spawn"


def test_an_explicit_choice_wins():
    assert resolve_start_method(topology(start_method="spawn")) == "spawn"
    assert resolve_start_method(topology(start_method="fork", device="cuda")) == "fork"


def test_a_launcher_that_calibrated_spawns():
    """topology.calibrate=true times torch kernels in the launcher: its OpenMP pool must not be inherited."""
    assert resolve_start_method(topology(calibrate=True)) == "spawn"
