"""The unit tier: in-process tests. A test that starts a process (``python train.py``, ``python -m ...``, a fresh
interpreter, a helper holding a lock) is an integration test: tests/integration."""

from __future__ import annotations

import pytest


@pytest.fixture
def gloo_one_rank(tmp_path):
    """A one-process gloo group (file rendezvous in the test's folder), destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
