"""The unit tier: in-process tests. A test that starts a process (``python train.py``, ``python -m ...``, a fresh
interpreter, a helper holding a lock) is an integration test: tests/integration. A test that loads transformers'
modelling code (builds or loads a transformers model) is a system test: tests/system (the guard below)."""

from __future__ import annotations

import pytest

from tests.import_watch import MODELLING_CODE, ImportWatch

_modelling_code = ImportWatch(MODELLING_CODE)


@pytest.fixture(autouse=True)
def _no_transformers_modelling_code():
    """Fails a unit test that newly imports transformers' modelling code: in its set-up (its module's or session's
    fixtures before it; then they fail this, their first test) or in the test and its own fixtures."""
    _modelling_code.look()
    yield
    _modelling_code.look()


@pytest.fixture
def gloo_one_rank(tmp_path):
    """A one-process gloo group (file rendezvous in the test's folder), destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def wandb_service_polled_often():
    """A W&B run (offline) started in the test's process starts W&B's service, a process, and waits for its port
    file, polled every 0.2 s (wandb/sdk/lib/service/service_port_file.py): the service had written it after a few
    ms, so each run sat ~0.2 s idle in the test worker. Polled every 5 ms instead; the service, its start and
    the run are W&B's own. Fails if W&B renames what it polls with, rather than quietly waiting again."""
    import time

    from wandb.sdk.lib.service import service_port_file

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service_port_file, "_SLEEP", lambda seconds: time.sleep(min(seconds, 0.005)))
        yield
