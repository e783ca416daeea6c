"""The strategy registry (every parallel=NAME once, read by config, validation, layout and planner) and the
schedule table (every pp.schedule's rules once, read by validation, the pipeline, the planner and the cost model)."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from parallel.assembly.registry import MODEL_PARALLEL, STRATEGIES, describe_factorization, strategy_for
from parallel.pipeline.schedules import SCHEDULES
from parallel.plan.cost_model import MODELED_SCHEDULES, Candidate, bubble_fraction, last_chunk_rank, rank_layers
from parallel.plan.search import available_strategies, schedules_for, strategy_of
from parallel.strategies.single import SingleStrategy
from tests.helpers import CONF
from trainer.validate import ConfigError, validate

#: the class by a module path hydra can import (pytest may import this file under another name)
OWN = "tests.unit.test_strategy_and_schedule_tables.OwnStrategy"


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
    # and every registered strategy has its option
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
    assert describe_factorization(2, 1, 2, 1, 1) == "parallel=hybrid dp.size=2 pp.size=2"
    assert describe_factorization(1, 1, 1, 1, 1) == "parallel=single"
    assert strategy_for(dp=2, ep=2) == "hybrid"  # expert parallel: hybrid composes it
    assert describe_factorization(1, 1, 1, 2, 1) == "parallel=hybrid cp.size=2"  # cp has no strategy of its own
    assert strategy_of(Candidate(pp=4, micro_batches=8, schedule="1f1b")) == "pp"
    assert strategy_of(Candidate(dp=2, tp=2, zero_stage=3)) == "hybrid"
    found = available_strategies(CONF)
    assert "auto" not in found and "dp" not in found  # the planner never picks them
    assert found == {n: s.target for n, s in STRATEGIES.items() if s.picked_for is not None}


def test_mp_is_the_pipeline_strategy_with_its_pipeline_fixed_once():
    mp, pp = STRATEGIES["mp"], STRATEGIES["pp"]
    assert mp.target == pp.target  # one class; what differs is the registry entry's FixedPipeline
    assert mp.fixed_pipeline is MODEL_PARALLEL and pp.fixed_pipeline is None
    assert (mp.split_points_key, pp.split_points_key) == ("mp.split_points", "pp.split_points")
    preset = OmegaConf.load(CONF / "parallel" / "mp.yaml").pp  # the option's defaults are what it fixes
    fixed = MODEL_PARALLEL
    assert (preset.micro_batches, preset.schedule, preset.stages_per_rank) == (
        fixed.micro_batches,
        fixed.schedule,
        fixed.stages_per_rank,
    )
    assert fixed.problems(name="mp", micro_batches=1, schedule="gpipe", stages_per_rank=1) == []
    msgs = fixed.problems(name="mp", micro_batches=4, schedule="1f1b", stages_per_rank=1)
    assert len(msgs) == 2 and msgs[0].startswith("pp.micro_batches=4 with parallel=mp")
    assert msgs[1].startswith("pp.schedule=1f1b pp.stages_per_rank=1 with parallel=mp") and "parallel=pp" in msgs[1]


# ---- the schedule table: one set of rules for runtime, planner and cost model ---------------------


def test_planner_enumerates_what_the_schedule_rules_allow():
    for n_layers in (4, 8, 16):
        for pp in range(2, 9):
            for m in range(1, 33):
                got = set(schedules_for(pp=pp, m=m, n_layers=n_layers))
                want = {("gpipe", 1)}
                if m >= pp:  # torch's 1F1B family needs at least as many micro-batches as ranks
                    want |= {("1f1b", 1), ("zero_bubble", 1)}
                    want |= {("interleaved_1f1b", v) for v in (2, 4) if pp * v <= n_layers and m % pp == 0}
                if m >= 2 * pp and 2 * pp <= n_layers:  # ZB-V: m >= 2 x ranks
                    want.add(("zbv", 2))
                assert got == want, (pp, m, n_layers)
    assert list(schedules_for(pp=1, m=4, n_layers=4)) == [("none", 1)]


def test_cost_model_reads_placement_and_terms_from_the_schedule_table():
    assert set(MODELED_SCHEDULES) == {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv"}
    assert not SCHEDULES["dualpipev"].modeled
    # a V schedule folds the second half back: rank r holds chunks r and 2p-1-r, the head on rank 0
    assert rank_layers(8, pp=2, stages_per_rank=2, schedule="zbv") == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert last_chunk_rank(pp=2, schedule="zbv", stages_per_rank=2) == 0
    assert rank_layers(8, pp=2, stages_per_rank=2, schedule="interleaved_1f1b") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert last_chunk_rank(pp=4, schedule="1f1b", stages_per_rank=1) == 3
    assert bubble_fraction("looped_bfs", pp=4, m=8, v=2) == pytest.approx(1.5 / 9.5)
    with pytest.raises(KeyError, match="dualpipev"):
        bubble_fraction("dualpipev", pp=2, m=4, v=2)
