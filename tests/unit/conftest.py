"""The unit tier: in-process tests; the few that start ``train.py`` expect it to refuse before any worker."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cold_train_runs(monkeypatch):
    """A refusal imports no torch: a cold interpreter answers sooner than starting the warm runner would
    (tests/warm_runner.py imports torch first), so the fast tier never starts it."""
    monkeypatch.setenv("MESHTRAIN_TESTS_COLD", "1")


@pytest.fixture
def gloo_one_rank(tmp_path):
    """A one-process gloo group (file rendezvous in the test's folder), destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
