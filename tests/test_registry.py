"""The strategy registry: every parallel=NAME once, read by config, validation, layout and planner."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from parallel.core.layout import describe_factorization
from parallel.core.registry import STRATEGIES, strategy_for
from parallel.plan.cost_model import Candidate
from parallel.plan.search import available_strategies, strategy_of
from parallel.strategies.single import SingleStrategy
from tests.conftest import CONF, FAST, run_train
from trainer.validate import ConfigError, validate

#: importable both from pytest and from the train.py subprocess (pytest may import this file as ``test_registry``)
OWN = "tests.test_registry.OwnStrategy"


class OwnStrategy(SingleStrategy):
    """A user's strategy, plugged in through parallel._target_ with a name the registry does not know."""

    def build(self, *, ctx):
        ctx.log.info("own strategy %s builds the engine", self.name)
        return super().build(ctx=ctx)


def test_every_parallel_option_is_registered_and_takes_its_class_from_the_registry():
    for path in sorted((CONF / "parallel").glob("*.yaml")):
        raw = OmegaConf.load(path)
        assert "_target_" not in raw.parallel, f"{path.name} repeats the registry's class"
        assert raw.parallel.name == path.stem and path.stem in STRATEGIES
    # and every registered strategy (but the planner's placeholder) has its option
    assert {p.stem for p in (CONF / "parallel").glob("*.yaml")} == set(STRATEGIES)


@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if not s.resolved_before_launch])
def test_default_target_follows_the_name(compose_cfg, name):
    cfg = compose_cfg(f"parallel={name}")
    assert cfg.parallel._target_ == STRATEGIES[name].target
    assert type(instantiate(cfg.parallel)).__name__ == STRATEGIES[name].target.rpartition(".")[2]


def test_own_strategy_class_with_its_own_name(compose_cfg):
    cfg = compose_cfg(f"parallel._target_={OWN}", "parallel.name=mine", "dp.size=1")
    assert cfg.parallel._target_ == OWN
    layout = validate(cfg).layout
    assert layout.strategy == "mine" and layout.schedule is None
    strategy = instantiate(cfg.parallel)
    assert type(strategy).__name__ == "OwnStrategy" and isinstance(strategy, SingleStrategy)
    assert strategy.name == "mine"


def test_unknown_name_without_target_is_refused(compose_cfg):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg("parallel.name=ddpp"))
    msg = str(err.value)
    assert "parallel.name=ddpp: unknown strategy" in msg and "ddp" in msg and "parallel._target_" in msg


def test_strategy_names_of_layouts():
    assert strategy_for(dp=1, tp=1, pp=1) == "single"
    assert strategy_for(dp=4, tp=1, pp=1) == "ddp"  # dp.size alone means ddp
    assert strategy_for(dp=4, tp=1, pp=1, zero_stage=3) == "fsdp"
    assert strategy_for(dp=1, tp=2, pp=1) == "tp"
    assert strategy_for(dp=1, tp=1, pp=2) == "pp"
    assert strategy_for(dp=1, tp=1, pp=2, micro_batches=1, schedule="gpipe") == "mp"
    assert strategy_for(dp=2, tp=1, pp=2) == "hybrid"
    assert describe_factorization(2, 1, 2) == "parallel=hybrid dp.size=2 pp.size=2"
    assert describe_factorization(1, 1, 1) == "parallel=single"
    assert strategy_of(Candidate(pp=4, micro_batches=8, schedule="1f1b")) == "pp"
    assert strategy_of(Candidate(dp=2, tp=2, zero_stage=3)) == "hybrid"
    found = available_strategies(CONF)
    assert "auto" not in found and "dp" not in found  # the planner never picks them
    assert found == {n: s.target for n, s in STRATEGIES.items() if s.picked_for is not None}


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
