"""The summary's step medians: the warm-up steps left out, the CPU time per step kept beside the wall time."""

from __future__ import annotations

import math

import pytest

from trainer.observe.metrics import StepStats


def test_medians_skip_the_warm_up_steps_and_keep_cpu_apart_from_wall():
    stats = StepStats(warmup=2)
    for wall, cpu in [(5.0, 4.0), (1.0, 0.9), (0.2, 0.10), (0.3, 0.12), (0.4, 0.11)]:
        stats.add(wall, 1000, cpu_s=cpu)
    assert stats.median_step_time() == pytest.approx(0.3)
    assert stats.median_tokens_per_s() == pytest.approx(1000 / 0.3)
    assert stats.median_step_cpu_s() == pytest.approx(0.11)


def test_a_run_shorter_than_the_warm_up_uses_every_step_and_an_empty_one_has_none():
    stats = StepStats(warmup=2)
    stats.add(2.0, 10, cpu_s=1.5)
    assert stats.median_step_cpu_s() == pytest.approx(1.5)
    assert math.isnan(StepStats().median_step_cpu_s())
