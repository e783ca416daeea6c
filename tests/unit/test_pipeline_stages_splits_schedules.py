"""Pipeline pieces without processes: stage building, split policies, schedule replay, validation."""

from __future__ import annotations

import pytest
import torch

from models.gpt.model import GPT
from parallel.pipeline.schedules import SCHEDULES, available_schedules, simulate, single_stage_order, stage_to_rank
from parallel.pipeline.split import BlockCosts, even_split, min_max_partition, uniform_costs
from parallel.pipeline.stages import build_stage_module, stage_specs
from trainer.validate import ConfigError, validate


def _tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, n_layers=4, d_model=32, n_heads=2, max_seq_len=16)


def test_stages_keep_fqns_and_compose_to_the_full_model():
    model = _tiny_gpt()
    specs = stage_specs(n_blocks=4, split_points=(1, 3), stage_ranks=(0, 1, 2))
    stages = [build_stage_module(model, spec=s) for s in specs]
    full = model.state_dict()
    keys = [k for st in stages for k in st.state_dict()]
    assert sorted(keys) == sorted(full) and len(keys) == len(set(keys))
    for st in stages:
        for k, v in st.state_dict().items():
            assert torch.equal(v, full[k]), k
    assert list(stages[1].layers.keys()) == ["1", "2"] and stages[1].tok_embeddings is None
    assert stages[0].output is None and stages[2].output is not None
    x = torch.randint(0, 64, (2, 16))
    h = x
    for st in stages:
        h = st(h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)


def test_cnn_stages_compose_to_the_full_model():
    from models.cnn.model import ConvNet

    torch.manual_seed(0)
    model = ConvNet(channels=[4, 8, 8], num_classes=3, batch_norm=False)
    specs = stage_specs(n_blocks=3, split_points=(2,), stage_ranks=(0, 1))
    first, last = (build_stage_module(model, spec=s) for s in specs)
    assert first.output is None and list(last.layers.keys()) == ["2"]
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(last(first(x)), model(x), rtol=0, atol=0)


def test_uniform_split_weights_embedding_and_head_like_torchtitan():
    # 6 blocks + embedding + head = 8 units over 2 stages: 4 each, so split after block 3
    assert min_max_partition(uniform_costs(6), 2) == (3,)
    # 6 blocks over 4 stages: first and last stage carry embedding / head, so hold one block
    assert min_max_partition(uniform_costs(6), 4) == (1, 3, 5)
    assert even_split(5, 2) == (3,) and even_split(4, 4) == (1, 2, 3)


def test_min_max_partition_isolates_the_expensive_block():
    costs = BlockCosts(blocks=(8.0, 1.0, 1.0, 1.0, 1.0, 1.0), pre=0.1, post=0.3)
    points = min_max_partition(costs, 2)
    assert points == (1,)
    assert costs.stage_costs(points) == pytest.approx([8.1, 5.3])
    with pytest.raises(ValueError, match="non-empty"):
        min_max_partition(costs, 7)


@pytest.mark.parametrize(
    "name,pp,m",
    [(n, p, m) for n in ("gpipe", "1f1b") for p in (2, 4) for m in (1, 2, 4, 8) if n == "gpipe" or m >= p],
)
def test_replayed_bubble_matches_the_textbook_formula(name, pp, m):
    order = single_stage_order(name, pp=pp, micro_batches=m)
    assert simulate(order, num_stages=pp)["bubble_fraction"] == pytest.approx((pp - 1) / (m + pp - 1))


def test_v_placement_puts_first_and_last_stage_on_rank_0():
    assert stage_to_rank(placement="v", pp=2, num_stages=4) == [0, 1, 1, 0]
    assert stage_to_rank(placement="loop", pp=2, num_stages=4) == [0, 1, 0, 1]


def test_schedule_names_map_to_torch_classes():
    import torch.distributed.pipelining.schedules as torch_schedules

    names = available_schedules()
    assert {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble"} <= set(names)
    if hasattr(torch_schedules, "ScheduleDualPipeV"):  # torch >= 2.8: every name this project knows
        assert names == list(SCHEDULES)


# ---- bad input: refused before any worker starts --------------------------------------------------

BAD = {
    "1f1b_too_few_micro_batches": (
        ["parallel=pp", "pp.schedule=1f1b", "pp.micro_batches=1"],
        "pp.micro_batches=1 with pp.schedule=1f1b: 1f1b needs at least as many micro-batches as stages (2); "
        "use pp.micro_batches=2 or 4",
    ),
    "batch_not_divisible": (
        ["parallel=pp", "pp.micro_batches=3"],
        "is not divisible by pp.micro_batches=3",
    ),
    "split_out_of_range": (["parallel=pp", "pp.split_points=[4]"], "pp.split_points=[4]: [4] out of range"),
    "split_not_increasing": (
        ["parallel=pp", "pp.schedule=interleaved_1f1b", "pp.stages_per_rank=2", "pp.split_points=[2,2,3]"],
        "must be strictly increasing (a repeated point leaves an empty stage)",
    ),
    "split_count": (["parallel=mp", "mp.split_points=[1,2]"], "2 split point(s) make 3 stages but the layout has 2"),
    "more_stages_than_layers": (
        ["parallel=pp", "pp.schedule=interleaved_1f1b", "pp.stages_per_rank=3", "pp.micro_batches=4"],
        "= 6 stages but model.n_layers=4: every stage needs at least one block",
    ),
    "stages_per_rank_vs_schedule": (
        ["parallel=pp", "pp.schedule=zbv"],
        "pp.stages_per_rank=1 with pp.schedule=zbv: zbv is a V schedule with exactly two stages per rank",
    ),
    "single_schedule_with_two_stages_per_rank": (
        ["parallel=pp", "pp.schedule=gpipe", "pp.stages_per_rank=2"],
        "gpipe runs one stage per rank",
    ),
    "mp_with_micro_batches": (["parallel=mp", "pp.micro_batches=4"], "model parallel runs one micro-batch"),
}

#: enum-typed keys: refused while Hydra composes the config, with the valid values
BAD_CHOICE = {
    "unknown_schedule": (
        ["parallel=pp", "pp.schedule=pipedream"],
        "Invalid value 'pipedream', expected one of [gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, "
        "dualpipev]",
    ),
    "unknown_split_policy": (["parallel=pp", "pp.split=random"], "Invalid value 'random', expected one of [uniform"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHOICE))
def test_unknown_choice_fails_at_compose_time(case, compose_cfg):
    from hydra.errors import ConfigCompositionException

    overrides, message = BAD_CHOICE[case]
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(*overrides, "logger=none")
    assert message in str(err.value.__cause__) and overrides[-1].split("=")[0] in str(err.value.__cause__)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pipeline_config_is_refused_with_the_fix(case, compose_cfg):
    overrides, message = BAD[case]
    cfg = compose_cfg(*overrides, "logger=none")
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    assert message in str(err.value)


class _FakeStage:
    """The three action methods of a PipelineStage, computing for real on a small module."""

    def __init__(self, module, index):
        self.stage_index, self.submod, self.bwd_cache = index, module, {}
        self.cache = {}

    def forward_one_chunk(self, mb, x):
        out = self.submod(x)
        self.cache[mb] = out
        return out

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        loss.backward()
        self.bwd_cache[mb] = None

    def backward_weight_one_chunk(self, mb, last_backward=False):
        pass


def test_recorder_times_every_action_and_tracks_saved_activation_bytes():
    from parallel.pipeline.timing import StageRecorder, union_busy

    torch.manual_seed(0)
    stage = _FakeStage(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)), 1)
    rec = StageRecorder()
    rec.instrument(stage, sends_forward=False, sends_backward=True)
    loss_fn = rec.wrap_loss(lambda out, y: torch.nn.functional.cross_entropy(out, y))
    rec.begin_step()
    x, y = torch.randn(2, 16, 8), torch.randint(0, 4, (2, 16))
    losses = [loss_fn(stage.forward_one_chunk(i, x[i]), y[i]) for i in range(2)]  # GPipe: F0 F1 B0 B1
    for i in range(2):
        stage.backward_one_chunk(i, loss=losses[i])
    step = rec.end_step()
    assert [a.label for a in step.actions] == ["F0", "F1", "B0", "B1"]
    assert all(a.end >= a.start for a in step.actions)
    assert 0 < union_busy(step.actions, start=step.start, end=step.end) <= step.end - step.start
    # per micro-batch: Linear input (16x8), GELU input (16x64), Linear input (16x64), log-softmax (16x4)
    # are saved (float32); both micro-batches are alive at once before the first backward
    per_mb = 4 * (16 * 8 + 16 * 64 + 16 * 64 + 16 * 4)
    assert step.peak_live_activation_bytes[1] >= 2 * per_mb - 4 * 16 * 64  # GELU may save its output instead
    assert step.peak_live_activation_bytes[1] <= 2 * (per_mb + 4 * 16 * 64)

    # a step the loop does not log: the same actions timed, no saved-tensor hooks, nothing counted
    rec.begin_step(count_saved=False)
    rec._counting_saved = _refuse_hooks  # the hooks' context must not be entered
    losses = [loss_fn(stage.forward_one_chunk(i, x[i]), y[i]) for i in range(2)]
    for i in range(2):
        stage.backward_one_chunk(i, loss=losses[i])
    quiet = rec.end_step()
    assert [a.label for a in quiet.actions] == ["F0", "F1", "B0", "B1"]
    assert quiet.peak_live_activation_bytes == {}


def _refuse_hooks(params):
    raise AssertionError("saved-tensor hooks entered on a step that counts nothing")


def test_bubble_parts_charge_a_slow_stage_to_imbalance():
    """GPipe, 2 stages, m=4, stage 1 twice as slow as stage 0: the replay, worked by hand below."""
    from parallel.pipeline.schedules import bubble_parts

    order = single_stage_order("gpipe", pp=2, micro_batches=4)
    equal = {0: {"F": 1.0, "B": 2.0}, 1: {"F": 1.0, "B": 2.0}}
    slow = {0: {"F": 1.0, "B": 2.0}, 1: {"F": 2.0, "B": 4.0}}
    even = bubble_parts(order, num_stages=2, measured=0.3, stage_costs=equal)
    assert even["schedule"] == pytest.approx(1 / 5) and even["imbalance"] == pytest.approx(0.0, abs=1e-12)
    assert even["overhead"] == pytest.approx(0.3 - 1 / 5)
    uneven = bubble_parts(order, num_stages=2, measured=0.5, stage_costs=slow)
    # stage 0: F 0..4; stage 1: F 1..9 (2 each), B 9..25 (4 each, ending 13, 17, 21, 25); stage 0's B(i)
    # follows stage 1's B(i): 13..15, 17..19, 21..23, 25..27. Makespan 27; busy 12 + 24 = 36 of 2 x 27.
    assert uneven["schedule"] + uneven["imbalance"] == pytest.approx(1 - 36 / (2 * 27))
    assert sum(uneven.values()) == pytest.approx(0.5)
