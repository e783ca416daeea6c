"""A sample of the config-space draws that validation accepts runs for 2 steps: nothing validation let
through may fail in a worker."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

from tests import config_space
from tests.config_space import outcome, overrides
from tests.helpers import run_train


@pytest.fixture(scope="module")
def composer():
    with config_space.composer() as compose:
        yield compose


@pytest.mark.slow
@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],  # no shrinking: each example is a real run
    suppress_health_check=list(HealthCheck),
)
@given(ovs=overrides())
def test_accepted_combinations_run_two_steps(composer, tmp_path_factory, ovs):
    ovs = [o for o in ovs if not o.startswith(("trainer.max_steps=", "logger."))]
    ovs += ["trainer.max_steps=2", "logger=none", "topology.timeout_s=120"]
    run_dir = tmp_path_factory.mktemp("run")
    verdict, _ = outcome(composer, ovs, run_dir)
    assume(verdict == "accepted")
    run = run_train(*ovs, run_dir=run_dir, expect_ok=False, timeout=300)
    assert run.proc.returncode == 0, f"accepted {ovs} but a worker failed:\n{run.output[-4000:]}"
    assert len(run.losses()) == 2
