"""Property test of the whole config space: every combination of overrides drawn by
``tests/config_space.py`` is either accepted, or refused before any worker starts (exit code 2) with a
message naming a key (300 draws in two seeded halves, in process: Hydra's own override code on cached group
compositions). Two halves, so that ``pytest -n 2`` runs them side by side."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests import config_space
from tests.config_space import outcome, overrides


@pytest.fixture(scope="module")
def composer():
    with config_space.composer() as compose:
        yield compose


#: fixed seeds: the same 2 x 150 draws in every session
HALF = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("half", [0, 1])
def test_every_override_combination_is_accepted_or_refused_naming_a_key(composer, tmp_path, half):
    seen = {"accepted": 0, "refused": 0}

    @seed(half)
    @HALF
    @given(ovs=overrides())
    def draw(ovs):
        verdict, _ = outcome(composer, ovs, tmp_path)
        seen[verdict] += 1

    draw()
    # both outcomes were exercised, not only refusals (or only acceptances)
    assert sum(seen.values()) == 150 and seen["accepted"] >= 10 and seen["refused"] >= 50, seen
