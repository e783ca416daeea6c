"""The unit tier: in-process tests. A test that starts a process (``python train.py``, ``python -m ...``, a fresh
interpreter, a helper holding a lock) is an integration test: tests/integration. A test that loads transformers'
modelling code (builds or loads a transformers model) is a system test: tests/system (the guard below)."""

from __future__ import annotations

import sys

import pytest

from tests.import_watch import MODELLING_CODE, refuse_new_import

_LOADED_BEFORE = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Whether transformers' modelling code was imported before this unit test's set-up (its module's and session's
    fixtures included). A hook of this folder's tests only: what a system or integration test imported before it in
    the same process (``make test``) is not this test's doing."""
    item.stash[_LOADED_BEFORE] = MODELLING_CODE in sys.modules
    return (yield)


@pytest.fixture(autouse=True)
def _no_transformers_modelling_code(request):
    """Fails a unit test that loads transformers' modelling code: in its set-up, its body or its own fixtures."""
    yield
    refuse_new_import(MODELLING_CODE, loaded_before=request.node.stash[_LOADED_BEFORE])


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
