"""benchmarks/vs_torchtitan.py's pure parts: the pairs it accepts, the refusals before anything runs, the numbers it
derives from each rank's step ends (benchmarks/step_clock.py) and the per-pair ratio table. torchtitan itself is never
installed by the tests."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.step_clock import ratio_table, side_numbers
from benchmarks.vs_torchtitan import MODELS, PAIRS, meshtrain_overrides, parse_args, parse_pairs


def test_pairs_parse_in_order_once_and_unknown_ones_are_refused():
    assert parse_pairs("tp, ep,tp") == ["tp", "ep"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown ddp; choose from fsdp,tp,pp,ep"):
        parse_pairs("fsdp,ddp")
    assert parse_args(["--pairs", "fsdp,tp,pp,ep", "--rounds", "5", "--log-every", "10"]).pairs == list(PAIRS)


@pytest.mark.parametrize(
    "argv, says",
    [(["--steps", "3"], "--steps 3: the steady rates need more than 3"), (["--batch", "12"], "--batch 12")],
)
def test_a_run_too_short_or_a_batch_pp_cannot_split_exits_2(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_meshtrain_side_gets_the_registry_shape_as_overrides():
    llama = meshtrain_overrides(MODELS["llama"])
    assert llama[0] == "model=llama_debug" and "model.rope_scaling.factor=8.0" in llama
    assert "model.mlp_only_layers=[]" in meshtrain_overrides(MODELS["qwen3_moe"])


def marks(step_s: float, cpu_s: float, *, loss: float | None, start: float = 100.0) -> list[dict]:
    """Six steps, the first one slow (3 s), then one every ``step_s`` wall seconds and ``cpu_s`` CPU seconds."""
    out, wall, cpu = [], start + 3.0, 10.0
    for step in range(1, 7):
        out.append({"step": step, "wall_s": wall, "cpu_s": cpu, "unix": 1000.0 + wall - start, "loss": loss})
        wall, cpu = wall + step_s, cpu + cpu_s
    return out


def test_side_numbers_take_the_steady_steps_all_ranks_cpu_and_the_rank_that_holds_the_loss():
    ranks = [marks(0.5, 0.4, loss=None), marks(0.5, 0.3, loss=2.0)]  # a pipeline: the last stage logs the loss
    got = side_numbers(ranks, tokens_per_step=1000, launch_unix=1000.0)
    assert got["tokens_per_s"] == pytest.approx(2000.0)  # steps 3..6 after step 2's end: 4 steps in 2 s
    assert got["median_step_tokens_per_s"] == pytest.approx(2000.0)
    assert got["step_cpu_s"] == pytest.approx(0.7)
    assert got["time_to_first_step_s"] == pytest.approx(3.0)
    assert got["losses"][0] == (1, 2.0) and len(got["losses"]) == 6
    sparse = marks(0.5, 0.3, loss=2.0)  # logging every 10 steps: the last step logged nothing
    for m in sparse[1:]:
        m["loss"] = None
    assert side_numbers([sparse], tokens_per_step=1000, launch_unix=1000.0)["losses"] == [(1, 2.0)]


def test_the_ratio_table_is_the_median_of_each_rounds_ratio_with_its_range():
    def side(tps: float, cpu: float) -> dict:
        return {"tokens_per_s": tps, "step_cpu_s": cpu, "time_to_first_step_s": 5.0, "losses": [(1, 3.0), (20, 2.0)]}

    rounds = [
        {"meshtrain": side(110, 1.0), "torchtitan": side(100, 1.0)},
        {"meshtrain": side(90, 0.9), "torchtitan": side(100, 1.0)},
        {"meshtrain": side(100, 1.2), "torchtitan": side(100, 1.0)},
    ]
    got = ratio_table(rounds)
    assert got["tokens_per_s_ratio"] == pytest.approx((1.0, 0.9, 1.1))
    assert got["step_cpu_ratio"] == pytest.approx((1.0, 0.9, 1.2))
    assert got["meshtrain"]["last_loss"] == (20, 2.0) and got["rounds"] == 3
