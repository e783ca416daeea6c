"""A user's own Strategy subclass, plugged in with parallel._target_ and a name the registry does not know, trains."""

from __future__ import annotations

import pytest

from parallel.strategies.single import SingleStrategy
from tests.helpers import FAST, run_train

#: the class by the module path train.py's subprocess imports
OWN = "tests.integration.test_own_strategy_trains.OwnStrategy"


class OwnStrategy(SingleStrategy):
    """parallel.single with a log line of its own."""

    def build(self, *, ctx):
        ctx.log.info("own strategy %s builds the engine", self.name)
        return super().build(ctx=ctx)


@pytest.mark.slow
def test_own_strategy_trains(tmp_path):
    run = run_train(
        *FAST,
        f"parallel._target_={OWN}",
        "parallel.name=mine",
        "dp.size=1",
        "trainer.max_steps=2",
        "trainer.checkpoint_every=0",
        run_dir=tmp_path / "own",
    )
    summary = run.summary()
    assert summary["status"] == "completed" and summary["strategy"] == "mine"
    assert "own strategy mine builds the engine" in (tmp_path / "own" / "logs" / "rank0.log").read_text()
