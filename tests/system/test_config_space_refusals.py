"""Property test of the whole config space: every combination of overrides drawn by
``tests/config_space.py`` is either accepted, or refused before any worker starts (exit code 2) with a
message naming a key (300 draws in two seeded halves, in process: Hydra's own override code on cached group
compositions). One test runs both halves, so the group compositions they share are composed once. It starts no
process, but its 300 validations and ~30 Hydra compositions cost ~25 s of CPU: a system test of the whole config
space, kept out of the fast tier (moved from tests/unit, issue 42 item 11)."""

from __future__ import annotations

import pytest

from tests import config_space
from tests.config_space import outcome, overrides


@pytest.fixture(scope="module")
def composer():
    with config_space.composer() as compose:
        yield compose


def test_every_override_combination_is_accepted_or_refused_naming_a_key(composer, tmp_path):
    from hypothesis import HealthCheck, given, seed, settings

    def half(s: int) -> dict[str, int]:
        """The 150 draws of seed ``s`` (fixed: the same draws in every session), counted by verdict."""
        seen = {"accepted": 0, "refused": 0}

        @seed(s)
        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(ovs=overrides())
        def draw(ovs):
            verdict, _ = outcome(composer, ovs, tmp_path)
            seen[verdict] += 1

        draw()
        return seen

    for s in (0, 1):
        seen = half(s)
        # both outcomes were exercised, not only refusals (or only acceptances)
        assert sum(seen.values()) == 150 and seen["accepted"] >= 10 and seen["refused"] >= 50, (s, seen)
